"""A small model whose faults are switched on by hparams, for the guard-rail tests.

Importable on its own (`--import guard_models` with tests/ on PYTHONPATH), so
subprocess runs of the real CLI can use it.

hparams:
  poison: none | loss_nan | loss_inf | grad_nan: from global step `poison_step`
    on, the loss becomes NaN / Inf, or (grad_nan) the loss stays finite while
    the gradient of the hidden kernel becomes NaN.
  units: hidden width (change it to change a variable's shape).
  extra_layer: add a variable `extra/kernel`.
  big: size of an extra untrained variable `big` (makes checkpoints and exports large).
  fsize_limit_step, fsize_limit: from that global step on, the process may not
    write files larger than fsize_limit bytes (RLIMIT_FSIZE): the disk "fills up"
    mid-run. Only for subprocess runs: it limits the whole process.
  eval_sleep, eval_marker: each eval batch first adds a line to the file eval_marker (if
    given), then sleeps eval_sleep seconds (a slow evaluation to interrupt).
"""
import resource
import time

import numpy as np
import tensorflow as tf

import estimator_dist
from estimator_dist.training.registry import register_input, register_model

TRAIN, EVAL, PREDICT = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL, tf.estimator.ModeKeys.PREDICT
FEATURES, CLASSES = 6, 3
HPARAMS = {"learning_rate": 0.1, "optimizer": "sgd", "poison": "none", "poison_step": 7,
           "units": 8, "extra_layer": False, "big": 0,
           "fsize_limit_step": 0, "fsize_limit": 600000, "eval_sleep": 0.0, "eval_marker": ""}
_rng = np.random.RandomState(0)
X = _rng.randn(64, FEATURES).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int32) + (X[:, 1] > 1).astype(np.int32)


def prepare(params):
    return {"serving_features": {"x": [[FEATURES], "float32"]}}


@register_input("guard_xy", prepare=prepare)
def guard_input(mode, params, input_context=None):
    ds = tf.data.Dataset.from_tensor_slices(({"x": X}, Y))
    if mode == TRAIN:
        ds = ds.repeat()
    return ds.batch(params["batch_size"])


def _nan_gradient(x, poison):
    """Identity forward; the gradient is NaN where `poison` is true."""

    @tf.custom_gradient
    def identity(value):
        def grad(dy):
            return tf.where(poison, tf.fill(tf.shape(dy), np.float32("nan")), dy)

        return tf.identity(value), grad

    return identity(x)


class FileSizeLimitHook(tf.compat.v1.train.SessionRunHook):
    """Lowers RLIMIT_FSIZE once the global step reaches `step` (Python ignores SIGXFSZ: writes fail with EFBIG)."""

    def __init__(self, step, limit):
        self._step, self._limit = step, limit

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_run(self, run_context, run_values):
        if run_context.session.run(self._global_step) >= self._step:
            _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (self._limit, hard))


def _slow_batch(seconds, marker):
    """0.0, after adding a line to `marker` and sleeping `seconds`, once per session run."""
    def slow():
        if marker:
            with open(marker, "a") as f:
                f.write("batch\n")
        time.sleep(seconds)
        return np.float32(0.0)

    return tf.numpy_function(slow, [], tf.float32, stateful=True)


@register_model("guard_mlp", hparams=HPARAMS, default_input="guard_xy",
                run_defaults={"batch_size": 16, "eval_steps": 1, "export": "none"})
def guard_mlp(features, labels, mode, params):
    """dense(units, tanh) [-> extra dense] -> logits, with optional faults."""
    step = tf.compat.v1.train.get_or_create_global_step()
    poisoned = step >= params["poison_step"]
    x = features["x"]
    h = tf.compat.v1.layers.dense(x, params["units"], tf.nn.tanh, name="hidden")
    if params["poison"] == "grad_nan" and mode == TRAIN:
        h = _nan_gradient(h, poisoned)
    if params["extra_layer"]:
        h = tf.compat.v1.layers.dense(h, params["units"], tf.nn.tanh, name="extra")
    logits = tf.compat.v1.layers.dense(h, CLASSES, name="logits")
    if params["big"]:
        big = tf.compat.v1.get_variable("big", [params["big"]], initializer=tf.zeros_initializer(),
                                        trainable=False)
        logits += 0.0 * tf.reduce_sum(big)
    predictions = {"class_ids": tf.argmax(logits, axis=-1), "logits": logits}
    if mode == PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions=predictions, export_outputs={
            "serving_default": tf.estimator.export.PredictOutput(predictions)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if params["poison"] in ("loss_nan", "loss_inf") and mode == TRAIN:
        bad = np.float32("nan") if params["poison"] == "loss_nan" else np.float32("inf")
        loss = tf.where(poisoned, bad, loss)
    if mode == EVAL:
        if params["eval_sleep"]:
            loss += _slow_batch(params["eval_sleep"], params["eval_marker"])
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": tf.compat.v1.metrics.accuracy(labels, predictions["class_ids"])})
    hooks = [FileSizeLimitHook(params["fsize_limit_step"], params["fsize_limit"])] \
        if params["fsize_limit_step"] else []
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=estimator_dist.minimize(loss, params),
                                      training_hooks=hooks)
