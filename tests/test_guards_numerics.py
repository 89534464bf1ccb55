"""Non-finite loss or gradient: the step fails before any variable changes, nothing poisoned is saved.

guard_mlp turns its loss NaN/Inf, or its hidden-layer gradient NaN with a finite
loss, from global step 9 on, so the failing step is 10: exactly when a periodic
checkpoint is due (every 5). Without the guard TensorFlow saves model.ckpt-10
full of NaN weights there (the NaN gradient is applied; NanTensorHook only sees
the next step's loss), and never stops for an Inf loss.
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import guard_models  # noqa: F401 - registers guard_mlp
from conftest import make_config
from estimator_dist.training import plan as plan_lib
from estimator_dist.training import estimator as estimator_lib
from estimator_dist.training import run as runner
from estimator_dist.cli.main import main
from estimator_dist.errors import EXIT_NON_FINITE, NonFiniteError

CASES = [
    # (poison, strategy, devices, accumulate_steps, what the message names)
    ("loss_nan", "none", 1, 1, "the loss is NaN"),
    ("loss_inf", "none", 1, 1, "the loss is Inf"),
    ("grad_nan", "none", 1, 1, "the gradient of 'hidden/"),
    ("grad_nan", "tower", 2, 1, "the gradient of 'hidden/"),
    ("loss_inf", "none", 1, 2, "the loss is Inf"),
    ("grad_nan", "none", 1, 3, "the gradient of 'hidden/"),
    ("grad_nan", "mirrored", 2, 1, "the gradient of 'hidden/"),
]


def all_finite(prefix):
    reader = tf.compat.v1.train.NewCheckpointReader(prefix)
    return all(np.isfinite(reader.get_tensor(n)).all() for n in reader.get_variable_to_shape_map()
               if reader.get_tensor(n).dtype.kind == "f")


@pytest.mark.parametrize("poison,strategy,n,accumulate,what", CASES,
                         ids=[f"{c[0]}-{c[1]}-k{c[3]}" for c in CASES])
def test_non_finite_step_stops_before_a_poisoned_checkpoint(poison, strategy, n, accumulate, what,
                                                            tmp_path):
    config = make_config("guard_mlp", (f"poison={poison}", "poison_step=9"), train_steps=30,
                         save_checkpoints_steps=5, model_dir=str(tmp_path), strategy=strategy,
                         num_devices=n, accumulate_steps=accumulate, seed=1)
    with pytest.raises(NonFiniteError) as error:
        runner.train(config, out=lambda *_: None)
    message = str(error.value)
    assert "\n" not in message and message.startswith("training stopped at step 10: ")
    assert what in message, message
    assert f"the last good checkpoint is {tmp_path / 'model.ckpt-5'}" in message
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-5")
    saved = sorted(p for p in os.listdir(tmp_path) if p.endswith(".index"))
    assert saved == ["model.ckpt-0.index", "model.ckpt-5.index"]
    assert all_finite(str(tmp_path / "model.ckpt-5"))
    assert not [p for p in os.listdir(tmp_path) if "temp" in p]


def test_cli_exit_code_and_resume_from_the_last_good_checkpoint(tmp_path, capsys):
    args = ["train", "--model", "guard_mlp", "--model_dir", str(tmp_path), "--train_steps", "30",
            "--save_checkpoints_steps", "5", "--set", "poison=loss_nan", "--set", "poison_step=9"]
    assert main(args) == EXIT_NON_FINITE
    err = capsys.readouterr().err
    assert err.startswith("estimator-dist: error: training stopped at step 10: the loss is NaN")
    assert err.count("\n") == 1 and "Traceback" not in err
    # The last good checkpoint restores: fixing the cause and rerunning resumes from it.
    assert main(["evaluate", "--model_dir", str(tmp_path)]) == 0
    assert "global_step 5" in capsys.readouterr().out
    fixed = args[:-4] + ["--train_steps", "12"]
    assert main(fixed) == 0
    out = capsys.readouterr().out
    assert "resuming from the checkpoint at step 5" in out and "done: step 12" in out


def test_guard_passes_finite_gradients_unchanged_and_names_the_bad_one():
    from estimator_dist.graph import numerics

    with tf.Graph().as_default():
        a = tf.compat.v1.get_variable("a", [3])
        b = tf.compat.v1.get_variable("b", [2, 2])
        e = tf.compat.v1.get_variable("e", [5, 2])
        grad_a = tf.compat.v1.placeholder(tf.float32, [3])
        grad_b = tf.compat.v1.placeholder(tf.float32, [2, 2])
        sparse = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([3]), tf.constant([5, 2]))
        out = numerics.guard(tf.constant(1.0), [(grad_a, a), (None, e), (grad_b, b), (sparse, e)])
        assert [v for _, v in out] == [a, e, b, e] and out[1][0] is None
        assert isinstance(out[3][0], tf.IndexedSlices)
        fetch = [out[0][0], out[2][0], out[3][0].values, out[3][0].indices]
        with tf.compat.v1.Session() as session:
            finite = {grad_a: np.float32([1.0, -2.0, 3.5]),
                      grad_b: np.float32([[0.0, 1e30], [-1e30, 7.0]])}
            got = session.run(fetch, finite)
            np.testing.assert_array_equal(got[0], finite[grad_a])
            np.testing.assert_array_equal(got[1], finite[grad_b])
            np.testing.assert_array_equal(got[2], [[1.0, 2.0]])
            np.testing.assert_array_equal(got[3], [3])
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                session.run(fetch, {grad_a: [1.0, 2.0, 3.0], grad_b: [[0.0, np.inf], [1.0, 2.0]]})
    error = numerics.non_finite_error(info.value, 7, None, "m")
    assert "the gradient of 'b' is Inf" in str(error) and "at step 7" in str(error)



def _minimize_checks(after_last_gradient, conv):
    """(every IsFinite op, the gradient ops they check) of a small net's minimize()."""
    from estimator_dist.graph import numerics
    from estimator_dist.graph import train_op

    with tf.Graph().as_default() as graph:
        x = tf.random.normal([8, 4, 4, 1])
        if conv:
            x = tf.compat.v1.layers.conv2d(x, 2, 3, use_bias=False, name="conv")
        h = tf.compat.v1.layers.dense(tf.compat.v1.layers.flatten(x), 6, tf.nn.relu, name="hidden")
        loss = tf.reduce_mean(tf.square(tf.compat.v1.layers.dense(h, 1, name="out")))
        with numerics.checks_after_last_gradient(after_last_gradient):
            train_op.minimize(loss, {"optimizer": "sgd", "learning_rate": 0.1})
        names = [op.name for op in graph.get_operations()]
        # TF1's default per-op gating (GATE_OP) groups each op's gradients in a tuple.
        assert not [n for n in names if n.startswith("gradients/") and "/tuple/" in n]
        checks = [op for op in graph.get_operations() if op.type == "IsFinite"]
        grads = {check.inputs[0].op for check in checks}
        assert len(checks) == 4 + conv and all(g.name.startswith("gradients/") for g in grads)
        return checks, grads


@pytest.mark.parametrize("after_last_gradient,conv", [(True, True), (True, False),
                                                      (False, True)])
def test_minimize_is_ungated_and_checks_after_the_last_gradient_only_when_asked(
        after_last_gradient, conv):
    """Speed (README "Performance"): no per-op gating; the finite checks wait for every
    gradient (a conv net on one CPU replica on several threads) or run beside the
    backward pass."""
    checks, grads = _minimize_checks(after_last_gradient, conv)
    waits = [grads <= set(c.control_inputs) | {c.inputs[0].op} for c in checks]
    assert waits == [after_last_gradient and conv] * len(checks)


@pytest.mark.parametrize("strategy,n,expected", [("none", 1, True), ("tower", 1, True),
                                                 ("mirrored", 2, False), ("tower", 2, False)])
def test_checks_wait_for_the_last_gradient_on_one_multi_threaded_cpu_replica(strategy, n,
                                                                              expected):
    from estimator_dist.distribute import devices

    p = plan_lib.plan(make_config(strategy=strategy, num_devices=n, batch_size=8))
    multi_core = devices.available_cores() > 1
    assert estimator_lib.checks_after_last_gradient(p) is (expected and multi_core)
