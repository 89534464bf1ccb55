"""`--strategy tower`: exact weighted steps, shared variables, batch norm, eval/predict, interchange."""
import glob
import os

import numpy as np
import pytest
import tensorflow as tf

import estimator_dist
from conftest import make_config
from estimator_dist.training import plan as plan_lib
from estimator_dist.training import estimator as estimator_lib
from estimator_dist.distribute import strategies
from estimator_dist.graph import towers
from estimator_dist.errors import UserError
from tiny_models import (BATCH, CLASSES, EVAL, EXAMPLES, PREDICT, TRAIN, X, Y, assert_same_weights,
                         max_difference, train, weights)


def test_split_sizes_differ_by_at_most_one():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        got = sess.run([towers.split_sizes(b, n) for b, n in [(7, 2), (7, 3), (2, 3), (9, 3)]])
    assert [list(s) for s in got] == [[4, 3], [3, 2, 2], [1, 1, 0], [3, 3, 3]]


@pytest.mark.parametrize("model", ["tiny_v1", "tiny_keras"])
@pytest.mark.parametrize("n", [2, 3])
def test_tower_step_equals_single_device(model, n, tmp_path):
    """B = 7 over 2 or 3 towers, then a final batch of 2 (an empty tower for n = 3)."""
    flags = {"overrides": ("epochs=1",), "steps": 10}
    single = train(tmp_path / "none", model, **flags)
    tower = train(tmp_path / "tower", model, "tower", n, **flags)
    assert single["global_step"] == tower["global_step"] == 4  # 7 + 7 + 7 + 2 examples
    expected, got = weights(tmp_path / "none"), weights(tmp_path / "tower")
    assert_same_weights(got, expected)
    assert all(np.isfinite(v).all() for v in got.values())


def unweighted(tower_grads, sizes):
    """The originals' plain average of the towers (biased when tower sizes differ)."""
    return [tf.add_n(list(g)) / len(g) for g in zip(*tower_grads)]


@pytest.mark.parametrize("model", ["tiny_v1", "tiny_keras"])
def test_unweighted_average_would_fail_the_exactness_test(model, tmp_path, monkeypatch):
    """The control for the test above: the classic unweighted average misses by far more than 1e-5."""
    flags = {"steps": 3}
    expected = weights(train(tmp_path / "none", model, **flags)["model_dir"])
    monkeypatch.setattr(towers, "combine_gradients", unweighted)
    biased = weights(train(tmp_path / "tower", model, "tower", 3, **flags)["model_dir"])
    assert max_difference(biased, expected) > 1e-3


@pytest.mark.parametrize("model", ["tiny_v1", "tiny_keras"])
def test_batch_norm_keeps_tower0_statistics(model, tmp_path):
    """One step on B = 7 over 2 towers: moving_mean = (1 - momentum) x mean of tower 0's 4 examples."""
    train(tmp_path, model, "tower", 2, steps=1, overrides=("batch_norm=true",))
    moving_mean = weights(tmp_path)[("mlp/" if model == "tiny_keras" else "") + "bn/moving_mean"]
    np.testing.assert_allclose(moving_mean, 0.01 * X[:4].mean(axis=0), atol=1e-5)
    assert np.abs(moving_mean).max() > 1e-3


def predict_and_evaluate(model_dir, model, strategy, n):
    config = make_config(model, (), strategy=strategy, num_devices=n, model_dir=str(model_dir),
                         batch_size=BATCH, eval_steps=0)
    p = plan_lib.plan(config)
    est = estimator_lib.build_estimator(
        p, estimator_lib.build_run_config(p, strategies.make(strategy, p.devices)))
    predictions = [row["logits"] for row in est.predict(estimator_lib.make_input_fn(p, PREDICT))]
    metrics = est.evaluate(estimator_lib.make_input_fn(p, EVAL))
    return np.stack(predictions), metrics


