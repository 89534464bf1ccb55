"""Workers fed the same batches under multi_worker_mirrored: an input that ignores its
input_context, as TensorFlow's official inputs do, is refused at the first step (exit 2);
a sharded one trains; --allow_identical_batches lets the unsharded one train."""
import re

import pytest

from support import Run, checkpoint_steps, environment

# Written as TensorFlow's official examples write an input and a model_fn: no input_context,
# a shuffle, repeat() in every mode, the model's own train_op.
USER_CODE = '''
import numpy as np
import tensorflow as tf
import estimator_dist as ed


def examples():
    rng = np.random.RandomState(0)
    x = rng.rand(512, 8).astype(np.float32)
    return {"x": x}, (x.sum(axis=1) > 4.0).astype(np.int32)


@ed.register_input("official")
def official_input(mode, params):
    dataset = tf.data.Dataset.from_tensor_slices(examples())
    if mode == tf.estimator.ModeKeys.TRAIN:
        dataset = dataset.shuffle(buffer_size=512)
    return dataset.repeat().batch(params["batch_size"])


@ed.register_input("sharded")
def sharded_input(mode, params, input_context=None):
    dataset = tf.data.Dataset.from_tensor_slices(examples())
    if input_context:
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
    if mode == tf.estimator.ModeKeys.TRAIN:
        dataset = dataset.shuffle(buffer_size=512)
    return dataset.repeat().batch(params["batch_size"])


@ed.register_input("augmented")
def augmented_input(mode, params):
    """As TensorFlow's cifar10_estimator tutorial: the shuffle has its own seed, the
    augmentation is drawn apart on each worker."""
    dataset = tf.data.Dataset.from_tensor_slices(examples()).repeat()
    if mode == tf.estimator.ModeKeys.TRAIN:
        dataset = dataset.shuffle(buffer_size=512, seed=7).map(
            lambda features, label: ({"x": features["x"] + tf.random.uniform([8], 0, 0.01)},
                                     label))
    return dataset.batch(params["batch_size"])


@ed.register_model("tiny", default_input="official")
def tiny(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features["x"], 2)
    if mode == tf.estimator.ModeKeys.PREDICT:
        predictions = {"classes": tf.argmax(logits, axis=1)}
        return tf.estimator.EstimatorSpec(mode, predictions=predictions, export_outputs={
            "serving_default": tf.estimator.export.PredictOutput(predictions)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
'''

STEPS = 10


def cluster(tmp_path, *flags, seed=("--seed", "1")):
    """A 2-worker multi_worker_mirrored cluster of the user's code, from a fresh folder."""
    (tmp_path / "official.py").write_text(USER_CODE)
    run = Run(["--workers", "2", "--strategy", "multi_worker_mirrored", "--import", "official",
               "--model", "tiny", "--batch_size", "128", *seed, "--export", "none",
               "--eval_steps", "2", "--train_steps", str(STEPS), "--model_dir", "run", *flags],
              cwd=str(tmp_path), env=environment(tmp_path), timeout=540)
    try:
        run.wait()
    finally:
        run.stop()
    return run


@pytest.mark.timeout(600)
def test_an_unsharded_input_stops_every_worker_at_its_first_step(tmp_path):
    run = cluster(tmp_path, "--input", "official")
    assert run.proc.returncode == 2, run.text
    for task in ("chief:0", "worker:0"):
        line = next((line for line in run.lines if line.startswith(f"[{task}] estimator-dist: "
                                                                    f"error: ")), None)
        assert line is not None, run.text
        assert re.search(r"all 2 workers read the same first batch from input 'official'", line)
        assert "ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)" \
            in line and "--allow_identical_batches" in line, line
    assert "Traceback" not in run.text and "restarting" not in run.text, run.text
    assert not checkpoint_steps(tmp_path / "run") or max(checkpoint_steps(tmp_path / "run")) == 0
    assert not (tmp_path / "run" / "tmp_worker_0").exists()  # the worker's copies, removed


