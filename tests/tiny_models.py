"""Tiny deterministic models and data for the tower and accumulation tests.

Two 2-layer MLPs, one from tf.compat.v1.layers and one from tf.keras layers, with
fixed initial weights, plain SGD, and an in-memory input in a fixed order.
"""
import numpy as np
import tensorflow as tf

import estimator_dist
from conftest import make_config
from estimator_dist.training import run as runner
from estimator_dist.training.registry import register_input, register_model

TRAIN, EVAL, PREDICT = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL, tf.estimator.ModeKeys.PREDICT
FEATURES, HIDDEN, CLASSES = 6, 8, 3
# 23 = 3 x 7 + 2: with batch 7 the one epoch ends in a batch of 2, fewer examples
# than 3 towers, so one tower is empty.
EXAMPLES, BATCH = 23, 7
HPARAMS = {"optimizer": "sgd", "learning_rate": 0.5, "batch_norm": False, "epochs": 0, "scope": ""}
_rng = np.random.RandomState(0)
W_HIDDEN = (_rng.randn(FEATURES, HIDDEN) * 0.5).astype(np.float32)
W_LOGITS = (_rng.randn(HIDDEN, CLASSES) * 0.5).astype(np.float32)
X = (_rng.randn(EXAMPLES, FEATURES) * 2.0 + 1.0).astype(np.float32)
Y = _rng.randint(0, CLASSES, EXAMPLES).astype(np.int32)


def prepare_tiny(params):
    return {"serving_features": {"x": [[FEATURES], "float32"]}}


@register_input("tiny", prepare=prepare_tiny)
def tiny_input(mode, params, input_context=None):
    """X, Y in order; params['epochs'] passes over them when training (0 = forever)."""
    ds = tf.data.Dataset.from_tensor_slices(({"x": X}, Y))
    if input_context is not None and input_context.num_input_pipelines > 1:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if mode == TRAIN:
        ds = ds.repeat(params["epochs"] or None)
    return ds.batch(params["batch_size"])


def tiny_spec(logits, labels, mode, params, update_ops=None):
    """A softmax head whose loss is a plain reduce_mean: NaN for an empty batch, on purpose."""
    predictions = {"logits": logits, "class_ids": tf.argmax(logits, axis=-1)}
    if mode == PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions=predictions)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == EVAL:
        metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, predictions["class_ids"])}
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=estimator_dist.minimize(loss, params, update_ops))


@register_model("tiny_v1", hparams=HPARAMS, default_input="tiny")
def v1_model(features, labels, mode, params):
    """[batch norm] -> tanh dense -> logits, from tf.compat.v1.layers (unnamed hidden layer)."""
    if params["scope"]:
        with tf.compat.v1.variable_scope(params["scope"]):
            return v1_model(features, labels, mode, {**params, "scope": ""})
    x = features["x"]
    if params["batch_norm"]:
        x = tf.compat.v1.layers.batch_normalization(x, training=mode == TRAIN, name="bn")
    h = tf.compat.v1.layers.dense(x, HIDDEN, activation=tf.nn.tanh,
                                  kernel_initializer=tf.constant_initializer(W_HIDDEN))
    logits = tf.compat.v1.layers.dense(h, CLASSES, kernel_initializer=tf.constant_initializer(W_LOGITS),
                                       name="logits")
    return tiny_spec(logits, labels, mode, params)


@register_model("tiny_keras", hparams=HPARAMS, default_input="tiny")
def keras_model(features, labels, mode, params):
    """The same network from tf.keras layers (new variables on every call)."""
    layers = [tf.keras.layers.BatchNormalization(name="bn")] if params["batch_norm"] else []
    layers += [tf.keras.layers.Dense(HIDDEN, activation="tanh", name="hidden",
                                     kernel_initializer=tf.constant_initializer(W_HIDDEN)),
               tf.keras.layers.Dense(CLASSES, name="logits",
                                     kernel_initializer=tf.constant_initializer(W_LOGITS))]
    net = tf.keras.Sequential(layers, name="mlp")
    training = mode == TRAIN
    logits = net(features["x"], training=training)
    return tiny_spec(logits, labels, mode, params, update_ops=net.updates if training else None)


@register_model("tiny_own_train_op", hparams=HPARAMS, default_input="tiny")
def own_train_op_model(features, labels, mode, params):
    """Builds its train op itself instead of with estimator_dist.minimize."""
    logits = tf.compat.v1.layers.dense(features["x"], CLASSES, name="logits")
    if mode == PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def train(model_dir, model, strategy="none", n=1, steps=3, overrides=(), **flags):
    flags = {"batch_size": BATCH, "export": "none", "seed": 1, "eval_steps": 1,
             "save_checkpoints_steps": steps, **flags}
    config = make_config(model, overrides, train_steps=steps, strategy=strategy, num_devices=n,
                         model_dir=str(model_dir), **flags)
    return runner.train(config, out=lambda *_: None)


def weights(model_dir):
    """Every variable in the latest checkpoint but the global step."""
    reader = tf.train.load_checkpoint(str(model_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name != "global_step"}


def assert_same_weights(got, expected, atol=1e-5):
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=atol, rtol=0, err_msg=name)


def max_difference(a, b):
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


INITIAL = [W_HIDDEN, np.zeros(HIDDEN, np.float32), W_LOGITS, np.zeros(CLASSES, np.float32)]
V1_NAMES = ["dense/kernel", "dense/bias", "logits/kernel", "logits/bias"]


def numpy_gradients(params, x, y):
    """Gradients of the mean softmax cross-entropy of the tiny MLP, in float64."""
    w1, b1, w2, b2 = [np.asarray(p, np.float64) for p in params]
    h = np.tanh(x @ w1 + b1)
    z = h @ w2 + b2
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dz = p
    dz[np.arange(len(y)), y] -= 1.0
    dz /= len(y)
    dh = dz @ w2.T * (1.0 - h ** 2)
    return [x.T @ dh, dh.sum(axis=0), h.T @ dz, dz.sum(axis=0)]


def sgd_step(params, grads, lr=HPARAMS["learning_rate"]):
    return [p - lr * g for p, g in zip(params, grads)]
