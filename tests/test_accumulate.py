"""`--accumulate_steps K`: one update per K micro-batches equals one step on the K times larger batch."""
import numpy as np
import pytest

from conftest import make_config
from estimator_dist.training import run as runner
from tiny_models import (EXAMPLES, INITIAL, V1_NAMES, X, Y, assert_same_weights, numpy_gradients,
                         sgd_step, train, weights)

MICRO = 5  # 23 examples = 5 + 5 + 5 + 5 + 3: the last micro-batch is short


def micro_batches():
    return [(X[i:i + MICRO], Y[i:i + MICRO]) for i in range(0, EXAMPLES, MICRO)]


def test_the_example_weighting_is_measurable():
    """The control: a plain mean over the 5 micro-batches misses by far more than the 1e-5 tolerance."""
    parts = micro_batches()
    weighted = numpy_gradients(INITIAL, X, Y)
    unweighted = [np.mean(g, axis=0) for g in zip(*[numpy_gradients(INITIAL, x, y) for x, y in parts])]
    assert max(np.abs(a - b).max() for a, b in zip(sgd_step(INITIAL, weighted),
                                                   sgd_step(INITIAL, unweighted))) > 1e-3


@pytest.mark.parametrize("model,strategy,n", [("tiny_v1", "none", 1), ("tiny_keras", "none", 1),
                                              ("tiny_v1", "tower", 3), ("tiny_keras", "tower", 2)])
def test_one_update_over_uneven_micro_batches_equals_one_big_batch(model, strategy, n, tmp_path):
    """K = 5 micro-batches of 5, 5, 5, 5, 3 examples: one update = one step on all 23."""
    flags = {"overrides": ("epochs=1",), "steps": 10}
    accumulated = train(tmp_path / "acc", model, strategy, n, batch_size=MICRO, accumulate_steps=5,
                        **flags)
    big = train(tmp_path / "big", model, batch_size=EXAMPLES, **flags)
    assert accumulated["global_step"] == big["global_step"] == 1
    assert_same_weights(weights(tmp_path / "acc"), weights(tmp_path / "big"))
    if model == "tiny_v1":
        expected = sgd_step(INITIAL, numpy_gradients(INITIAL, X, Y))
        got = weights(tmp_path / "acc")
        for name, value in zip(V1_NAMES, expected):
            np.testing.assert_allclose(got[name], value, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("model,strategy,n", [("tiny_v1", "none", 1), ("tiny_keras", "tower", 2),
                                              ("tiny_v1", "mirrored", 2),
                                              ("tiny_keras", "mirrored", 2),
                                              ("tiny_v1", "one_device", 1)])
def test_updates_equal_steps_on_a_k_times_larger_batch(model, strategy, n, tmp_path):
    """3 updates of K = 2 micro-batches of 4 (mirrored: 2 per replica) = 3 steps on batches of 8.

    global_step counts updates, and the checkpoint holds exactly the variables of a
    run without accumulation (the accumulators are local, never saved).
    """
    accumulated = train(tmp_path / "acc", model, strategy, n, steps=3, batch_size=4,
                        accumulate_steps=2)
    big = train(tmp_path / "big", model, steps=3, batch_size=8)
    assert accumulated["global_step"] == big["global_step"] == 3
    assert_same_weights(weights(tmp_path / "acc"), weights(tmp_path / "big"))


def test_batch_norm_statistics_move_on_every_micro_batch(tmp_path):
    train(tmp_path, "tiny_v1", steps=1, batch_size=4, accumulate_steps=2,
          overrides=("batch_norm=true",))
    moving_mean = 0.01 * X[:4].mean(axis=0)
    moving_mean = 0.99 * moving_mean + 0.01 * X[4:8].mean(axis=0)
    np.testing.assert_allclose(weights(tmp_path)["bn/moving_mean"], moving_mean, atol=1e-5)


def test_progress_prints_once_per_update(tmp_path):
    lines = []
    config = make_config("tiny_v1", (), train_steps=4, batch_size=4, accumulate_steps=3,
                         model_dir=str(tmp_path), export="none", eval_steps=1, seed=1)
    runner.train(config, out=lines.append)
    assert "3 batches per update (12 examples)" in lines[0]
    assert [line.split()[1] for line in lines if line.startswith("step ")] == ["1/4", "2/4", "3/4", "4/4"]


def test_mirrored_accumulation_keeps_mirrored_checkpoint_names(tmp_path):
    overrides = ("scope=net", "optimizer=adam", "learning_rate=0.01")
    plain = weights(train(tmp_path / "plain", "tiny_v1", "mirrored", 2, steps=1, batch_size=4,
                          overrides=overrides)["model_dir"])
    accumulated = weights(train(tmp_path / "acc", "tiny_v1", "mirrored", 2, steps=1, batch_size=4,
                                accumulate_steps=2, overrides=overrides)["model_dir"])
    assert sorted(accumulated) == sorted(plain)
