"""Issue 24's elastic launcher, as a user runs it: `cluster --discovery` follows a slots file
edited during the run, drops a worker killed by PID, waits below --min_workers, and a run
that went 3 -> 2 -> 3 workers ends with the weights of one process."""
import os
import re
import signal
import stat
import subprocess
import time

import pytest
import yaml

from estimator_dist.cli.main import main
from estimator_dist import checkpoint_files, timers
from estimator_dist.errors import UserError
from estimator_dist.launch import elastic, tfjob
from support import (REPO, Run, alive, environment, latest_step, run_cli, timers_setting,
                     wait_for)
from test_elastic import TOLERANCE, max_abs_difference

# A TF1 model_fn as users write it, with its own train_op; while the file `slow` is in the
# working directory every step also sleeps 0.1 s, so that the test can change the cluster
# mid-run (it removes the file when the run may finish). SGD, no dropout or batch norm.
USER_MODEL = '''
import os
import time

import tensorflow as tf
import estimator_dist as ed


def pause():
    if os.path.exists("slow"):
        time.sleep(0.1)
    return 0


@ed.register_model("slow_mlp", default_input="digits")
def slow_mlp(features, labels, mode, params):
    init = tf.compat.v1.glorot_uniform_initializer()
    net = tf.compat.v1.layers.flatten(tf.cast(features["image"], tf.float32))
    net = tf.compat.v1.layers.dense(net, 32, tf.nn.relu, kernel_initializer=init, name="hidden")
    logits = tf.compat.v1.layers.dense(net, 10, kernel_initializer=init, name="logits")
    predictions = {"class": tf.argmax(logits, 1)}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions=predictions)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": tf.compat.v1.metrics.accuracy(labels, predictions["class"])})
    with tf.control_dependencies([tf.py_function(pause, [], tf.int32)]):
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
'''
FLAGS = ["--import", "slow_mlp", "--model", "slow_mlp", "--seed", "1", "--batch_size", "24",
         "--export", "none"]
STEP = r"\[chief:0\] step (\d+)/"


@pytest.fixture
def user_dir(tmp_path):
    """A fresh directory with the user's model file, where the commands run; their steps
    are slow until the test calls `fast`."""
    (tmp_path / "slow_mlp.py").write_text(USER_MODEL)
    (tmp_path / "slow").touch()
    return tmp_path


def fast(user_dir):
    """The rest of the run need not leave time for changes: steps at full speed."""
    (user_dir / "slow").unlink()


def slots(path, text):
    """Rewrite the discovery file whole, as an orchestrator's script does (rename)."""
    tmp = f"{path}.new"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def reforms(run):
    return [line for line in run.lines if "] re-formed " in line]


def test_three_two_three_workers_by_discovery_equal_one_process(user_dir):
    """The discovery file goes 3 -> 2 -> 3 slots mid-run: two re-forms at the voted step (0
    steps lost), each timed, and the weights after 120 steps are one process's."""
    slots(user_dir / "slots", "localhost:3\n")
    run = Run(["--discovery", "slots", "--min_workers", "2", "--max_workers", "3", *FLAGS,
               "--train_steps", "120", "--model_dir", "elastic"], timeout=600, cwd=user_dir)
    _, i = wait_for(run, STEP)
    slots(user_dir / "slots", "localhost:2\n")
    _, i = wait_for(run, r"\[launcher\] re-formed 3 -> 2 workers at step \d+", i)
    slots(user_dir / "slots", "# hosts come back\nhost-a\nhost-b:2\n")
    wait_for(run, r"\[launcher\] re-formed 2 -> 3 workers at step \d+", i)
    fast(user_dir)
    assert run.wait() == 0, run.text
    lines = reforms(run)
    assert len(lines) == 2, run.text
    for line in lines:
        assert re.search(r"\(discovery lists [23] slots\): 0 steps lost, [\d.]+ s from the change "
                         r"to the next step \(stop and checkpoint [\d.]+ s, start [\d.]+ s; the "
                         r"first start took [\d.]+ s\)$", line), line
    steps = [int(re.search(r"at step (\d+)", line).group(1)) for line in lines]
    assert 0 < steps[0] < steps[1] < 120, lines
    assert "global batch 24 = 12 x 2 replica(s)" in run.text
    assert latest_step(user_dir / "elastic") == 120
    one = run_cli("train", *FLAGS, "--train_steps", "120", "--strategy", "none", "--model_dir",
                  "one", cwd=user_dir)
    assert one.returncode == 0, one.stdout + one.stderr
    difference = max_abs_difference(user_dir / "elastic", user_dir / "one")
    print(f"max abs difference after 120 steps (3 -> 2 -> 3 workers vs one process): "
          f"{difference:.3g}; {lines}")
    assert difference <= TOLERANCE


