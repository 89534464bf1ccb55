"""EstimatorSpecs for the common heads, shared by the built-in model_fns."""
import tensorflow as tf

from estimator_dist.train_op import minimize


def weight_decay_loss(params):
    """L2 penalty over trainable kernels when params["weight_decay"] > 0."""
    decay = float(params.get("weight_decay", 0.0))
    if decay <= 0:
        return None
    kernels = [v for v in tf.compat.v1.trainable_variables() if "kernel" in v.name]
    return decay * tf.add_n([tf.nn.l2_loss(v) for v in kernels]) if kernels else None


def class_ids(labels):
    """Labels as int64 class ids [batch]. Float labels must be whole numbers: the cast made
    0.7 class 0 without a word; now the step fails naming them (one line, exit 1)."""
    labels = tf.reshape(labels, [-1])
    if labels.dtype.is_floating:
        whole = tf.debugging.assert_equal(
            labels, tf.round(labels), summarize=3,
            message="classification labels must be whole class ids, but some have a fraction")
        with tf.control_dependencies([whole]):
            labels = tf.identity(labels)
    return tf.cast(labels, tf.int64)


def classification_spec(logits, labels, mode, params, update_ops=None):
    """Softmax classification: predictions, export outputs, accuracy, train op."""
    # bfloat16 logits (--mixed_precision): softmax, loss, metrics and exports in float32.
    logits = tf.cast(logits, tf.float32)
    probabilities = tf.nn.softmax(logits)
    predictions = {
        "class_ids": tf.argmax(logits, axis=-1, output_type=tf.int64),
        "probabilities": probabilities,
    }
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode, predictions=predictions,
            export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)})
    labels = class_ids(labels)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    decay = weight_decay_loss(params)
    total = loss + decay if decay is not None else loss
    if mode == tf.estimator.ModeKeys.EVAL:
        metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, predictions["class_ids"])}
        return tf.estimator.EstimatorSpec(mode, loss=total, eval_metric_ops=metrics)
    return tf.estimator.EstimatorSpec(mode, loss=total, train_op=minimize(total, params, update_ops))


def regression_spec(outputs, labels, mode, params, update_ops=None):
    """Mean-squared-error regression with a single output."""
    outputs = tf.cast(tf.reshape(outputs, [-1]), tf.float32)  # bfloat16 with --mixed_precision
    predictions = {"predictions": outputs}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode, predictions=predictions,
            export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)})
    labels = tf.cast(tf.reshape(labels, [-1]), tf.float32)
    loss = tf.compat.v1.losses.mean_squared_error(labels, outputs)
    if mode == tf.estimator.ModeKeys.EVAL:
        metrics = {"rmse": tf.compat.v1.metrics.root_mean_squared_error(labels, outputs),
                   "mae": tf.compat.v1.metrics.mean_absolute_error(labels, outputs)}
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=minimize(loss, params, update_ops))
