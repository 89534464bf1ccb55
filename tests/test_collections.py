"""Replicas and towers see the graph's collections as one device would (replica_collections.py).

The model_fns (collection_models.py) are written for one device, in the TF1 idioms that
collect losses in graph collections; each must train under tower, mirrored and
central_storage exactly as on one device.
"""
import contextlib
import os
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import collection_models
from collection_models import KEYS, PROBES
from conftest import run_cli
from estimator_dist.graph import replica_collections
from tiny_models import max_difference, train, weights

# (model, strategy, devices, global batch, extra flags, overrides). Batch 7 over 2 or 3
# towers is uneven; with epochs=1 the 23 examples end in a batch of 2, leaving tower 3 empty.
# Mirrored needs a batch its replicas divide.
CASES = [
    ("coll_cifar10", "tower", 2, 7, {}, ()),
    ("coll_cifar10", "tower", 3, 7, {}, ("epochs=1",)),
    ("coll_cifar10", "mirrored", 2, 6, {}, ()),
    ("coll_cifar10", "mirrored", 3, 9, {}, ()),
    ("coll_total_loss", "tower", 2, 7, {}, ()),
    ("coll_total_loss", "tower", 3, 7, {}, ("epochs=1",)),
    ("coll_total_loss", "mirrored", 2, 6, {}, ()),
    ("coll_total_loss", "mirrored", 3, 9, {}, ()),
    ("coll_total_loss", "central_storage", 2, 6, {}, ()),
    ("coll_total_loss", "mirrored", 2, 6, {"accumulate_steps": 2}, ()),
    ("coll_get_variable", "tower", 3, 7, {}, ("epochs=1",)),
    ("coll_get_variable", "mirrored", 2, 6, {}, ()),
    ("coll_summaries", "tower", 2, 7, {}, ()),
]
STEPS = 5
_single = {}


def single_device(tmp_path_factory, model, batch, flags, overrides):
    """The one-device run's weights and per-call probe (cached: several cases share it)."""
    key = (model, batch, tuple(sorted(flags.items())), overrides)
    if key not in _single:
        PROBES.clear()
        model_dir = tmp_path_factory.mktemp("single")
        train(model_dir, model, steps=STEPS, batch_size=batch, overrides=overrides, **flags)
        _single[key] = (weights(model_dir), PROBES[0])
    return _single[key]


@pytest.mark.parametrize("model,strategy,n,batch,flags,overrides", CASES,
                         ids=[f"{c[0]}-{c[1]}{c[2]}{'-acc' if c[4] else ''}" for c in CASES])
def test_single_device_loss_code_trains_as_on_one_device(model, strategy, n, batch, flags,
                                                         overrides, tmp_path, tmp_path_factory):
    expected, probe = single_device(tmp_path_factory, model, batch, flags, overrides)
    PROBES.clear()
    train(tmp_path, model, strategy, n, steps=STEPS, batch_size=batch, overrides=overrides, **flags)
    assert PROBES[:n] == [probe] * n  # every call saw one device's collections
    assert max_difference(weights(tmp_path), expected) <= 1e-5


@pytest.mark.parametrize("model,strategy,n,batch", [("coll_cifar10", "tower", 2, 7),
                                                   ("coll_total_loss", "mirrored", 2, 6)])
def test_control_the_unisolated_graph_trains_wrong(model, strategy, n, batch, tmp_path,
                                                   tmp_path_factory, monkeypatch):
    """Without the isolation the same code exits 0 having trained wrong."""
    expected, _ = single_device(tmp_path_factory, model, batch, {}, ())
    monkeypatch.setattr(replica_collections, "call",
                        lambda *args, **kwargs: contextlib.nullcontext())
    monkeypatch.setattr(replica_collections, "per_replica", lambda model_fn: model_fn)
    train(tmp_path, model, strategy, n, steps=STEPS, batch_size=batch)
    assert max_difference(weights(tmp_path), expected) > 1e-2


def test_batch_norm_update_ops_are_each_replicas_own(tmp_path, tmp_path_factory):
    """Mirrored N=2: each replica waits on its own two update ops, and the moving mean equals
    one device's (the replicas' means averaged). The moving variance and the weights differ by
    design: each replica normalizes with its own batch's statistics."""
    expected, probe = single_device(tmp_path_factory, "coll_batch_norm", 6, {}, ())
    PROBES.clear()
    train(tmp_path, "coll_batch_norm", "mirrored", 2, steps=STEPS, batch_size=6)
    assert probe[KEYS.UPDATE_OPS] == 2 and PROBES[:2] == [probe] * 2
    got = weights(tmp_path)
    np.testing.assert_allclose(got["bn/moving_mean"], expected["bn/moving_mean"], atol=1e-5, rtol=0)
    assert np.abs(got["bn/moving_mean"]).max() > 1e-3


PROBED = collection_models.PROBED + ("my_terms",)


