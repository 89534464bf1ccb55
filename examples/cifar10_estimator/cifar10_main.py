"""TensorFlow's cifar10_estimator tutorial (cifar10_main.py there) brought to estimator-dist.

The tutorial's model_fn builds one tower per GPU, averages their gradients and applies
them itself; here the model_fn is its one-tower body (`_tower_fn`) and the strategy
(`--strategy tower`, `mirrored`, a cluster) makes the towers. What changed, and why:
docs/tf1-towers.md. Run it from this folder:

    python cifar10.py cifar10_data        # synthetic records in the tutorial's format
    estimator-dist train --import cifar10_main --model cifar10_resnet \
        --data_dir cifar10_data --strategy tower --num_devices 2
"""
import numpy as np
import tensorflow as tf

import estimator_dist as ed

import cifar10
import cifar10_model

HPARAMS = {
    "num_layers": 8, "width": 4, "weight_decay": 2e-4, "momentum": 0.9, "learning_rate": 0.1,
    "batch_norm_decay": 0.997, "batch_norm_epsilon": 1e-5, "batch_norm_training": True,
    "use_distortion": True, "examples_per_epoch": 64, "boundary_epochs": "82,123,300",
    "log_every": 100,
}
RUN_DEFAULTS = {"batch_size": 16, "train_steps": 20, "eval_steps": 2}


def _tower_fn(is_training, weight_decay, feature, label, params):
    """The tutorial's _tower_fn without its tf.gradients: the logits, the loss with weight
    decay, the predictions of one tower."""
    model = cifar10_model.ResNetCifar10(
        params["num_layers"], is_training=is_training and params["batch_norm_training"],
        batch_norm_decay=params["batch_norm_decay"],
        batch_norm_epsilon=params["batch_norm_epsilon"], width=params["width"])
    logits = model.forward_pass(feature, input_data_format="channels_last")
    tower_pred = {"classes": tf.argmax(input=logits, axis=1),
                  "probabilities": tf.nn.softmax(logits)}
    if label is None:
        return None, tower_pred
    tower_loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(logits=logits, labels=label)
    tower_loss = tf.reduce_mean(input_tensor=tower_loss)
    model_params = tf.compat.v1.trainable_variables()
    tower_loss += weight_decay * tf.add_n([tf.nn.l2_loss(v) for v in model_params])
    return tower_loss, tower_pred


def _learning_rate(params):
    """The tutorial's piecewise schedule: boundaries in epochs of the global batch."""
    # The tutorial divided by train_batch_size * num_workers: the examples of one update.
    num_batches_per_epoch = params["examples_per_epoch"] // (
        params["global_batch_size"] * params["batches_per_step"])
    epochs = [int(e) for e in params["boundary_epochs"].split(",")]
    boundaries = [num_batches_per_epoch * x for x in np.array(epochs, dtype=np.int64)]
    staged_lr = [params["learning_rate"] * x for x in [1, 0.1, 0.01, 0.002][:len(epochs) + 1]]
    learning_rate = tf.compat.v1.train.piecewise_constant(
        tf.compat.v1.train.get_global_step(), boundaries, staged_lr)
    return tf.identity(learning_rate, name="learning_rate")


def _spec(features, labels, mode, params, make_train_op):
    """The one-tower body of the tutorial's _resnet_model_fn; `make_train_op(loss, optimizer)`."""
    is_training = mode == tf.estimator.ModeKeys.TRAIN
    with tf.compat.v1.variable_scope("resnet"):
        tower_loss, preds = _tower_fn(is_training, params["weight_decay"], features, labels,
                                      params)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions=preds, export_outputs={
            "serving_default": tf.estimator.export.PredictOutput(preds)})
    loss = tf.reduce_mean([tower_loss], name="loss")
    learning_rate = _learning_rate(params)
    optimizer = tf.compat.v1.train.MomentumOptimizer(
        learning_rate=learning_rate, momentum=params["momentum"])
    logging_hook = tf.compat.v1.train.LoggingTensorHook(
        tensors={"learning_rate": learning_rate, "loss": loss},
        every_n_iter=params["log_every"])
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, preds["classes"])}
    return tf.estimator.EstimatorSpec(
        mode, predictions=preds, loss=loss,
        train_op=make_train_op(loss, optimizer) if is_training else None,
        training_hooks=[logging_hook], eval_metric_ops=metrics)


@ed.register_model("cifar10_resnet", hparams=HPARAMS, default_input="cifar10_tfrecords",
                   run_defaults=RUN_DEFAULTS)
def resnet_model_fn(features, labels, mode, params):
    """The tutorial's model with estimator_dist.minimize: every strategy, towers included."""
    return _spec(features, labels, mode, params,
                 lambda loss, optimizer: ed.minimize(loss, params, optimizer=optimizer))


@ed.register_model("cifar10_resnet_own_train_op", hparams=HPARAMS,
                   default_input="cifar10_tfrecords", run_defaults=RUN_DEFAULTS)
def resnet_own_train_op_model_fn(features, labels, mode, params):
    """The tutorial's own train_op: apply_gradients grouped with the UPDATE_OPS (not
    --strategy tower nor --accumulate_steps, which need minimize)."""
    def train_op(loss, optimizer):
        update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        gradvars = optimizer.compute_gradients(loss)
        apply = optimizer.apply_gradients(
            gradvars, global_step=tf.compat.v1.train.get_global_step())
        return tf.group(apply, *update_ops)

    return _spec(features, labels, mode, params, train_op)


def _dataset(mode, params):
    subset = "train" if mode == tf.estimator.ModeKeys.TRAIN else "eval"
    return cifar10.Cifar10DataSet(params["data_dir"], subset,
                                  params.get("use_distortion", True))


@ed.register_input("cifar10_tfrecords", data_flags=("data_dir",))
def input_fn(mode, params):
    """The tutorial's input as a tf.data.Dataset (TFRecordDataset + map), no prepare()."""
    return _dataset(mode, params).make_dataset(params["batch_size"], params["seed"])


@ed.register_input("cifar10_batch_tensors", data_flags=("data_dir",))
def tensors_input_fn(mode, params):
    """The tutorial's input as it was: (images, labels) tensors from a one-shot iterator."""
    return _dataset(mode, params).make_batch(params["batch_size"], params["seed"])