def test_a_worker_killed_with_no_restarts_left_drops_its_slot_then_waits(user_dir):
    """--max_restarts 0 and worker:0 killed by PID: its slot is dropped, which leaves fewer
    than --min_workers; the launcher waits (starting nothing) until a slot is added, then
    re-forms from the last checkpoint (the peers could not vote) and finishes."""
    slots(user_dir / "slots", "localhost:2\n")
    # The chief, left alone, waits out the SIGTERM deadline (it cannot vote): 8 s, not 20.
    run = Run(["--discovery", "slots", "--min_workers", "2", "--max_restarts", "0", *FLAGS,
               "--train_steps", "40", "--save_checkpoints_steps", "5", "--model_dir", "run"],
              timeout=600, cwd=user_dir,
              env=environment(**{timers.ENV: timers_setting(peer_deadline_s=8)}))
    _, i = wait_for(run, STEP)
    pid = run.pid_of("worker:0")
    os.kill(pid, signal.SIGKILL)
    _, i = wait_for(run, r"worker:0 exited with code -9 and --max_restarts 0 is used up: "
                         r"stopping every task at its next step to re-form", i)
    _, i = wait_for(run, r"\[launcher\] waiting for workers: discovery lists 2 slots \(1 "
                         r"dropped\), the smallest cluster is 2 workers; giving up in 600 s "
                         r"\(--elastic_timeout\)$", i)
    time.sleep(2)
    assert not any("started" in line for line in run.lines[i:]), run.text
    slots(user_dir / "slots", "localhost\nlocalhost\nlocalhost\n")
    fast(user_dir)
    assert run.wait() == 0, run.text
    line, = reforms(run)
    assert re.search(r"re-formed 2 -> 2 workers at step \d+ \(worker:0 exited with code -9 "
                     r"and --max_restarts 0 is used up\): \? steps lost \(the chief stopped "
                     r"without a final checkpoint\), ", line), line
    assert latest_step(user_dir / "run") == 40
    assert not alive(pid)


def test_parameter_server_workers_follow_the_slots(user_dir):
    """parameter_server: the ps task stays one, the workers go 2 -> 1 at the chief's step."""
    slots(user_dir / "slots", "localhost:2\n")
    run = Run(["--discovery", "slots", "--ps", "1", "--strategy", "parameter_server", *FLAGS,
               "--train_steps", "200", "--model_dir", "run"], timeout=600, cwd=user_dir)
    # Asynchronous: the chief's progress lines skip the steps the worker takes.
    _, i = wait_for(run, r"\[launcher\] 2 workers took their first step")
    slots(user_dir / "slots", "localhost:1\n")
    wait_for(run, r"\[launcher\] re-formed 2 -> 1 worker at step \d+ \(discovery lists 1 "
                  r"slot\): 0 steps lost", i)
    fast(user_dir)
    assert run.wait() == 0, run.text
    assert len(reforms(run)) == 1 and run.text.count("started ps:0") == 2, run.text
    assert "of 1 worker(s), 1 ps" in run.text
    assert latest_step(user_dir / "run") >= 200  # asynchronous workers may overshoot by a step


def test_below_min_workers_past_the_timeout_exits_3_having_started_nothing(user_dir):
    slots(user_dir / "slots", "")
    run = Run(["--discovery", "slots", "--min_workers", "2", "--elastic_timeout", "1", *FLAGS,
               "--model_dir", "run"], timeout=120, cwd=user_dir)
    assert run.wait() == 3, run.text
    assert run.lines[-1] == ("[launcher] error: still discovery lists 0 slots after 1 s, fewer "
                             "than --min_workers 2; add slots to slots and rerun to resume")
    assert "started" not in run.text
    assert not (user_dir / "run").exists()


@pytest.mark.parametrize("flags, message", [
    (["--discovery", "slots", "--workers", "2"],
     "--workers 2 with --discovery: the discovery's slots set the worker count; drop --workers "
     "(bound it with --min_workers and --max_workers)"),
    (["--min_workers", "2"],
     "--min_workers without --discovery: an elastic cluster follows the worker slots a "
     "discovery file lists; add --discovery PATH, or use --workers N"),
    (["--discovery", "slots", "--min_workers", "3", "--max_workers", "2"],
     "--max_workers 2 is below --min_workers 3; use --max_workers >= 3"),
    (["--discovery", "nowhere"],
     "--discovery nowhere: No such file or directory; list the worker slots available now, a "
     "line per host (HOST or HOST:SLOTS)"),
    (["--discovery", "slots", "--min_workers", "5", "--max_workers", "5"],
     "--batch_size 24 is not divisible by the 5 replicas of --strategy multi_worker_mirrored; "
     "use a multiple of 5 (e.g. 25), or keep --batch_size 24 with --workers 1, 2, 3, 4, 6, 8 "
     "or 12"),
])
def test_elastic_flags_refused_in_one_line(tmp_path, monkeypatch, capsys, flags, message):
    """Refused before any task starts (in this process: main() as the console script calls
    it), exit 2."""
    monkeypatch.chdir(tmp_path)
    slots(tmp_path / "slots", "localhost:4\n")
    code = main(["cluster", *flags, "--model", "digits", "--seed", "1", "--batch_size", "24",
                 "--export", "none", "--model_dir", "run"])
    out, err = capsys.readouterr()
    assert (code, err, out) == (2, f"estimator-dist: error: {message}\n", "")
    assert not (tmp_path / "run").exists()