@pytest.mark.timeout(600)
def test_augmented_batches_of_the_same_examples_stop_once_their_labels_tell(tmp_path):
    """Unseeded augmentation makes the workers' batches differ; the labels, 512 of them
    (8 steps of 64 a worker), are the same sequence."""
    run = cluster(tmp_path, "--input", "augmented", seed=())
    assert run.proc.returncode == 2, run.text
    assert re.search(r"\[chief:0\] estimator-dist: error: all 2 workers read the same labels "
                     r"in the same order in their first 8 steps \(their features differ: random "
                     r"augmentation\?\) from input 'augmented' .*ds\.shard\(", run.text), run.text
    assert "step 8/" in run.text and "step 9/" not in run.text, run.text
    assert "Traceback" not in run.text, run.text


@pytest.mark.timeout(900)
@pytest.mark.parametrize("flags", [("--input", "sharded"),
                                   ("--input", "official", "--allow_identical_batches")],
                         ids=["sharded", "allowed"])
def test_a_sharded_input_or_the_flag_trains_to_the_end(tmp_path, flags):
    """Past the label comparison too (step 8 of 10)."""
    run = cluster(tmp_path, *flags)
    assert run.proc.returncode == 0, run.text
    assert checkpoint_steps(tmp_path / "run")[-1] == STEPS
    assert "same first batch" not in run.text, run.text


def test_the_fingerprint_tells_equal_batches_from_reordered_or_changed_ones():
    import tensorflow as tf

    from estimator_dist.guards import identical_batches

    def of(features, labels=None):
        """The fingerprint of (features, labels), built from plain values in a graph."""
        with tf.Graph().as_default():
            built = {k: tf.SparseTensor(*v) if isinstance(v, tuple) else tf.constant(v)
                     for k, v in features.items()}
            fingerprint = identical_batches.fingerprint(
                built, None if labels is None else tf.constant(labels))
            return tf.compat.v1.Session().run(fingerprint)

    x = [[1.0, 2.0], [3.0, 4.0]]
    same = of({"x": x}, [0, 1])
    assert same == of({"x": x}, [0, 1])
    assert same != of({"x": x[::-1]}, [1, 0])
    assert same != of({"x": x}, [0, 0])
    assert of({"s": ([[0, 0]], ["a"], [2, 1])}) != of({"s": ([[1, 0]], ["a"], [2, 1])})
    assert 0 <= same < identical_batches.BUCKETS
    assert sum(int(c) << (identical_batches.CHUNK_BITS * i)
               for i, c in enumerate(identical_batches.chunks(same))) == same


@pytest.mark.parametrize("rows, per_worker, shared", [
    ([[1, 2, 3], [1, 2, 3]], 1, 2),
    ([[1, 2, 3], [1, 2, 4]], 1, 0),
    ([[5, 0, 0], [5, 0, 0], [6, 0, 0], [6, 0, 0]], 2, 0),  # 2 replicas a worker
    ([[5, 0, 0], [5, 0, 0], [5, 0, 0], [5, 0, 0]], 2, 2),
    ([[1, 0, 0], [2, 0, 0], [1, 0, 0]], 1, 2),
])
def test_workers_sharing_a_first_batch_are_counted(rows, per_worker, shared):
    from estimator_dist.guards import identical_batches

    assert identical_batches.sharing(rows, per_worker) == shared


def test_labels_count_only_when_a_chance_match_is_unlikely():
    import hashlib
    import random

    from estimator_dist.guards import identical_batches as ib

    shuffled = random.Random(0).sample([b"0", b"1"] * 256, 512)
    assert ib.label_bits(shuffled) == 512.0
    assert ib.label_bits([b"0"] * 512) == 0.0  # one class: no information
    # 1 % positives: a sharded pair could match by chance.
    assert ib.label_bits(random.Random(0).sample([b"0"] * 507 + [b"1"] * 5, 512)) == 0.0
    # Sorted by class, or repeating: every shard of an unshuffled dataset reads the same.
    assert ib.label_bits(sorted(shuffled)) == 0.0
    assert ib.label_bits([bytes([i % 10]) for i in range(512)]) == 0.0
    keys = []
    ib.add_labels([[1, 0, 1]], hashlib.blake2b(digest_size=8), keys)
    assert keys == [(1).to_bytes(8, "little"), (0).to_bytes(8, "little"),
                    (1).to_bytes(8, "little")]
