"""--strategy horovod: 2 real ranks over gloo on 127.0.0.1, each launch bounded by a timeout.

The numbers come from the tiny MLP (tests/tiny_models.py): with its `tiny_stream`
input, MirroredStrategy hands replica r the batches r, r+2, ... of one pipeline and
Horovod rank r reads the same batches, so 2 ranks must reach mirrored's weights.
"""
import glob
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tiny_models
from conftest import make_config
from estimator_dist.distribute import horovod as hvd_lib
from estimator_dist.launch import supervisor as launcher
from estimator_dist.launch import cluster as cluster_launch
from estimator_dist.training import plan as plan_lib
from estimator_dist.training import run as runner
from estimator_dist.errors import UserError
from support import REPO, Run, alive, checkpoint_steps, environment, run_cli, wait_for

import horovod_inputs  # noqa: F401 - registers tiny_stream, uneven, crash_once

needs_horovod = pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                                   reason="Horovod is not installed (make horovod)")

TESTS = os.path.join(REPO, "tests")
LAUNCH_TIMEOUT = 150
TINY = ["--import", "horovod_inputs", "--model", "tiny_v1", "--batch_size", "8", "--seed", "1",
        "--eval_steps", "1"]
NOT_INSTALLED = ("estimator-dist: error: --strategy horovod: Horovod is not installed; install "
                 "it with `make horovod` or `HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 "
                 "HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 "
                 "HOROVOD_CPU_OPERATIONS=gloo pip install --no-build-isolation horovod==0.28.1` "
                 "(TensorFlow first), or choose another --strategy")