def test_slots_from_a_file_or_an_executable(tmp_path):
    listing = tmp_path / "hosts"
    listing.write_text("# the pool\nhost-1:2\n\nhost-2   # one slot\nhost-3:0\n")
    assert elastic.read_slots(str(listing)) == 3
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\necho other:3\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert elastic.read_slots(str(script)) == 5
    listing.write_text("host-1:two\n")
    with pytest.raises(elastic.BadDiscovery, match=r"line 1 'host-1:two' is not HOST or "
                                                   r"HOST:SLOTS \(e.g. localhost:2\)"):
        elastic.read_slots(str(listing))
    script.write_text("#!/bin/sh\nexit 4\n")
    with pytest.raises(elastic.BadDiscovery, match="exited with code 4"):
        elastic.read_slots(str(script))


def test_the_size_is_the_largest_that_keeps_the_batch(tmp_path):
    assert elastic.size_for(3, [2, 4]) == 2
    assert elastic.size_for(9, [2, 4]) == 4
    assert elastic.size_for(1, [2, 4]) == 0
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-60"\n'
                                         'all_model_checkpoint_paths: "model.ckpt-30"\n')
    assert checkpoint_files.named_step(str(tmp_path)) == 60
    assert checkpoint_files.named_step(str(tmp_path / "none")) is None


def test_a_change_counts_when_two_reads_agree(tmp_path, monkeypatch):
    """A file caught half-written is read once: it does not stop the cluster."""
    path = tmp_path / "slots"
    path.write_text("a:3\n")
    monkeypatch.setattr(elastic, "DISCOVERY_EVERY_S", 0.0)
    e = elastic.Elastic(str(path), [1, 2, 3], str(tmp_path), 1.0, None, emit=lambda line: None)
    assert e.target == 3
    path.write_text("a:1\n")
    e._read()
    assert e.target == 3
    path.write_text("a:3\n")
    e._read()
    assert e.target == 3
    path.write_text("a:2\n")
    e._read()
    e._read()
    assert e.target == 2


def test_check_range():
    elastic.check_range(1, None, 31, 600.0)
    for args, message in [((0, None, 31, 1.0), "--min_workers 0: must be >= 1"),
                          ((2, 40, 31, 1.0), "--max_workers 40: at most 31 workers"),
                          ((1, 2, 31, float("nan")), "--elastic_timeout nan")]:
        with pytest.raises(UserError, match=re.escape(message)):
            elastic.check_range(*args)


def test_make_cluster_with_discovery_runs_the_elastic_launcher():
    result = subprocess.run(["make", "--no-print-directory", "-n", "-B", "cluster",
                             "DISCOVERY=slots", "MIN_WORKERS=2", "MAX_WORKERS=3",
                             "MODEL=digits"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    command = " ".join(result.stdout.replace("\\\n", " ").split("\n")[-2].split())
    assert command == (".venv/bin/estimator-dist cluster --discovery slots --min_workers 2 "
                       "--max_workers 3 --ps 0 --evaluator --model digits --model_dir "
                       "runs/digits")


def test_a_tfjob_with_workers_says_how_to_resize_it():
    job = tfjob.manifest("mnist", "img:1", ["--model", "digits", "--model_dir", "gs://b/run",
                                             "--strategy", "multi_worker_mirrored"],
                         3, 0, False, "team", None, "/data", 0, 0)
    text = tfjob.to_yaml(job)
    assert text.splitlines()[1] == (
        "# Resize: kubectl delete tfjob mnist -n team (every pod gets SIGTERM; the chief saves "
        "the step they stop at), then apply a manifest written with another --workers and the "
        "same --model_dir: it resumes there with the same global batch (docs/elastic.md)")
    assert yaml.safe_load(text) == job
    alone = tfjob.manifest("one", "img:1", ["--model", "digits", "--strategy", "mirrored"], 1, 0, False,
                           "team", None,
                           "/data", 0, 0)
    assert "Resize" not in tfjob.to_yaml(alone)