def build_three_calls():
    """Three calls of a v1 model in one graph, as Estimator's replicas make them; a user's
    own collection, my_terms, beside TF's."""
    seen = []
    for index in range(3):
        with replica_collections.call(index), tf.name_scope(f"replica_{index}"):
            x = tf.ones([4, 3])
            y = tf.compat.v1.layers.dense(x, 2, name="d", reuse=tf.compat.v1.AUTO_REUSE,
                                          kernel_regularizer=tf.keras.regularizers.l2(0.1))
            y = tf.compat.v1.layers.batch_normalization(y, training=True, name="bn",
                                                        reuse=tf.compat.v1.AUTO_REUSE)
            loss = tf.compat.v1.losses.mean_squared_error(tf.zeros_like(y), y)
            tf.compat.v1.add_to_collection("my_terms", loss)
            tf.compat.v1.summary.scalar("loss", loss)
            seen.append({name: len(tf.compat.v1.get_collection(name)) for name in PROBED})
    return seen


def test_each_call_sees_its_own_and_afterwards_one_device_counts():
    with tf.Graph().as_default():
        seen = build_three_calls()
        after = {name: len(tf.compat.v1.get_collection(name)) for name in PROBED}
        variables = tf.compat.v1.global_variables()
    one_call = {"my_terms": 1, KEYS.LOSSES: 1, KEYS.REGULARIZATION_LOSSES: 1, KEYS.UPDATE_OPS: 2,
                KEYS.SUMMARIES: 1}
    assert seen == [one_call] * 3
    # Regularization and summaries once; losses and update ops every call's.
    assert after == {"my_terms": 3, KEYS.LOSSES: 3, KEYS.REGULARIZATION_LOSSES: 1,
                     KEYS.UPDATE_OPS: 6, KEYS.SUMMARIES: 1}
    assert sorted(v.op.name for v in variables) == [
        "bn/beta", "bn/gamma", "bn/moving_mean", "bn/moving_variance", "d/bias", "d/kernel"]


def test_a_later_call_regularizes_with_its_own_read_of_the_variable():
    """A reused get_variable(regularizer=) still adds its regularization in a later call."""
    with tf.Graph().as_default():
        losses = []
        for index in range(2):
            with replica_collections.call(index), tf.compat.v1.variable_scope(
                    tf.compat.v1.get_variable_scope(), reuse=tf.compat.v1.AUTO_REUSE):
                w = tf.compat.v1.get_variable("w", initializer=[3.0],
                                              regularizer=lambda v: tf.reduce_sum(v * v))
                losses.append(tf.compat.v1.losses.get_regularization_loss())
        assert len(tf.compat.v1.get_collection(KEYS.REGULARIZATION_LOSSES)) == 1
        with tf.compat.v1.Session() as sess:
            sess.run(w.initializer)
            assert sess.run(losses) == [9.0, 9.0]


USER_MODULE = textwrap.dedent('''
    """A TF1 user's model, written for one device: tf.compat.v1.losses, a kernel regularizer,
    get_total_loss(), its own optimizer and train_op; an input that repeats in every mode."""
    import numpy as np
    import tensorflow as tf
    import estimator_dist as ed

    X = np.random.RandomState(0).randn(64, 5).astype(np.float32)
    Y = (X.sum(axis=1) > 0).astype(np.int32)


    def prepare(params):
        return {"serving_features": {"x": [[5], "float32"]}}


    @ed.register_input("user_rows", prepare=prepare)
    def user_rows(mode, params):
        ds = tf.data.Dataset.from_tensor_slices(({"x": X}, Y)).repeat()
        return ds.batch(params["batch_size"])


    @ed.register_model("user_total_loss", hparams={"learning_rate": 0.5}, default_input="user_rows")
    def user_total_loss(features, labels, mode, params):
        l2 = tf.keras.regularizers.l2(0.01)
        hidden = tf.compat.v1.layers.dense(features["x"], 8, tf.nn.tanh, kernel_regularizer=l2,
                                           kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=3))
        logits = tf.compat.v1.layers.dense(hidden, 2, kernel_regularizer=l2,
                                           kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=4))
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits},
                export_outputs={"serving_default": tf.estimator.export.PredictOutput({"logits": logits})})
        tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        loss = tf.compat.v1.losses.get_total_loss()
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(mode, loss=loss)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(params["learning_rate"]).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
''')


def test_cli_user_code_with_get_total_loss_trains_as_one_device_under_mirrored(tmp_path,
                                                                                monkeypatch):
    """As a user runs it: their module in its own folder, --import, mirrored N=2 vs none."""
    (tmp_path / "user_total_loss_model.py").write_text(USER_MODULE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    for strategy, devices in (("none", 1), ("mirrored", 2)):
        result = run_cli("train", "--import", "user_total_loss_model", "--model",
                         "user_total_loss", "--strategy", strategy, "--num_devices",
                         str(devices), "--batch_size", "16", "--train_steps", "6",
                         "--eval_steps", "1", "--export", "none", "--seed", "1",
                         "--model_dir", str(tmp_path / strategy))
        assert result.returncode == 0, result.stderr
    assert max_difference(weights(tmp_path / "mirrored"), weights(tmp_path / "none")) <= 1e-5
