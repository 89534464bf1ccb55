"""EstimatorSpecs for the common heads, shared by the built-in model_fns.

Exports carry, as canned Estimator heads do: `serving_default` (predict, raw feature
tensors), and `classification` or `regression` over serialized tf.Examples, the
signatures TF Serving's :classify and :regress endpoints need. A classifier whose
params hold `label_vocabulary` (the input's prepare() returns it: tabular does) also
predicts `classes`, the label strings.
"""
import tensorflow as tf

from estimator_dist.serving import export
from estimator_dist.graph.train_op import minimize
from estimator_dist.errors import UserError


class ExamplesInput:
    """An export output whose signature takes the receiver's serialized tf.Examples, not the
    raw feature tensors the export's other signatures take."""

    INPUT_KEY = "inputs"  # the name TF Serving's :classify and :regress feed

    def as_signature_def(self, receiver_tensors):
        graph = tf.nest.flatten(self.outputs)[0].graph
        examples = export.serialized_examples(graph)
        if examples is None:  # a feature no fixed-length tf.Example feature can hold
            raise ValueError("this export has no tf.Example input")
        return super().as_signature_def({self.INPUT_KEY: examples})


class ExampleClassificationOutput(ExamplesInput, tf.estimator.export.ClassificationOutput):
    """ClassificationOutput over serialized tf.Examples."""

    @property
    def outputs(self):
        return [self.scores, self.classes]


class ExampleRegressionOutput(ExamplesInput, tf.estimator.export.RegressionOutput):
    """RegressionOutput over serialized tf.Examples."""

    @property
    def outputs(self):
        return [self.value]


def label_vocabulary(params, num_classes: int):
    """params["label_vocabulary"] when it names every class (a list of strings), else None."""
    vocabulary = params.get("label_vocabulary") if hasattr(params, "get") else None
    if isinstance(vocabulary, (list, tuple)) and len(vocabulary) == num_classes and \
            all(isinstance(v, str) for v in vocabulary):
        return list(vocabulary)
    return None


def _class_names(logits, params):
    """[batch, classes] strings: each score column's class (its label, else its index)."""
    num_classes = logits.shape[-1]
    vocabulary = label_vocabulary(params, num_classes) if num_classes is not None else None
    names = (tf.constant(vocabulary) if vocabulary else
             tf.strings.as_string(tf.range(tf.shape(logits)[-1])))
    return tf.tile(tf.expand_dims(names, 0), [tf.shape(logits)[0], 1]), vocabulary


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


def classification_loss(labels, logits, params):
    """Softmax cross-entropy; with params["label_smoothing"] = e > 0 against targets of
    1 - e + e/K for the label and e/K elsewhere (Szegedy et al. 2016)."""
    smoothing = float(params.get("label_smoothing", 0.0) or 0.0) if hasattr(params, "get") else 0.0
    if not 0.0 <= smoothing < 1.0:
        raise UserError(f"label_smoothing {smoothing!r}: must be in [0, 1); fix it with "
                        f"--set label_smoothing=0.1")
    if not smoothing:
        return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    onehot = tf.one_hot(labels, tf.shape(logits)[-1], dtype=logits.dtype)
    return tf.compat.v1.losses.softmax_cross_entropy(onehot, logits, label_smoothing=smoothing)


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
        names, vocabulary = _class_names(logits, params)
        if vocabulary:
            predictions["classes"] = tf.gather(tf.constant(vocabulary), predictions["class_ids"])
        return tf.estimator.EstimatorSpec(mode, predictions=predictions, export_outputs={
            "serving_default": tf.estimator.export.PredictOutput(predictions),
            "classification": ExampleClassificationOutput(scores=probabilities, classes=names)})
    labels = class_ids(labels)
    loss = classification_loss(labels, logits, params)
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
        return tf.estimator.EstimatorSpec(mode, predictions=predictions, export_outputs={
            "serving_default": tf.estimator.export.PredictOutput(predictions),
            "regression": ExampleRegressionOutput(value=outputs)})
    labels = tf.cast(tf.reshape(labels, [-1]), tf.float32)
    loss = tf.compat.v1.losses.mean_squared_error(labels, outputs)
    if mode == tf.estimator.ModeKeys.EVAL:
        metrics = {"rmse": tf.compat.v1.metrics.root_mean_squared_error(labels, outputs),
                   "mae": tf.compat.v1.metrics.mean_absolute_error(labels, outputs)}
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=minimize(loss, params, update_ops))
