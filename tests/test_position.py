"""Exact data position (issue 24, part 1): the global batch of step k is a function of
(seed, k) for every built-in input, whatever the pipelines and replicas, and a resume
continues the stream at the next example."""
import numpy as np
import pytest
import tensorflow as tf

import input_fns.cifar as cifar
from estimator_dist.training import position
from estimator_dist.training.registry import INPUTS, MODELS

TRAIN = tf.estimator.ModeKeys.TRAIN
GLOBAL = 12


def params_of(name):
    entry = INPUTS.get(name)
    hparams = MODELS.get("tabular").hparams if name == "tabular" else {}
    params = dict(hparams, batch_size=GLOBAL, data_dir="", data_path="",
                  label_column="", synthetic=True, seed=5, reader_nice=0, train_steps=10)
    return {**params, **{k: v for k, v in entry.prepare(params).items()
                         if k not in ("serving_features", "data_dir")}}


def rows(features, labels):
    """One float64 row per example: its numeric features and label (strings hashed)."""
    columns = []
    for value in tf.nest.flatten(features):
        value = value.numpy()
        if value.dtype.kind in "OSU":
            value = np.array([hash(v) % 1000003 for v in value.reshape(-1)])
        columns.append(value.reshape(len(labels), -1).astype(np.float64))
    return np.concatenate(columns + [labels.numpy().reshape(-1, 1).astype(np.float64)], axis=1)


def global_batches(name, steps, slices, pipelines, start_step=0):
    """The global batches of `steps` steps from start_step, put together from the slices
    every pipeline yields (a pipeline's consecutive elements go to its replicas in turn)."""
    params = {**params_of(name), "global_batch_size": GLOBAL, "batch_slices": slices,
              "batch_size": GLOBAL // slices, "start_step": start_step}
    per = slices // pipelines
    yielded = []
    for index in range(pipelines):
        context = (tf.distribute.InputContext(pipelines, index, slices) if pipelines > 1
                   else None)
        data = INPUTS.get(name).fn(TRAIN, params, context)
        yielded.append([rows(f, l) for f, l in data.take(steps * per)])
    return [np.concatenate([yielded[w][k * per + d] for w in range(pipelines)
                            for d in range(per)]) for k in range(steps)]


@pytest.mark.parametrize("name", ["digits", "tabular", "cifar"])
def test_global_batch_is_the_same_for_any_pipelines_and_replicas(name):
    one = global_batches(name, 6, slices=1, pipelines=1)
    for slices, pipelines in ((2, 2), (3, 3), (6, 3), (4, 1)):
        other = global_batches(name, 6, slices, pipelines)
        for k, (a, b) in enumerate(zip(one, other)):
            np.testing.assert_array_equal(a, b, err_msg=f"step {k}, {slices}/{pipelines}")
    assert not np.array_equal(one[0], one[1])


@pytest.mark.parametrize("name", ["digits", "tabular", "cifar"])
def test_a_resume_continues_at_the_next_example(name):
    straight = global_batches(name, 8, slices=2, pipelines=2)
    resumed = global_batches(name, 4, slices=3, pipelines=3, start_step=4)
    for a, b in zip(straight[4:], resumed):
        np.testing.assert_array_equal(a, b)


def test_the_stream_is_whole_epochs_of_permutations_spanning_batches():
    n, batch = 10, 4
    order = np.concatenate([position.global_batch_indices(n, batch, 3, k) for k in range(10)])
    for epoch in order.reshape(4, n):
        assert sorted(epoch.tolist()) == list(range(n))
    np.testing.assert_array_equal(position.global_batch_indices(n, batch, 3, 2),
                                  position.global_batch_indices(n, batch, 3, 2))
    assert not np.array_equal(position.global_batch_indices(n, batch, 3, 0),
                              position.global_batch_indices(n, batch, 4, 0))


def test_slices_follow_the_input_context_and_accumulation():
    params = {"global_batch_size": 12, "batch_slices": 6, "start_step": 5,
              "batches_per_step": 2}
    context = tf.distribute.InputContext(3, 2, 6)  # pipeline 2 of 3: slices 4 and 5
    assert position.layout(params, context) == (4, 2, 6)
    assert position.start_element(params, context) == 5 * 2 * 2
    assert position.element_position(params, context, 21) == (10, 10, 2)
    with pytest.raises(ValueError, match="do not divide"):
        position.layout({"batch_slices": 4}, tf.distribute.InputContext(3, 0, 4))


def test_cifar_without_a_seed_draws_one_order_in_every_pipeline():
    params = {**params_of("cifar"), "seed": None, "global_batch_size": GLOBAL,
              "batch_slices": 2, "batch_size": GLOBAL // 2}
    halves = [next(iter(cifar.cifar_input(TRAIN, params, tf.distribute.InputContext(2, i, 2))))
              for i in (0, 1)]
    whole = next(iter(cifar.cifar_input(TRAIN, {**params, "batch_slices": 1,
                                                "batch_size": GLOBAL})))
    np.testing.assert_array_equal(np.concatenate([h[1] for h in halves]), whole[1])


def test_scale_lr_refuses_a_resume_on_another_replica_count(tmp_path):
    from estimator_dist.errors import UserError
    from estimator_dist.guards import checkpoints

    (tmp_path / "config.yaml").write_text("model: digits\nreplicas: 2\n")
    for name in ("model.ckpt-60.index", "model.ckpt-60.data-00000-of-00001"):
        (tmp_path / name).write_text("")
    checkpoints.check_same_lr_scale(str(tmp_path), True, 2)
    checkpoints.check_same_lr_scale(str(tmp_path), False, 3)  # no scaling: any count
    with pytest.raises(UserError, match=r"^--scale_lr: the checkpoints in .* learning rate "
                                        r"x 2 \(replicas\), this run has 3; resume with 2"):
        checkpoints.check_same_lr_scale(str(tmp_path), True, 3)
