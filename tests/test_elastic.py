"""Issue 24 through the CLI, as a user runs it: a stopped run resumed (on one process, and
on another worker count) ends with the weights of a run that never stopped."""
import numpy as np
import tensorflow as tf

from support import Run, latest_step, run_cli

# SGD, an MLP without dropout or batch norm, a constant learning rate: the same examples
# in the same steps give the same weights.
EXACT = ["--model", "tabular", "--seed", "1", "--set", "optimizer=sgd", "--set",
         "learning_rate=0.05", "--export", "none"]
TOLERANCE = 1e-4


def weights(model_dir):
    """{name: array} of the latest checkpoint's variables but the step."""
    reader = tf.train.load_checkpoint(str(model_dir))
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(str(model_dir))
            if name != "global_step"}


def max_abs_difference(a_dir, b_dir):
    a, b = weights(a_dir), weights(b_dir)
    assert sorted(a) == sorted(b) and a
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def train(model_dir, steps, *flags):
    proc = run_cli("train", *EXACT, "--model_dir", str(model_dir), "--train_steps", str(steps),
                   *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_a_resumed_run_continues_the_stream_at_the_next_example(tmp_path):
    """`train` stopped at 12 and run again to 24 is the run that went to 24 at once."""
    train(tmp_path / "straight", 24, "--batch_size", "32")
    train(tmp_path / "stopped", 12, "--batch_size", "32")
    proc = train(tmp_path / "stopped", 24, "--batch_size", "32")
    assert "resuming from the checkpoint at step 12" in proc.stdout
    assert latest_step(tmp_path / "stopped") == 24
    assert max_abs_difference(tmp_path / "straight", tmp_path / "stopped") <= TOLERANCE


def test_two_workers_stopped_at_60_resumed_on_three_equal_one_process(tmp_path):
    """multi_worker_mirrored 2 workers to step 60, then 3 workers to 120, from one model_dir,
    ends where one process training 120 steps on the same global batch does."""
    batch = ["--batch_size", "24"]
    elastic = str(tmp_path / "elastic")
    for workers, steps in (("2", "60"), ("3", "120")):
        run = Run(["--workers", workers, "--strategy", "multi_worker_mirrored", *EXACT, *batch,
                   "--train_steps", steps, "--model_dir", elastic], timeout=600)
        assert run.wait() == 0, run.text
    assert "resuming from the checkpoint at step 60" in run.text
    assert "global batch 24 = 8 x 3 replica(s)" in run.text
    train(tmp_path / "one", 120, *batch, "--strategy", "none")
    assert latest_step(elastic) == 120
    difference = max_abs_difference(elastic, tmp_path / "one")
    print(f"max abs difference after 120 steps (2 -> 3 workers vs one process): {difference:.3g}")
    assert difference <= TOLERANCE


def test_a_worker_count_that_does_not_keep_the_global_batch_is_one_line(tmp_path):
    proc = run_cli("cluster", "--workers", "5", "--model", "tabular", "--batch_size", "24",
                   "--model_dir", tmp_path / "run", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (
        "estimator-dist: error: --batch_size 24 is not divisible by the 5 replicas of "
        "--strategy multi_worker_mirrored; use a multiple of 5 (e.g. 25), or keep --batch_size "
        "24 with --workers 1, 2, 3, 4, 6, 8 or 12\n")
