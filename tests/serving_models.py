"""An input whose serving_features can be made to disagree with what it yields, for the
serving-features check (`--import serving_models` with tests/ on PYTHONPATH).

The input yields {"x": float32 [6], "weight": float32 []} and int32 labels; hparam
`serving` picks the serving_features its prepare() returns:
  ok: {"x": [[6], "float32"]} ("weight" is a training-only feature)
  shape: x as [5]; dtype: x as int32; rank: x as [6, 1]; name: "z" instead of "x";
  unknown: {"x": [[None], "float32"]} (an unknown dim matches any).
"""
import numpy as np
import tensorflow as tf

import estimator_dist
from estimator_dist.training.registry import register_input, register_model

TRAIN, PREDICT = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.PREDICT
FEATURES, CLASSES = 6, 3
SERVING = {
    "ok": {"x": [[FEATURES], "float32"]},
    "unknown": {"x": [[None], "float32"]},
    "shape": {"x": [[FEATURES - 1], "float32"]},
    "dtype": {"x": [[FEATURES], "int32"]},
    "rank": {"x": [[FEATURES, 1], "float32"]},
    "name": {"z": [[FEATURES], "float32"]},
}
_rng = np.random.RandomState(0)
X = _rng.randn(64, FEATURES).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int32)


def prepare(params):
    return {"serving_features": SERVING[params["serving"]]}


@register_input("serving_xy", prepare=prepare)
def serving_input(mode, params, input_context=None):
    ds = tf.data.Dataset.from_tensor_slices(({"x": X, "weight": np.ones(len(X), np.float32)}, Y))
    if mode == TRAIN:
        ds = ds.repeat()
    return ds.batch(params["batch_size"])


@register_model("serving_mlp", hparams={"serving": "ok", "learning_rate": 0.1, "optimizer": "sgd"},
                default_input="serving_xy",
                run_defaults={"batch_size": 16, "eval_steps": 1, "train_steps": 2,
                              "export": "none"})
def serving_mlp(features, labels, mode, params):
    """One dense layer on features["x"] (a KeyError for serving 'name', as a real model)."""
    logits = tf.compat.v1.layers.dense(features["x"], CLASSES, name="logits")
    if mode == PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = estimator_dist.minimize(loss, params) if mode == TRAIN else None
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