def test_eval_and_predict_under_towers_match_single_device_in_input_order(tmp_path):
    train(tmp_path, "tiny_keras", "tower", 3, steps=3)
    tower_predictions, tower_metrics = predict_and_evaluate(tmp_path, "tiny_keras", "tower", 3)
    single_predictions, single_metrics = predict_and_evaluate(tmp_path, "tiny_keras", "none", 1)
    assert tower_predictions.shape == (EXAMPLES, CLASSES)
    np.testing.assert_allclose(tower_predictions, single_predictions, atol=1e-6)
    assert tower_metrics == single_metrics
    # Input order: row i is the network applied to X[i].
    w = weights(tmp_path)
    hidden = np.tanh(X @ w["mlp/hidden/kernel"] + w["mlp/hidden/bias"])
    np.testing.assert_allclose(tower_predictions, hidden @ w["mlp/logits/kernel"] + w["mlp/logits/bias"],
                               atol=1e-4)


@pytest.mark.parametrize("model", ["tiny_v1", "tiny_keras"])
def test_checkpoints_interchange_tower_mirrored_none(model, tmp_path):
    """tower -> mirrored -> none -> tower in one model_dir, 2 steps each, same variable names."""
    single = weights(train(tmp_path / "none", model, steps=2, batch_size=6)["model_dir"])
    model_dir = tmp_path / "chain"
    before = None
    for strategy, n, steps in [("tower", 2, 2), ("mirrored", 2, 4), ("none", 1, 6), ("tower", 3, 8)]:
        summary = train(model_dir, model, strategy, n, steps=steps, batch_size=6)
        assert (summary["start_step"], summary["global_step"]) == (steps - 2, steps)
        after = weights(model_dir)
        assert sorted(after) == sorted(single)  # the names of a single-device run
        if before is not None:
            # Training continued from the restored weights, not from a fresh init.
            assert 0 < max_difference(after, before) < 1.0
        before = after


def test_tower_variables_live_on_the_variable_device(tmp_path):
    config = make_config("tiny_keras", (), strategy="tower", num_devices=2, batch_size=BATCH,
                         model_dir=str(tmp_path), variable_device="device0")
    p = plan_lib.plan(config)
    assert "variables on /cpu:0" in plan_lib.describe(p) and "2 tower(s) of 4 or 3" in plan_lib.describe(p)
    model_fn = estimator_lib.build_model_fn(p)
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        features, labels = {"x": tf.constant(X[:BATCH])}, tf.constant(Y[:BATCH])
        with tf.device("/cpu:1"):
            model_fn(features, labels, TRAIN, p.params(), None)
        variables = tf.compat.v1.global_variables()
        kernels = [v for v in variables if v.name.startswith("mlp/")]
        assert sorted(v.name for v in kernels) == ["mlp/hidden/bias:0", "mlp/hidden/kernel:0",
                                                   "mlp/logits/bias:0", "mlp/logits/kernel:0"]
        assert all(v.device.lower().endswith("cpu:0") for v in kernels), [v.device for v in kernels]
        ops = tf.compat.v1.get_default_graph().get_operations()
        assert any(op.name.startswith("tower_1/") and op.device.lower().endswith("cpu:1") for op in ops)


@pytest.mark.parametrize("strategy,n", [("tower", 2), ("none", 1)])
def test_own_train_op_is_a_clear_error_under_tower_only(strategy, n, tmp_path):
    if strategy == "tower":
        with pytest.raises(UserError) as e:
            train(tmp_path, "tiny_own_train_op", strategy, n, steps=2)
        assert str(e.value) == (
            "model 'tiny_own_train_op' builds its own train_op; --strategy tower and "
            "--accumulate_steps need the model_fn to build it with "
            "estimator_dist.minimize(loss, params) (the other strategies still accept its own)")
    else:
        assert train(tmp_path, "tiny_own_train_op", strategy, n, steps=2)["global_step"] == 2