@pytest.fixture
def ranks_env(monkeypatch, tmp_path):
    """Ranks import tests/horovod_inputs.py; their scratch dirs go to a TMPDIR we can inspect."""
    monkeypatch.setenv("PYTHONPATH",
                       os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    return scratch


def launch(model_dir, *args, workers=2, timeout=LAUNCH_TIMEOUT):
    return Run(["--launcher", "horovod", "--workers", str(workers), "--model_dir", str(model_dir)]
               + TINY + [str(a) for a in args], timeout=timeout)


def train_in_process(model_dir, steps, strategy="none", n=1, **flags):
    return tiny_models.train(model_dir, "tiny_v1", strategy=strategy, n=n, steps=steps,
                             batch_size=8, input="tiny_stream", **flags)


def tiny_forward(weights, x):
    hidden = np.tanh(x @ weights["dense/kernel"] + weights["dense/bias"])
    return hidden @ weights["logits/kernel"] + weights["logits/bias"]


@needs_horovod
def test_two_ranks_match_mirrored_write_from_rank_0_and_resume_at_the_target(
        ranks_env, tmp_path):
    model_dir = tmp_path / "hvd"
    run = launch(model_dir, "--input", "tiny_stream", "--train_steps", 4,
                 "--save_checkpoints_steps", 2, "--summary_json", tmp_path / "summary.json")
    assert run.wait() == 0, run.text
    assert "[rank:0] model tiny_v1 | input tiny_stream | strategy horovod on rank 0 of 2, " \
           "1 CPU(s) each | global batch 8 = 4 x 2 replica(s)" in run.text
    assert not [line for line in run.lines if line.startswith("[rank:1]")], run.text  # quiet

    # Same global batch, same examples per replica: the weights of mirrored on 2 devices.
    mirrored = train_in_process(tmp_path / "mirrored", 4, "mirrored", 2,
                                save_checkpoints_steps=2)
    tiny_models.assert_same_weights(tiny_models.weights(model_dir),
                                    tiny_models.weights(tmp_path / "mirrored"))

    # CPU ranks all-reduce a step's gradients in one group (Horovod's own: one per gradient).
    graph = (model_dir / "graph.pbtxt").read_text()
    assert 'op: "HorovodGroupedAllreduce"' in graph and 'op: "HorovodAllreduce"' in graph

    # Rank 0 alone writes: one events file, one eval dir, its checkpoints, its export.
    assert checkpoint_steps(model_dir) == [0, 2, 4]
    assert len(glob.glob(str(model_dir / "events.out.tfevents.*"))) == 1
    assert len(glob.glob(str(model_dir / "eval" / "events.out.tfevents.*"))) == 1
    assert os.listdir(ranks_env) == []  # rank 1's scratch model_dir is gone
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["num_workers"] == 2 and summary["global_step"] == 4
    assert summary["metrics"]["loss"] == pytest.approx(mirrored["metrics"]["loss"], abs=1e-5)

    # The export loads on one CPU, without Horovod, and computes the trained network.
    export = glob.glob(str(model_dir / "export" / "final" / "*"))[0]
    serve = tf.saved_model.load(export).signatures["serving_default"]
    logits = serve(x=tf.constant(tiny_models.X))["logits"].numpy()
    np.testing.assert_allclose(logits, tiny_forward(tiny_models.weights(model_dir), tiny_models.X),
                               atol=1e-5)

    # The same command again: the checkpoint is at the target. Rank 1 must not enter
    # training alone (horovod#346, #1581): both end cleanly, rank 0 evaluates.
    again = launch(model_dir, "--input", "tiny_stream", "--train_steps", 4,
                   "--save_checkpoints_steps", 2)
    assert again.wait() == 0, again.text
    assert "[rank:0] resuming from the checkpoint at step 4" in again.text
    assert "[rank:0] done: step 4  accuracy" in again.text
    assert "exited with code" not in again.text and "Traceback" not in again.text, again.text

    # Horovod -> none: the checkpoint resumes on one device.
    assert train_in_process(model_dir, 6, save_checkpoints_steps=2)["global_step"] == 6


@needs_horovod
def test_none_checkpoint_resumes_under_horovod_like_mirrored(ranks_env, tmp_path):
    first = tmp_path / "none"
    train_in_process(first, 3, save_checkpoints_steps=3)
    shutil.copytree(first, tmp_path / "mirrored")
    shutil.copytree(first, tmp_path / "hvd")
    train_in_process(tmp_path / "mirrored", 6, "mirrored", 2, save_checkpoints_steps=3)
    # Rank 1 starts in an empty scratch dir: step and weights must come from rank 0.
    run = launch(tmp_path / "hvd", "--input", "tiny_stream", "--train_steps", 6,
                 "--save_checkpoints_steps", 3, "--export", "none")
    assert run.wait() == 0, run.text
    assert "[rank:0] resuming from the checkpoint at step 3" in run.text
    assert checkpoint_steps(tmp_path / "hvd")[-1] == 6
    tiny_models.assert_same_weights(tiny_models.weights(tmp_path / "hvd"),
                                    tiny_models.weights(tmp_path / "mirrored"))


@needs_horovod
def test_ranks_whose_inputs_end_at_different_steps_stop_together(ranks_env, tmp_path,
                                                                  monkeypatch):
    """Rank 0 has 7 examples (2 batches of 4), rank 1 has 16 (4 batches) (horovod#182)."""
    monkeypatch.setenv("UNEVEN_SPLIT", "7")
    model_dir = tmp_path / "run"
    run = launch(model_dir, "--input", "uneven", "--train_steps", 100, "--max_restarts", 0,
                 timeout=90)
    assert run.wait() == 0, run.text
    assert "[rank:0] an input shard ran out at step 2: every rank stops there" in run.text
    assert "[rank:0] done: step 2  accuracy" in run.text
    assert checkpoint_steps(model_dir)[-1] == 2
    assert "exited with code" not in run.text, run.text


@needs_horovod
def test_a_dead_rank_restarts_the_job_from_the_last_checkpoint(ranks_env, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("CRASH_MARKER", str(tmp_path / "crashed"))
    # Rank 1 reads its 15th batch a few steps ahead of training (prefetching): after step 5.
    monkeypatch.setenv("CRASH_AT", "14")
    model_dir = tmp_path / "run"
    run = launch(model_dir, "--input", "crash_once", "--train_steps", 20,
                 "--save_checkpoints_steps", 5, "--max_restarts", 1, "--export", "none")
    assert run.wait() == 0, run.text
    assert os.path.exists(tmp_path / "crashed")
    assert ("[launcher] rank:1 exited with code -9; restarting the whole cluster from the last "
            "checkpoint (restart 1/1)") in run.text
    resumed = re.search(r"\[rank:0\] resuming from the checkpoint at step (\d+)", run.text)
    assert resumed and int(resumed.group(1)) >= 5, run.text
    assert checkpoint_steps(model_dir)[-1] == 20


@needs_horovod
def test_early_stop_is_rank_0s_decision_and_every_rank_stops_with_it(ranks_env, tmp_path):
    model_dir = tmp_path / "run"
    run = launch(model_dir, "--input", "tiny_stream", "--train_steps", 20000, "--eval_every", 20,
                 "--early_stop", "loss", "--patience", 2, "--set", "learning_rate=0.0",
                 "--weights_check_steps", 0,  # frozen on purpose: the plateau
                 "--max_restarts", 0, "--export", "none")
    assert run.wait() == 0, run.text
    assert re.search(r"\[rank:0\] early stop at step \d+: loss has not improved",
                     run.text), run.text
    assert checkpoint_steps(model_dir)[-1] < 200
    assert "exited with code" not in run.text, run.text


@needs_horovod
def test_sigterm_to_any_rank_stops_every_rank_at_one_step_and_rank_0_saves_it(ranks_env, tmp_path):
    """SIGTERM to rank 1 (a scheduler taking one node): every rank stops after the same step,
    voted inside the step's all-reduce; rank 0 saves it, every rank exits 143, the launcher
    restarts them and they resume from it. Then SIGTERM to the launcher (the whole job
    preempted) saves the step the ranks stop at too: a rank > 0 used to leave at once, rank
    0's step in flight failed and nothing was saved; and a rank 0 that saved alone made rank
    1's step fail (Horovod shut down), whose exit 1 stopped the cluster when seen first."""
    model_dir = tmp_path / "run"
    run = launch(model_dir, "--input", "tiny_stream", "--train_steps", 10 ** 7,
                 "--save_checkpoints_steps", 10 ** 6, "--max_restarts", 1)
    saved_line = (r"^\[rank:0\] estimator-dist: preempted: SIGTERM{} at step (\d+): every worker "
                  r"stopped there \(\d got SIGTERM\); saved (\S+)/model\.ckpt-(\d+); exit code 143 "
                  r"\(retryable\)")
    try:
        wait_for(run, r"^\[rank:0\] step \d+/")
        os.kill(run.pid_of("rank:1"), signal.SIGTERM)
        saved, _ = wait_for(run, saved_line.format(" to another worker"))
        step = int(saved.group(1))
        assert saved.group(2) == str(model_dir) and int(saved.group(3)) == step > 0
        assert step in checkpoint_steps(model_dir)
        _, resumed = wait_for(run, rf"^\[rank:0\] resuming from the checkpoint at step {step} in ")
        wait_for(run, r"^\[rank:0\] step \d+/", start=resumed)
        pids = [run.pid_of("rank:0"), run.pid_of("rank:1")]  # the restarted ones
        assert all(pids) and all(alive(p) for p in pids), run.text
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait() == 143, run.text
        assert not [p for p in pids if alive(p)], run.text  # waited for by the launcher
        final, _ = wait_for(run, saved_line.format("(?: to another worker)?"), start=resumed)
        assert int(final.group(1)) > step and int(final.group(1)) in checkpoint_steps(model_dir)
        assert "a permanent failure" not in run.text and "shut down" not in run.text, run.text
        assert "uncaught exception" not in run.text, run.text  # Horovod's C++ log: --verbose only
    finally:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            run.proc.wait(60)
    # The ranks' exits skip Python's exit handlers: rank 1's scratch model_dir and autograph's
    # files were left behind.
    assert os.listdir(ranks_env) == []


@needs_horovod
def test_one_rank_outside_a_launcher_equals_none(tmp_path):
    lines = []
    config = make_config("tiny_v1", train_steps=3, strategy="horovod",
                         model_dir=str(tmp_path / "hvd"), batch_size=7, export="none", seed=1,
                         eval_steps=1, save_checkpoints_steps=3)
    runner.train(config, out=lines.append)
    assert "strategy horovod on rank 0 of 1 (not started by a Horovod launcher: one process)" \
        in lines[0]
    tiny_models.train(tmp_path / "none", "tiny_v1", steps=3)
    tiny_models.assert_same_weights(tiny_models.weights(tmp_path / "hvd"),
                                    tiny_models.weights(tmp_path / "none"), atol=1e-6)


def test_gradient_groups_one_on_a_cpu_rank_horovods_own_on_a_gpu_rank_or_the_users():
    assert hvd_lib.gradient_groups({}, gpus=0) == 1
    assert hvd_lib.gradient_groups({}, gpus=1) is None
    assert hvd_lib.gradient_groups({hvd_lib.GROUPS_VARIABLE: "0"}, gpus=0) is None
    assert hvd_lib.gradient_groups({hvd_lib.GROUPS_VARIABLE: "3"}, gpus=1) == 3
    for bad in ("-1", "one", ""):
        with pytest.raises(UserError, match=f"^ESTIMATOR_DIST_HOROVOD_GROUPS={bad}: must be a "
                                            "whole number, 0 or more"):
            hvd_lib.gradient_groups({hvd_lib.GROUPS_VARIABLE: bad}, gpus=0)


@needs_horovod
def test_a_bad_groups_value_is_one_line_exit_2(tmp_path):
    """As a user types it: the variable set wrong, `estimator-dist train --strategy horovod`."""
    done = run_cli("train", "--model", "digits", "--strategy", "horovod", "--train_steps", 2,
                   "--model_dir", "run", cwd=tmp_path,
                   env=environment(REPO, ESTIMATOR_DIST_HOROVOD_GROUPS="two"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "estimator-dist: error: ESTIMATOR_DIST_HOROVOD_GROUPS=two: must be a whole number, 0 or "
        "more (0: Horovod's own all-reduce per gradient, N: N grouped all-reduces a step); unset "
        "it for the default"]
    assert not (tmp_path / "run").exists()


NO_PREDICTIONS_MODEL = """
import tensorflow as tf
import estimator_dist as ed


@ed.register_model("no_predictions", hparams={"optimizer": "sgd", "learning_rate": 0.01},
                   default_input="digits")
def no_predictions(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(tf.compat.v1.layers.flatten(features["image"]), 10)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    # no PREDICT branch: the infer graph rank 0 checks before training has no predictions
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=ed.minimize(loss, params))
"""


@needs_horovod
def test_a_model_rank_0_refuses_ends_every_rank_in_one_line_each(tmp_path):
    """Rank 0 refuses the model before training (exit 2); rank 1, waiting for rank 0's
    resume step, used to die of Horovod's shutdown with a 40-line traceback."""
    (tmp_path / "my_models.py").write_text(NO_PREDICTIONS_MODEL)
    done = run_cli("cluster", "--launcher", "horovod", "--workers", 2, "--import", "my_models",
                   "--model", "no_predictions", "--train_steps", 20, "--model_dir", "run",
                   cwd=tmp_path, timeout=LAUNCH_TIMEOUT)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Traceback" not in out, out
    assert "[rank:0] estimator-dist: error: model 'no_predictions' could not build its infer " \
           "graph: " in out, out
    rank_1 = [line for line in out.splitlines() if line.startswith("[rank:1]")]
    assert all(line.startswith("[rank:1] estimator-dist: error: training stopped before its "
                               "first step: another Horovod rank ended (Horovod has been shut "
                               "down; its own line says why)") for line in rank_1), out


class FakeHorovod:
    """hvd as init() uses it: what HOROVOD_CYCLE_TIME held when hvd.init() ran."""

    def __init__(self):
        self.cycle_time = None

    def init(self):
        self.cycle_time = os.environ.get("HOROVOD_CYCLE_TIME")

    rank = local_rank = staticmethod(lambda: 0)
    size = local_size = staticmethod(lambda: 1)


@pytest.mark.parametrize("users,seen", [(None, hvd_lib.CYCLE_TIME_MS), ("5", "5")])
def test_init_gives_horovod_the_projects_cycle_time_unless_the_user_set_one(monkeypatch, users,
                                                                             seen):
    fake = FakeHorovod()
    monkeypatch.setattr(hvd_lib, "require", lambda: fake)
    monkeypatch.setattr(hvd_lib, "pin_gpu", lambda ranks: None)
    for name in hvd_lib.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if users is None:
        monkeypatch.delenv("HOROVOD_CYCLE_TIME", raising=False)
    else:
        monkeypatch.setenv("HOROVOD_CYCLE_TIME", users)
    monkeypatch.delenv(hvd_lib.GROUPS_VARIABLE, raising=False)
    assert hvd_lib.init().size == 1 and fake.cycle_time == seen
    monkeypatch.setenv(hvd_lib.GROUPS_VARIABLE, "x")
    with pytest.raises(UserError, match="ESTIMATOR_DIST_HOROVOD_GROUPS=x"):
        hvd_lib.init()


def test_not_installed_is_one_line_exit_2(tmp_path, monkeypatch):
    block = "import sys; sys.modules['horovod'] = None; from estimator_dist.cli.main import main; "
    argv = ["train", "--strategy", "horovod", "--model_dir", str(tmp_path / "r")]
    proc = subprocess.run([sys.executable, "-c", block + f"sys.exit(main({argv!r}))"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == NOT_INSTALLED
    assert not (tmp_path / "r").exists()
    from estimator_dist.launch import horovod as horovod_launch

    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)
    with pytest.raises(UserError) as e:  # cluster --launcher horovod, before any rank starts
        horovod_launch.launch(["--strategy", "horovod"], 2, False, 0, 10)
    assert "estimator-dist: error: " + str(e.value) == NOT_INSTALLED


@pytest.mark.parametrize("environ,message", [
    ({"HOROVOD_RANK": "1"}, "the environment sets HOROVOD_RANK but not HOROVOD_SIZE, "
                            "HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE"),
    ({"HOROVOD_RANK": "2", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0",
      "HOROVOD_LOCAL_SIZE": "2"},
     "HOROVOD_RANK=2 with HOROVOD_SIZE=2: the rank must be in 0..size-1"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0",
      "HOROVOD_LOCAL_SIZE": "2"}, "HOROVOD_SIZE=2 but HOROVOD_GLOO_RENDEZVOUS_ADDR is not set"),
    ({"HOROVOD_RANK": "x", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0",
      "HOROVOD_LOCAL_SIZE": "2"}, "HOROVOD_RANK='x': must be a whole number"),
])
def test_partial_or_wrong_horovod_environment(environ, message):
    with pytest.raises(UserError) as e:
        hvd_lib.check_environment(environ)
    assert str(e.value).startswith(message)
    assert hvd_lib.check_environment({}) is False


@pytest.mark.parametrize("command,launcher_name,args,message", [
    ("cluster", "horovod", ["--strategy", "mirrored"],
     "--launcher horovod runs --strategy horovod, got --strategy mirrored"),
    ("cluster", "tf_config", ["--strategy", "horovod"],
     "--launcher tf_config --strategy horovod: Horovod ranks are started by --launcher horovod"),
    ("tfjob", None, ["--strategy=horovod"], "tfjob --strategy horovod: a TFJob runs TF_CONFIG"),
])
def test_launcher_and_strategy_must_agree(command, launcher_name, args, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(")):
        cluster_launch.train_args_for(command, launcher_name, args)


def test_launcher_shapes_and_flags():
    assert cluster_launch.train_args_for("cluster", "horovod", ["--model", "x"]) == [
        "--model", "x", "--strategy", "horovod"]
    assert cluster_launch.train_args_for("cluster", None, ["--strategy", "horovod"]) == [
        "--strategy", "horovod"]
    with pytest.raises(UserError, match="^--ps 1: Horovod has no parameter servers"):
        cluster_launch.check_shape(2, 1, "horovod")
    from estimator_dist.launch import horovod as horovod_launch

    with pytest.raises(UserError, match="^--evaluator: under --launcher horovod rank 0 evaluates"):
        horovod_launch.launch(["--strategy", "horovod"], 2, True, 0, 10)


def test_strategy_checks(monkeypatch):
    from estimator_dist.distribute import tf_config as cluster

    with pytest.raises(UserError, match="^--strategy horovod runs one device per rank, got "
                                        "--num_devices 2"):
        hvd_lib.devices(2)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["127.0.0.1:1"]}, '
                                    '"task": {"type": "chief", "index": 0}}')
    with pytest.raises(UserError, match="^--strategy horovod does not use TF_CONFIG"):
        cluster.from_env("horovod")


def test_plan_of_rank_1_of_2(monkeypatch):
    """Global batch split over the ranks, --scale_lr by their number, rank 1 writes nothing."""
    monkeypatch.setattr(hvd_lib, "init", lambda: hvd_lib.Ranks(rank=1, size=2, local_rank=1,
                                                              local_size=2, launched=True))
    p = plan_lib.plan(make_config("tiny_v1", strategy="horovod", batch_size=8, scale_lr=True))
    assert (p.role.kind, p.writes_run_files, p.num_workers, p.per_replica_batch) == ("worker", False,
                                                                                2, 4)
    assert p.params()["lr_scale"] == 2.0 and p.params()["num_replicas"] == 2
    with pytest.raises(UserError, match="^--batch_size 7 is not divisible by the 2 replicas of "
                                        "--strategy horovod"):
        plan_lib.plan(make_config("tiny_v1", strategy="horovod", batch_size=7))


def test_rerunning_a_finished_run_evaluates(tmp_path):
    """What rank 0 does when the checkpoint is at the target (Estimator skips training)."""
    first = tiny_models.train(tmp_path / "run", "tiny_v1", steps=3)
    again = tiny_models.train(tmp_path / "run", "tiny_v1", steps=3)
    assert again["start_step"] == 3 and again["global_step"] == 3
    assert again["metrics"] == first["metrics"]
