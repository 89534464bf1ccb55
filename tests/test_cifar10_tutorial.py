"""TensorFlow's cifar10_estimator tutorial (examples/cifar10_estimator/), migrated as a user
would: its loss tensor named `loss`, its TFRecords input without prepare(), its tensor input,
its momentum optimizer with a piecewise schedule, run through the CLI from a fresh folder."""
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

from support import REPO, Run, checkpoint_steps, environment, run_cli

EXAMPLE = os.path.join(REPO, "examples", "cifar10_estimator")
sys.path.insert(0, EXAMPLE)
import cifar10  # noqa: E402  the example's own module: it writes records in the tutorial's format

# A ResNet-8 four filters wide on 32x32x3 records: a step takes milliseconds.
TUTORIAL = ["--import", "cifar10_main", "--seed", "1", "--export", "none"]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Synthetic CIFAR-10 records in the tutorial's format (train/validation/eval.tfrecords)."""
    return cifar10.write_synthetic(str(tmp_path_factory.mktemp("cifar10_data")), examples=32)


def train(tmp_path, records, *args, timeout=300):
    """`estimator-dist train` of the tutorial's model from a fresh folder, as a user runs it."""
    return run_cli("train", *TUTORIAL, "--data_dir", records, *args, cwd=str(tmp_path),
                   env=environment(EXAMPLE), timeout=timeout)


def test_a_learning_rate_of_0_is_caught_though_the_loss_tensor_is_named_loss(tmp_path, records):
    done = train(tmp_path, records, "--model", "cifar10_resnet_own_train_op",
                 "--set", "learning_rate=0.0", "--train_steps", "6", "--model_dir", "run")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no trainable variable changed" in done.stderr and "learning rate" in done.stderr
    assert "Traceback" not in done.stderr
    assert not os.path.exists(tmp_path / "run")


def test_the_progress_line_shows_the_spec_loss_of_a_tensor_named_loss(tmp_path, records):
    done = train(tmp_path, records, "--model", "cifar10_resnet_own_train_op",
                 "--train_steps", "4", "--model_dir", "run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"step 4/4  loss \d+\.\d{4}", done.stdout), done.stdout


@pytest.mark.parametrize("strategy", ["none", "tower"])
def test_the_tutorials_tensor_input_trains_where_estimator_takes_tensors(strategy, tmp_path,
                                                                         records):
    done = train(tmp_path, records, "--input", "cifar10_batch_tensors", "--strategy", strategy,
                 "--num_devices", "2" if strategy == "tower" else "1", "--train_steps", "3",
                 "--eval_steps", "1", "--model", "cifar10_resnet", "--model_dir", "run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert checkpoint_steps(tmp_path / "run")[-1] == 3


def test_the_tutorials_tensor_input_is_one_line_under_a_distribution_strategy(tmp_path, records):
    done = train(tmp_path, records, "--input", "cifar10_batch_tensors", "--strategy", "mirrored",
                 "--num_devices", "2", "--train_steps", "3", "--model",
                 "cifar10_resnet_own_train_op", "--model_dir", "run")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    # The EVAL graph is built before the first step, so the eval call may be the first seen.
    assert re.search(r"input 'cifar10_batch_tensors' returned tensors, not a tf\.data\.Dataset, "
                     r"from its (train|eval) call: --strategy mirrored distributes datasets only",
                     done.stderr), done.stderr
    assert not os.path.exists(tmp_path / "run")  # no config.yaml, nothing


def trained_variables(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith("resnet/") and "Momentum" not in name}


# Batch norm in inference mode (per-replica batch statistics would differ from one device's),
# no random crops; 32 examples of global batch 16: the schedule steps down after steps 2 and 4.
EXACT = ["--model", "cifar10_resnet", "--train_steps", "6", "--eval_steps", "1",
         "--set", "batch_norm_training=false", "--set", "use_distortion=false",
         "--set", "examples_per_epoch=32", "--set", "boundary_epochs=1,2",
         "--set", "learning_rate=0.05"]


@pytest.fixture(scope="module")
def one_device(tmp_path_factory, records):
    """The tutorial's model trained by EXACT on one device: its variables, for every case."""
    folder = tmp_path_factory.mktemp("one_device")
    one = train(folder, records, *EXACT, "--batch_size", "16", "--model_dir", "one")
    assert one.returncode == 0, one.stdout + one.stderr
    return trained_variables(folder / "one")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy, flags", [
    ("tower", ["--strategy", "tower", "--num_devices", "2", "--batch_size", "16"]),
    ("mirrored", ["--strategy", "mirrored", "--num_devices", "2", "--batch_size", "16"]),
    ("accumulation", ["--accumulate_steps", "2", "--batch_size", "8"]),
])
def test_the_tutorials_momentum_and_piecewise_schedule_equal_one_device(strategy, flags,
                                                                         tmp_path, records,
                                                                         one_device):
    many = train(tmp_path, records, *EXACT, *flags, "--model_dir", "many")
    assert many.returncode == 0, many.stdout + many.stderr
    expected, got = one_device, trained_variables(tmp_path / "many")
    assert sorted(expected) == sorted(got) and len(expected) > 10
    worst = max(float(np.max(np.abs(expected[k] - got[k]))) for k in expected)
    assert worst < 2e-5, (strategy, worst)