def test_per_tower_losses_in_tensorboard_and_reported_mean(tmp_path):
    train(tmp_path, "tiny_v1", "tower", 2, steps=2)
    scalars = {}
    for path in glob.glob(os.path.join(str(tmp_path), "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars[(value.tag, event.step)] = value.simple_value
    step = 2  # summaries of the step that ran at global step 1
    tower0, tower1 = scalars[("tower_loss/tower_0", step)], scalars[("tower_loss/tower_1", step)]
    # 7 examples: tower 0 has 4, tower 1 has 3; the reported loss is the mean over all 7.
    assert scalars[("loss", step)] == pytest.approx((4 * tower0 + 3 * tower1) / 7, abs=1e-5)


def test_an_empty_tower_weighs_exactly_zero_even_if_its_gradient_is_nan():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        grads = [[tf.constant([1.0, 2.0])], [tf.constant([3.0, 5.0])], [tf.constant([np.nan, np.nan])]]
        (combined,) = towers.combine_gradients(grads, tf.constant([2, 1, 0]))
        np.testing.assert_allclose(sess.run(combined), [(2 * 1 + 3) / 3, (2 * 2 + 5) / 3])


def test_split_batch_dense_sparse_nested_and_missing_labels():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        dense = tf.constant(np.arange(10).reshape(5, 2))
        sparse = tf.sparse.from_dense(tf.constant([[1, 0], [0, 2], [3, 0], [0, 0], [5, 6]]))
        sizes = towers.split_sizes(towers.batch_size({"a": dense}), 2)
        parts = towers.split_batch({"a": dense, "b": {"s": sparse}}, sizes, 2)
        got = sess.run([(p["a"], tf.sparse.to_dense(p["b"]["s"])) for p in parts])
        assert towers.split_batch(None, sizes, 2) == [None, None]
    np.testing.assert_array_equal(got[0][0], [[0, 1], [2, 3], [4, 5]])
    np.testing.assert_array_equal(got[1][0], [[6, 7], [8, 9]])
    np.testing.assert_array_equal(got[0][1], [[1, 0], [0, 2], [3, 0]])
    np.testing.assert_array_equal(got[1][1], [[0, 0], [5, 6]])


def test_a_variable_only_later_towers_create_is_a_clear_error():
    calls = []

    def model_fn(features, labels, mode, params):
        calls.append(1)
        x = tf.compat.v1.layers.dense(features["x"], 1, name="out")
        if len(calls) > 1:
            x += tf.compat.v1.get_variable("surprise", [], tf.float32)
        loss = tf.reduce_mean(x)
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=estimator_dist.minimize(loss, params))

    wrapped = towers.tower_model_fn(model_fn, "m", devices=("/cpu:0", "/cpu:1"), variable_device="/cpu:0")
    with tf.Graph().as_default(), pytest.raises(UserError) as e:
        tf.compat.v1.train.get_or_create_global_step()
        wrapped({"x": tf.constant(X[:BATCH])}, None, TRAIN, {"optimizer": "sgd"}, None)
    assert str(e.value) == ("model 'm' creates variables in towers > 0 that tower 0 did not "
                            "(surprise:0); a model_fn must build the same variables on every call")


def test_optimizer_slots_keep_single_device_names_when_minimize_runs_in_a_variable_scope(tmp_path):
    """Adam's slots are named after the variable scope minimize() is called in; towers re-enter it."""
    overrides = ("scope=net", "optimizer=adam", "learning_rate=0.01")
    single = weights(train(tmp_path / "none", "tiny_v1", steps=1, overrides=overrides)["model_dir"])
    assert "net/beta1_power" in single and "net/net/logits/kernel/Adam" in single
    for name, strategy, n, k in [("tower", "tower", 2, 1), ("accumulate", "none", 1, 2)]:
        got = weights(train(tmp_path / name, "tiny_v1", strategy, n, steps=1, overrides=overrides,
                            accumulate_steps=k)["model_dir"])
        assert sorted(got) == sorted(single), name
