"""Model_fns written for ONE device, each collecting its loss the way TF1 code did.

Each is the tiny MLP of tiny_models (fixed initial weights, the tiny input) with a
different TF1 loss idiom; none passes a tower or replica scope to get_collection.
Every call records what the graph's collections held when it finished (PROBES), so
tests can see what each replica's / tower's call saw.
"""
import numpy as np
import tensorflow as tf

import estimator_dist
from estimator_dist.training.registry import register_model
from tiny_models import CLASSES, HIDDEN, PREDICT, TRAIN, W_HIDDEN, W_LOGITS

KEYS = tf.compat.v1.GraphKeys
HPARAMS = {"optimizer": "sgd", "learning_rate": 0.5, "batch_norm": False, "epochs": 0,
           "scope": "", "weight_decay": 0.05}
# cifar10.py's 'losses' collection is GraphKeys.LOSSES, the one tf.compat.v1.losses fill.
PROBED = (KEYS.LOSSES, KEYS.REGULARIZATION_LOSSES, KEYS.UPDATE_OPS, KEYS.SUMMARIES)
PROBES = []  # one {collection: length} per TRAIN call, in call order


def _probe():
    PROBES.append({name: len(tf.compat.v1.get_collection(name)) for name in PROBED})


def _logits(x, params, regularizer=None):
    h = tf.compat.v1.layers.dense(x, HIDDEN, activation=tf.nn.tanh, kernel_regularizer=regularizer,
                                  kernel_initializer=tf.constant_initializer(W_HIDDEN))
    return tf.compat.v1.layers.dense(h, CLASSES, kernel_regularizer=regularizer, name="logits",
                                     kernel_initializer=tf.constant_initializer(W_LOGITS))


def _spec(mode, logits, labels, loss_fn, params, update_ops=None):
    if mode == PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = loss_fn()
    if mode != TRAIN:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    train_op = estimator_dist.minimize(loss, params, update_ops)
    _probe()
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


@register_model("coll_cifar10", hparams=HPARAMS, default_input="tiny")
def cifar10_style(features, labels, mode, params):
    """cifar10.py: weight decay and the data loss into a 'losses' collection, summed with add_n."""
    logits = _logits(features["x"], params)

    def loss():
        for var in tf.compat.v1.trainable_variables():
            if "kernel" in var.op.name:
                decay = tf.multiply(tf.nn.l2_loss(var), params["weight_decay"], name="weight_loss")
                tf.compat.v1.add_to_collection("losses", decay)
        cross_entropy = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits), name="cross_entropy")
        tf.compat.v1.add_to_collection("losses", cross_entropy)
        return tf.add_n(tf.compat.v1.get_collection("losses"), name="total_loss")

    return _spec(mode, logits, labels, loss, params)


@register_model("coll_total_loss", hparams=HPARAMS, default_input="tiny")
def total_loss_style(features, labels, mode, params):
    """slim era: tf.compat.v1.losses (into LOSSES), kernel_regularizer, get_total_loss()."""
    logits = _logits(features["x"], params,
                     tf.keras.regularizers.l2(params["weight_decay"]))

    def loss():
        tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        return tf.compat.v1.losses.get_total_loss()

    return _spec(mode, logits, labels, loss, params)


@register_model("coll_get_variable", hparams=HPARAMS, default_input="tiny")
def get_variable_style(features, labels, mode, params):
    """get_variable(regularizer=), a mean loss, + get_regularization_loss()."""
    decay = params["weight_decay"]
    l2 = lambda w: decay * tf.nn.l2_loss(w)  # noqa: E731 - TF1 code wrote it so
    w1 = tf.compat.v1.get_variable("w1", initializer=W_HIDDEN, regularizer=l2)
    b1 = tf.compat.v1.get_variable("b1", initializer=np.zeros(HIDDEN, np.float32))
    w2 = tf.compat.v1.get_variable("w2", initializer=W_LOGITS, regularizer=l2)
    logits = tf.matmul(tf.tanh(tf.matmul(features["x"], w1) + b1), w2)

    def loss():
        data = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
        return data + tf.compat.v1.losses.get_regularization_loss()

    return _spec(mode, logits, labels, loss, params)


@register_model("coll_summaries", hparams=HPARAMS, default_input="tiny")
def summaries_style(features, labels, mode, params):
    """A summary per loss term, and the 'losses' collection."""
    logits = _logits(features["x"], params)

    def loss():
        data = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
        decay = params["weight_decay"] * tf.add_n(
            [tf.nn.l2_loss(v) for v in tf.compat.v1.trainable_variables() if "kernel" in v.op.name])
        for name, term in (("data_loss", data), ("weight_decay", decay)):
            tf.compat.v1.add_to_collection("losses", term)
            tf.compat.v1.summary.scalar(name, term)
        return tf.add_n(tf.compat.v1.get_collection("losses"))

    return _spec(mode, logits, labels, loss, params)


@register_model("coll_batch_norm", hparams=HPARAMS, default_input="tiny")
def batch_norm_style(features, labels, mode, params):
    """v1 batch norm; the train op waits on get_collection(UPDATE_OPS), as TF1 code did."""
    x = tf.compat.v1.layers.batch_normalization(features["x"], training=mode == TRAIN, name="bn")
    logits = _logits(x, params)

    def loss():
        return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)

    update_ops = tf.compat.v1.get_collection(KEYS.UPDATE_OPS) if mode == TRAIN else None
    return _spec(mode, logits, labels, loss, params, update_ops)
