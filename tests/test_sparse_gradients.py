"""Sparse gradients (tf.IndexedSlices) under the strategies that all-reduce them: embedding,
categorical and linear feature columns of canned Estimators, and a TF1 model_fn's own gather
with its own MomentumOptimizer (sparse_gradients.py). Every run equals one device."""
import numpy as np
import pytest
import tensorflow as tf

from canned_models import census_rows
from conftest import make_config
from estimator_dist.distribute import sparse_gradients, strategies
from estimator_dist.errors import op_error_line
from estimator_dist.training import run as runner
from support import TESTS, Run, environment, run_cli
from tiny_models import assert_same_weights, weights

ENV = environment(TESTS)
CENSUS = ["--import", "canned_models", "--model", "census_wide_deep", "--batch_size", "16",
          "--seed", "1", "--eval_steps", "2", "--train_steps", "6", "--export", "none"]


def train_in_process(model_dir, strategy="none", n=1, steps=4):
    config = make_config("embedding_momentum", (), train_steps=steps, strategy=strategy,
                         num_devices=n, model_dir=str(model_dir), batch_size=12, export="none",
                         seed=1, eval_steps=1, save_checkpoints_steps=steps)
    return runner.train(config, out=lambda *_: None)


@pytest.mark.parametrize("across_workers", [False, True], ids=["one_device_sum", "dense_sum"])
def test_a_gather_with_its_own_momentum_train_op_under_mirrored_equals_one_device(
        across_workers, tmp_path, monkeypatch):
    """Each batch touches a different number of table rows: TensorFlow's collective gather
    aborted at step 2. Both reductions (mirrored's, and multi_worker_mirrored's through the
    dense sum, here over 2 devices of one process) apply the sparse update one device does:
    Momentum leaves rows no replica touched where they are."""
    monkeypatch.setitem(strategies._BUILDERS, "mirrored", lambda devices: (
        sparse_gradients.reduce_exactly(tf.distribute.MirroredStrategy(list(devices.names)),
                                        across_workers=across_workers)))
    train_in_process(tmp_path / "one")
    summary = train_in_process(tmp_path / "two", "mirrored", 2)
    assert summary["global_step"] == 4
    expected, got = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert_same_weights(got, expected)
    # Rows the first step touches and the next three do not: a dense Momentum update
    # would go on moving them, and the weights above would differ.
    ids = np.random.RandomState(0).randint(0, 50, size=(96, 3))
    assert set(ids[:12].ravel()) - set(ids[12:48].ravel())


@pytest.fixture(scope="module")
def census(tmp_path_factory):
    """adult.data and a one-process run of the canned wide & deep model on it."""
    root = tmp_path_factory.mktemp("census")
    (root / "adult.data").write_text(census_rows(96))
    done = run_cli("train", *CENSUS, "--input", "census_sharded", "--data_path",
                   root / "adult.data", "--model_dir", root / "one", env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return root


def trained(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def assert_equal_runs(got_dir, expected_dir):
    expected, got = trained(expected_dir), trained(got_dir)
    assert sorted(got) == sorted(expected) and int(got["global_step"]) == 6
    for name in expected:  # Adagrad's accumulators reach hundreds: a relative tolerance
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("strategy", ["mirrored", "central_storage"])
def test_a_canned_wide_and_deep_model_trains_like_one_device(strategy, census, tmp_path):
    """Embedding, hashed, crossed and linear columns; canned Estimators' Keras optimizers.
    mirrored failed at step 2 (collective shape mismatch), central_storage before its first
    (the Saver saw each Adagrad accumulator twice) with a traceback."""
    done = run_cli("train", *CENSUS, "--input", "census_sharded", "--data_path",
                   census / "adult.data", "--model_dir", tmp_path / strategy, "--strategy",
                   strategy, "--num_devices", "2", env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "done: step 6" in done.stdout
    assert_equal_runs(tmp_path / strategy, census / "one")


@pytest.mark.timeout(900)
def test_a_canned_wide_and_deep_model_on_a_two_worker_cluster_equals_one_process(
        census, tmp_path):
    """multi_worker_mirrored over two processes, each reading its shard of the lines."""
    run = Run([*CENSUS, "--input", "census_sharded", "--data_path", census / "adult.data",
               "--model_dir", tmp_path / "cluster", "--workers", "2", "--strategy",
               "multi_worker_mirrored"], cwd=str(tmp_path), env=ENV, timeout=600)
    try:
        assert run.wait() == 0, run.text[-3000:]
    finally:
        run.stop()
    assert "Traceback" not in run.text and "[chief:0] done: step 6" in run.text
    assert_equal_runs(tmp_path / "cluster", census / "one")


def test_a_multi_worker_error_line_keeps_its_cause():
    """TensorFlow starts a peer's error with the task it came from: the line kept only that."""
    error = tf.errors.InvalidArgumentError(None, None, (
        "From /job:chief/replica:0/task:0:\nCollective ops is aborted by: Shape mismatch in "
        "the collective instance 116.\n\t [[{{node CollectiveGatherV2}}]]"))
    assert op_error_line(error) == \
        "Collective ops is aborted by: Shape mismatch in the collective instance 116."