def cluster(tmp_path, records, *args, timeout=540):
    """`estimator-dist cluster` of the tutorial's model, its ResNet cut to the first conv (the
    input is what these runs are about; a loaded machine builds every task's graph)."""
    return Run(["--import", "cifar10_main", "--model", "cifar10_resnet", "--data_dir", records,
                "--seed", "1", "--export", "none", "--batch_size", "8", "--set", "num_layers=2",
                *args],
               cwd=str(tmp_path), env=environment(EXAMPLE), timeout=timeout)


@pytest.mark.timeout(600)
def test_a_tfrecord_input_without_prepare_trains_under_multi_worker_mirrored(tmp_path, records):
    run = cluster(tmp_path, records, "--workers", "2", "--strategy", "multi_worker_mirrored",
                  "--train_steps", "3", "--model_dir", "run")
    try:
        assert run.wait() == 0, run.text
    finally:
        run.stop()
    assert checkpoint_steps(tmp_path / "run")[-1] == 3
    assert "[chief:0] features are one tensor, not a dict: SavedModels take it as serving " \
           "input 'input' [32, 32, 3] float32" in run.text  # read off the training dataset
    assert "Collective ops must be configured" not in run.text and "restarting" not in run.text


@pytest.mark.timeout(600)
def test_a_parameter_server_run_ends_with_done_lines_not_preemptions(tmp_path, records):
    run = cluster(tmp_path, records, "--workers", "2", "--ps", "1", "--strategy",
                  "parameter_server", "--train_steps", "4", "--model_dir", "run")
    try:
        assert run.wait() == 0, run.text
    finally:
        run.stop()
    # "code 143": the exit code as a task and the launcher say it ("143" alone was in a port).
    assert "preempted" not in run.text and "code 143" not in run.text, run.text
    # The ps never ends by itself; a worker may have ended its own training before the chief.
    for task in ("ps:0", "worker:0"):
        stopped = re.search(rf"\[{task}\] estimator-dist: done: the chief finished the run at "
                            rf"step \d+; {task} stopped with it", run.text)
        assert stopped or task == "worker:0", run.text


FAILING_STEP = '''
import tensorflow as tf
import estimator_dist as ed


@ed.register_model("failing_step", default_input="digits")
def failing_step(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(tf.compat.v1.layers.flatten(features["image"]), 10)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    check = tf.debugging.assert_less(loss, -1.0, message="a loss below -1 expected")
    with tf.control_dependencies([check]):
        loss = tf.identity(loss)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=ed.minimize(loss, params))
'''


@pytest.mark.timeout(600)
def test_a_task_whose_steps_fail_ends_the_cluster_at_once_without_a_restart(tmp_path):
    (tmp_path / "failing.py").write_text(FAILING_STEP)
    run = Run(["--import", "failing", "--model", "failing_step", "--workers", "2", "--ps", "1",
               "--strategy", "parameter_server", "--train_steps", "5", "--export", "none",
               "--model_dir", "run"], cwd=str(tmp_path), env=environment(tmp_path), timeout=540)
    try:
        assert run.wait() == 1, run.text
    finally:
        run.stop()
    assert "restarting" not in run.text, run.text
    assert re.search(r"\[launcher\] (chief|worker):0 exited with code 1, a permanent failure "
                     r"\(1-127: a restart would repeat it\); stopping the cluster\. Its last "
                     r"line: estimator-dist: error: training failed at step", run.text), run.text
    assert len(re.findall(r"started chief:0", run.text)) == 1
