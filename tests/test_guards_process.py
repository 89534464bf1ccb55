"""The real CLI in a subprocess: preemption (SIGTERM), kill -9, a full disk, the umask,
out of memory.

Each run is bounded by a timeout; the faults are real signals and a real
RLIMIT_FSIZE (Python ignores SIGXFSZ, so writes past the limit fail with EFBIG); tensors too
large for memory are refused by TensorFlow without allocating them (2**64 bytes), or run under
RLIMIT_AS.
"""
import errno
import json
import os
import re
import resource
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

import guard_models  # noqa: F401 - registers guard_mlp for the in-process parts
from estimator_dist import files
from estimator_dist.guards import training_guard as guards
from estimator_dist.guards import memory
from estimator_dist.cli.main import main
import support
from support import REPO, TESTS, cli_argv, environment as child_environment, latest_step
from estimator_dist.errors import (EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_STORAGE,
                                   EXIT_USER, OutOfMemory, Preempted, StorageError, UserError)

TIMEOUT = 120
SECRET = "guard-secret-value-8d1f"


def train_argv(model_dir, *extra):
    return cli_argv("train", "--import", "guard_models", "--model", "guard_mlp", "--model_dir",
                    model_dir, *extra)


def environment():
    return child_environment(TESTS, ESTIMATOR_DIST_TEST_SECRET=SECRET)


def run(argv, preexec_fn=None):
    extra = {"preexec_fn": preexec_fn} if preexec_fn else {}
    return support.run_argv(argv, cwd=REPO, env=environment(), capture_output=True, text=True,
                            timeout=TIMEOUT, **extra)


def start_and_signal(argv, sig, until_step):
    """Start a training process, wait for the progress line of `until_step`, send `sig`."""
    proc = support.popen(argv, cwd=REPO, env=environment(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT
    try:
        for line in proc.stdout:
            m = re.match(r"step (\d+)/", line)
            if m and int(m.group(1)) >= until_step:
                break
            assert time.monotonic() < deadline, "no progress in time"
        else:
            raise AssertionError(f"exited early: {proc.wait()} {proc.stderr.read()}")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def signal_when(argv, ready, what: str, sig=signal.SIGTERM):
    """Start `argv`, wait until `ready()` while it runs, send `sig`: (exit code, stderr,
    seconds from the signal to the exit)."""
    proc = support.popen(argv, cwd=REPO, env=environment(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ready():
            assert proc.poll() is None, f"ended before {what}: {proc.communicate()}"
            assert time.monotonic() < deadline, f"no {what} in time"
            time.sleep(0.005)
        signalled = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=TIMEOUT)
        return proc.returncode, err, time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def has_temp_export(base) -> bool:
    return base.is_dir() and any(n.startswith("temp-") for n in os.listdir(base))


def assert_resumes(model_dir, step):
    rerun = run(train_argv(model_dir, "--train_steps", step + 5, "--save_checkpoints_steps", 1000))
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming from the checkpoint at step {step} in" in rerun.stdout
    assert f"done: step {step + 5}" in rerun.stdout


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2])
def test_a_stop_signal_writes_a_final_checkpoint_exits_143_and_resumes(signum, tmp_path):
    """SIGTERM, and Slurm's pre-timeout warning (`--signal=USR1@N`, `scancel --signal=USR1`),
    which killed a run at once, no checkpoint, exit 138: each saves and exits 143."""
    # Periodic checkpoints only at 0 and 50000: any other step is the final save.
    code, out, err = start_and_signal(
        train_argv(tmp_path, "--train_steps", 100000, "--save_checkpoints_steps", 50000),
        signum, until_step=100)
    assert code == EXIT_PREEMPTED, err
    step = latest_step(tmp_path)
    assert 100 <= step < 50000
    assert err.strip() == (f"estimator-dist: preempted: {signum.name} at step {step}: saved "
                           f"{tmp_path / f'model.ckpt-{step}'}; exit code 143 (retryable); rerun the "
                           f"same command to resume from it")
    assert SECRET not in out + err
    assert_resumes(tmp_path, step)


def test_ctrl_c_writes_a_final_checkpoint_exits_130_and_resumes(tmp_path):
    """Ctrl-C (SIGINT) exited 130 without a checkpoint: every step since the last one was lost."""
    code, out, err = start_and_signal(
        train_argv(tmp_path, "--train_steps", 100000, "--save_checkpoints_steps", 50000),
        signal.SIGINT, until_step=100)
    assert code == EXIT_INTERRUPTED, err
    step = latest_step(tmp_path)
    assert 100 <= step < 50000
    assert err.strip() == (f"estimator-dist: interrupted: Ctrl-C (SIGINT) at step {step}: saved "
                           f"{tmp_path / f'model.ckpt-{step}'}; exit code 130; rerun the same "
                           f"command to resume from it")
    assert_resumes(tmp_path, step)


def test_sigterm_mid_update_of_accumulate_steps_stops_without_waiting_for_it(tmp_path):
    """An update of 10^6 micro-batches takes minutes; SIGTERM waited for it to end."""
    first = tmp_path / "model.ckpt-0.index"
    code, err, _ = signal_when(
        train_argv(tmp_path, "--train_steps", 5, "--accumulate_steps", 1000000,
                   "--export", "none"),
        lambda: first.exists() and time.sleep(2) is None, "the first checkpoint")
    assert code == EXIT_PREEMPTED, (code, err)
    # At step 0: it stopped inside the update (waiting for it would have saved step 1).
    assert err.startswith("estimator-dist: preempted: SIGTERM at step 0: "), err
    assert_resumes(tmp_path, 0)


def test_sigterm_to_a_chief_waiting_for_its_parameter_server_exits_at_once(tmp_path):
    """Its session waits for a ps that never comes inside TensorFlow's C++, where Python's
    handler cannot run: it was alive 60 s after SIGTERM, until SIGKILL; then it exited by the
    20 s deadline. With no session yet there is nothing to save: it exits at once."""
    from estimator_dist.launch import supervisor as launcher

    chief, ps = launcher.free_ports(2)
    env = {**environment(), "TF_CONFIG": json.dumps({
        "cluster": {"chief": [f"127.0.0.1:{chief}"], "ps": [f"127.0.0.1:{ps}"]},
        "task": {"type": "chief", "index": 0}}),
        "TF_CPP_MIN_LOG_LEVEL": "0"}  # TensorFlow's C++ log, which another test may have quieted
    proc = subprocess.Popen(train_argv(tmp_path, "--strategy", "parameter_server", "--train_steps",
                                       5, "--export", "none", "--verbose"),
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        for line in proc.stderr:  # TensorFlow's C++ log as its session creation starts
            if "Scanning workers for devices" in line:
                time.sleep(1)  # then it waits for the ps, inside TensorFlow's C++
                break
            assert time.monotonic() < deadline, "no session creation in time"
        else:
            raise AssertionError(f"ended before waiting for the ps: {proc.wait()}")
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        err = proc.stderr.read()
        code = proc.wait(timeout=TIMEOUT)
        seconds = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == EXIT_PREEMPTED, (code, seconds)
    # At once: not by the deadline ("did not end within"), not by SIGKILL (no line, -9).
    assert "did not end within" not in err, err[-2000:]
    assert "estimator-dist: preempted: SIGTERM before training started (building the graph or " \
           "waiting for the peers): nothing to save; no checkpoint was written; exit code 143" \
           in err, err[-2000:]


def test_sigterm_during_an_evaluation_between_steps_stops_it_and_exits_143(tmp_path):
    """Estimator evaluates right after a checkpoint save, inside the training step's hooks:
    the evaluation (4 batches x 4 s here) is cut short before its next batch."""
    model_dir, marker = tmp_path / "run", tmp_path / "evaluating"
    argv = train_argv(model_dir, "--train_steps", 100000, "--save_checkpoints_steps", 20,
                      "--eval_steps", 4, "--set", "eval_sleep=4", "--set", f"eval_marker={marker}")
    code, err, _ = signal_when(argv, marker.exists, "an evaluation")
    assert code == EXIT_PREEMPTED, err
    # The batch in flight ends, then the process: not the 3 batches after it (the marker
    # has a line per batch started; SIGTERM came in the first one's sleep).
    batches = marker.read_text().count("\n")
    assert batches < 4, f"{batches} of 4 eval batches ran: the evaluation ran on"
    step = latest_step(model_dir)
    assert err.strip() == (
        f"estimator-dist: preempted: SIGTERM during an evaluation between training steps: "
        f"stopped it (no metrics written); the latest checkpoint is "
        f"{model_dir / f'model.ckpt-{step}'}; exit code 143 (retryable); rerun the same command "
        f"to resume from it")
    assert not (model_dir / "eval").exists() or not any(
        (model_dir / "eval").iterdir()), "the cut-off evaluation wrote metrics"
    assert_resumes(model_dir, step)


def test_kill_9_loses_at_most_the_steps_since_the_last_checkpoint(tmp_path):
    code, _, _ = start_and_signal(
        train_argv(tmp_path, "--train_steps", 100000, "--save_checkpoints_steps", 100),
        signal.SIGKILL, until_step=300)
    assert code == -signal.SIGKILL
    step = latest_step(tmp_path)
    assert step >= 200 and step % 100 == 0
    assert_resumes(tmp_path, step)


def test_a_second_run_into_a_model_dir_in_use_is_refused_and_a_killed_one_blocks_nothing(
        tmp_path):
    """Two runs into one model_dir both exited 0, their checkpoints interleaved; the lock a
    kill -9 leaves behind (its file, naming the dead PID) must not block the next run."""
    first = support.popen(train_argv(tmp_path, "--train_steps", 100000,
                                     "--save_checkpoints_steps", 50000),
                          cwd=REPO, env=environment(), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    try:
        for line in first.stdout:
            if line.startswith("step "):
                break
        else:
            raise AssertionError(f"the first run ended: {first.wait()}")
        before = sorted(os.listdir(tmp_path))
        second = run(train_argv(tmp_path, "--train_steps", 5))
        assert second.returncode == EXIT_USER, second.stderr
        assert second.stderr.strip() == (
            f"estimator-dist: error: --model_dir {tmp_path}: another run (PID {first.pid} on host "
            f"{socket.gethostname()}) is training into it (it holds {tmp_path}/.estimator-dist.lock); "
            f"wait for it to end or stop it, or give another --model_dir")
        assert second.stdout == "" and sorted(os.listdir(tmp_path)) == before
        first.kill()
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert (tmp_path / ".estimator-dist.lock").exists()  # what the dead run left
    assert_resumes(tmp_path, 0)
    assert not (tmp_path / ".estimator-dist.lock").exists()


def read_only(how, directory):
    """A prefix that runs a command with `directory` unwritable even for root (who ignores
    permission bits): a read-only bind mount in a private mount namespace (EROFS), or the
    immutable attribute (EPERM, set here; the caller lifts it)."""
    if how == "read-only mount":
        return ["unshare", "-m", "sh", "-c",
                f"mount --bind -o ro '{directory}' '{directory}' && exec \"$@\"", "sh"]
    subprocess.run(["chattr", "-R", "+i", str(directory)], check=True)
    return []


UNWRITABLE = [  # how, what the line says is the cause, the fix it ends with
    ("read-only mount", "the file system is read-only (Read-only file system",
     "write to a writable directory (or remount it read-write) and rerun"),
    ("chattr +i", "writing there is not permitted (e.g. an immutable directory, chattr +i) "
                  "(Operation not permitted", "write to a writable directory (or lift the "
                                              "attribute) and rerun"),
]


@pytest.mark.timeout(600)  # seven TensorFlow processes in a row, on a loaded machine
def test_an_unwritable_model_dir_names_the_cause_and_exits_5(tmp_path):
    """evaluate exited 1 advising to "check the input's labels"; train/export/report said
    "free space" for a read-only file system. Each way in turn on one trained model_dir
    (each leaves it unchanged): one training for both."""
    model_dir = tmp_path / "run"
    trained = run(train_argv(model_dir, "--train_steps", 2, "--export", "final"))
    assert trained.returncode == 0, trained.stderr
    before = sorted(walk(model_dir))
    for how, cause, fix in UNWRITABLE:
        try:
            prefix = read_only(how, model_dir)
            commands = {
                "evaluate": ["evaluate", "--model_dir", str(model_dir)],
                "export": ["export", "--model_dir", str(model_dir)],
                "train": train_argv(model_dir, "--train_steps", 4)[3:],
            }
            errors = {}
            for command, argv in commands.items():
                done = run(prefix + cli_argv(*argv))
                errors[command] = done.stderr
                assert done.returncode == EXIT_STORAGE, (how, command, done.stderr)
                assert done.stderr.count("\n") == 1 and cause in done.stderr, (how, command,
                                                                                done.stderr)
                assert done.stderr.endswith(f"{fix}\n"), (how, command, done.stderr)
            assert errors["evaluate"].startswith(
                f"estimator-dist: error: evaluating {model_dir}/model.ckpt-2 (writing its metrics) "
                f"failed: {cause}: {model_dir}/eval_cli); the checkpoints are unchanged; "), how
            assert errors["train"].startswith(
                f"estimator-dist: error: --model_dir {model_dir}: creating its lock file "
                f"failed: "), how
        finally:
            subprocess.run(["chattr", "-R", "-i", str(model_dir)], check=False)
        assert sorted(walk(model_dir)) == before, how


def fill_disk_at(limit_bytes):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return preexec


def walk(path):
    for root, dirs, names in os.walk(path):
        for name in dirs + names:
            yield os.path.join(root, name)


def test_disk_full_while_checkpointing_is_an_error_and_keeps_the_previous_one(tmp_path):
    """The disk fills up at step 3 (the 1.2 MB checkpoint no longer fits); the save at 5 fails.

    Unguarded, TensorFlow's OutOfRangeError ("File too large") ends training as if
    the input had run out: exit 0, an evaluation and export of model.ckpt-0.
    """
    proc = run(train_argv(tmp_path, "--train_steps", 10, "--save_checkpoints_steps", 5,
                          "--set", "big=300000", "--set", "fsize_limit_step=3"))
    assert proc.returncode == EXIT_STORAGE, proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("estimator-dist: error: saving checkpoint model.ckpt-5 failed: ")
    assert f"File too large: {tmp_path / 'model.ckpt-5_temp'}" in err
    assert f"the previous checkpoint {tmp_path / 'model.ckpt-0'} is intact" in err
    assert latest_step(tmp_path) == 0
    assert not [p for p in walk(tmp_path) if "temp" in os.path.basename(p)]
    assert not (tmp_path / "model.ckpt-5.index").exists()
    reader = tf.compat.v1.train.NewCheckpointReader(str(tmp_path / "model.ckpt-0"))
    assert reader.get_tensor("big").shape == (300000,)


def test_disk_full_while_exporting_is_an_error_and_keeps_earlier_exports(tmp_path, capsys):
    model_dir, base = tmp_path / "run", tmp_path / "exports"
    assert main(["train", "--import", "guard_models", "--model", "guard_mlp", "--model_dir",
                 str(model_dir), "--train_steps", "3", "--set", "big=300000"]) == 0
    assert main(["export", "--model_dir", str(model_dir), "--export_dir", str(base)]) == 0
    (first,) = os.listdir(base)
    before = {p: os.path.getsize(p) for p in walk(base)}
    time.sleep(1.0)  # a new timestamp for the next export
    proc = run(cli_argv("export", "--import", "guard_models",
                "--model_dir", str(model_dir), "--export_dir", str(base)),
               preexec_fn=fill_disk_at(600_000))
    assert proc.returncode == EXIT_STORAGE, proc.stderr
    err = proc.stderr.strip()
    assert err.startswith(f"estimator-dist: error: exporting into {base} failed: ")
    assert "File too large" in err and err.count("\n") == 0
    assert os.listdir(base) == [first]  # the partial temp-<timestamp> dir is gone
    assert {p: os.path.getsize(p) for p in walk(base)} == before


def one_line_storage_error(proc) -> str:
    assert proc.returncode == EXIT_STORAGE, proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert err.startswith("estimator-dist: error: ")
    return err


def test_disk_full_writing_config_yaml_is_one_line_and_leaves_nothing(tmp_path):
    proc = run(train_argv(tmp_path, "--train_steps", 3), preexec_fn=fill_disk_at(500))
    err = one_line_storage_error(proc)
    assert err.startswith(f"estimator-dist: error: writing {tmp_path / 'config.yaml'} failed: "
                          f"a file hit the file-size limit")
    assert os.listdir(tmp_path) == []  # no config.yaml, no config.yaml.tmp


def test_disk_full_writing_tensorboard_events_is_one_line(tmp_path):
    """From step 3 no file may pass 100 kB: checkpoints (72 kB .meta) fit, the events
    files do not. TensorFlow's writer thread dies with a traceback of its own and the
    main thread gets an IndexError ("File too large") at its next flush."""
    proc = run(train_argv(tmp_path, "--train_steps", 50, "--set", "fsize_limit_step=3",
                          "--set", "fsize_limit=100000"))
    err = one_line_storage_error(proc)
    assert re.search(r"\(File too large: \S+/events\.out\.tfevents\.[^ ]+\)", err), err
    assert f"the previous checkpoint {tmp_path / 'model.ckpt-50'} is intact" in err
    assert "EventFileWriter" not in proc.stderr
    assert latest_step(tmp_path) == 50


def test_a_checkpoint_save_failing_at_its_meta_file_is_undone(tmp_path):
    """TensorFlow writes the variables, points the state file at them, then writes the
    .meta (72 kB here): a save failing there would leave a checkpoint named as the
    latest that the error calls failed. It is removed and the state file restored."""
    proc = run(train_argv(tmp_path, "--train_steps", 10, "--save_checkpoints_steps", 5,
                          "--set", "fsize_limit_step=3", "--set", "fsize_limit=6000"))
    err = one_line_storage_error(proc)
    assert err.startswith("estimator-dist: error: saving checkpoint model.ckpt-5 failed: ")
    assert re.search(r"File too large: \S+/model\.ckpt-5\.meta", err), err
    assert f"the previous checkpoint {tmp_path / 'model.ckpt-0'} is intact" in err
    assert not [p for p in walk(tmp_path) if os.path.basename(p).startswith("model.ckpt-5")]
    assert latest_step(tmp_path) == 0
    assert_resumes(tmp_path, 0)


def test_disk_full_writing_a_tfjob_manifest_is_one_line(tmp_path):
    out = tmp_path / "job.yaml"
    out.write_text("earlier\n")
    proc = run(cli_argv("tfjob", "--name", "j", "--image", "i",
                "--workers", "1", "--output", str(out), "--model", "digits"), preexec_fn=fill_disk_at(100))
    err = one_line_storage_error(proc)
    assert err.startswith(f"estimator-dist: error: writing {out} failed: ")
    assert f"the earlier {out} is unchanged" in err
    assert out.read_text() == "earlier\n" and os.listdir(tmp_path) == ["job.yaml"]


def test_write_file_writes_through_a_symlink_and_into_a_pipe(tmp_path):
    """A symlink (and a device: `tfjob --output /dev/full` as root) was replaced by a file."""
    target = tmp_path / "target.yaml"
    target.write_text("old")
    (tmp_path / "link.yaml").symlink_to(target)
    files.write_text(str(tmp_path / "link.yaml"), "new")
    assert (tmp_path / "link.yaml").is_symlink() and target.read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["link.yaml", "target.yaml"]
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_text()))
    reader.start()
    files.write_text(str(pipe), "through the pipe")
    reader.join(timeout=10)
    assert received == ["through the pipe"] and stat.S_ISFIFO(os.stat(pipe).st_mode)


def test_write_file_keeps_the_earlier_file_and_leaves_no_temp(tmp_path):
    """config.yaml, --summary_json, the state file, report, predict and tfjob outputs."""
    path = tmp_path / "summary.json"
    path.write_text("earlier")

    def fails(error):
        def write(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                f.write("partial")
            raise error

        return write

    full = OSError(errno.ENOSPC, "No space left on device", f"{path}.tmp")
    with pytest.raises(StorageError, match=rf"^writing {path} failed: the disk is full \(No space "
                                           rf"left on device: {path}.tmp\); the earlier {path} is "
                                           rf"unchanged; free space"):
        files.write_file(str(path), fails(full))
    with pytest.raises(ValueError, match="not a disk problem"):
        files.write_file(str(path), fails(ValueError("not a disk problem")))
    assert path.read_text() == "earlier" and os.listdir(tmp_path) == ["summary.json"]
    files.write_text(str(path), "new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["summary.json"]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000])
def test_files_honour_the_umask_and_none_is_world_writable(umask, tmp_path):
    def preexec():
        os.umask(umask)

    verbose = ["--verbose"] if umask == 0o022 else []  # TensorFlow's own logging too
    proc = run(train_argv(tmp_path, "--train_steps", 3, "--export", "final", *verbose),
               preexec_fn=preexec)
    assert proc.returncode == 0, proc.stderr
    paths = list(walk(tmp_path))
    assert any(p.endswith("saved_model.pb") for p in paths)
    assert any(os.path.basename(p).startswith("model.ckpt-3.") for p in paths)
    for path in paths:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert not mode & 0o002, f"{path} is world-writable: {oct(mode)}"
        assert not mode & umask, f"{path} ignores umask {oct(umask)}: {oct(mode)}"
    if umask == 0o022:  # honoured, not tightened: others can read the export
        export = next(p for p in paths if p.endswith("saved_model.pb"))
        assert stat.S_IMODE(os.stat(export).st_mode) & 0o044 == 0o044
    assert SECRET not in proc.stdout + proc.stderr


def test_sigterm_outside_a_training_step_stops_at_once(tmp_path):
    """No step to finish (graph building, final evaluation or export): Preempted right away."""
    previous = signal.getsignal(signal.SIGTERM)
    slept = []
    with pytest.raises(Preempted, match="SIGTERM outside a training step: no checkpoint was written"):
        with guards.TrainingGuard(str(tmp_path)):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # what comes after: 10 s of it
                slept.append(time.sleep(0.1))
    assert len(slept) <= 1, f"{len(slept)} of 100 sleeps ran before Preempted"
    assert signal.getsignal(signal.SIGTERM) is previous


EVALUATOR_EXPORTING = """
import os, sys, time
from estimator_dist.guards import training_guard as guards
from estimator_dist.distribute.specs import spec
from estimator_dist.errors import Preempted
from estimator_dist.distribute.role import EVALUATOR, Role
model_dir = sys.argv[1]
try:
    with guards.TrainingGuard(model_dir, role=Role(EVALUATOR, spec("none")), sigterm=guards.EXIT,
                              sigint=None):
        os.makedirs(os.path.join(model_dir, "export", "best", "temp-1795600000"))  # mid-export
        time.sleep(60)
except Preempted as e:
    print(e, file=sys.stderr)
    sys.exit(e.exit_code)
"""


def test_sigterm_to_the_evaluator_removes_the_export_it_was_writing_and_exits_143(tmp_path):
    """It died at once, leaving a half-written export/best/temp-<timestamp> behind."""
    best = tmp_path / "export" / "best"
    code, err, _ = signal_when([sys.executable, "-c", EVALUATOR_EXPORTING, str(tmp_path)],
                               lambda: has_temp_export(best), "the export")
    assert code == EXIT_PREEMPTED, err
    # It exits from the signal's watcher thread (never raising into TensorFlow): its own line.
    assert err.strip() == ("estimator-dist: preempted: SIGTERM: the evaluator stopped (an export "
                           "it was writing is removed); no checkpoint yet; exit code 143 "
                           "(retryable); rerun the same command to go on evaluating")
    assert os.listdir(best) == []


def test_sigterm_during_the_export_command_removes_the_partial_export_and_exits_143(tmp_path):
    """`export` died at once on SIGTERM, leaving export/manual/temp-<timestamp> behind."""
    model_dir = tmp_path / "run"
    trained = run(train_argv(model_dir, "--train_steps", 5))
    assert trained.returncode == 0, trained.stderr
    manual = model_dir / "export" / "manual"
    argv = cli_argv("export", "--import", "guard_models",
            "--model_dir", str(model_dir))
    code, err, _ = signal_when(argv, lambda: has_temp_export(manual), "the export")
    assert code == EXIT_PREEMPTED, err
    assert err.strip() == ("estimator-dist: preempted: SIGTERM: 'export' stopped; anything it was "
                           "writing was removed; exit code 143 (retryable); rerun the same command")
    assert os.listdir(manual) == []


def test_sigterm_during_a_graph_build_is_preempted_not_a_model_error(tmp_path, monkeypatch):
    """users_code turns a model_fn's exceptions into "could not build" (exit 2, which nobody
    retries); the Preempted that SIGTERM raises inside a build was reported that way too."""
    from estimator_dist import quiet
    from estimator_dist.training import user_code

    monkeypatch.setitem(quiet._state, "quiet", True)

    def build():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)

    with pytest.raises(Preempted, match="SIGTERM outside a training step"):
        with guards.TrainingGuard(str(tmp_path)):
            user_code.users_code(build, "model 'm' could not build its train graph", "fix it")

    def swallowing_build():  # as inspect.getfullargspec does: an `export` exited 2 (CI, once)
        try:
            build()
        except Exception as e:
            raise TypeError("unsupported callable") from e

    with pytest.raises(Preempted, match="SIGTERM outside a training step"):
        with guards.TrainingGuard(str(tmp_path)):
            user_code.users_code(swallowing_build, "model 'm' could not build its train graph",
                              "fix it")

    def bad_build():
        raise ValueError("bad")

    with pytest.raises(UserError, match="model 'm' could not build its train graph: "
                                        "ValueError: bad; fix it"):
        user_code.users_code(bad_build, "model 'm' could not build its train graph", "fix it")


def address_space_limit(limit_bytes):
    """preexec_fn: the child may map at most limit_bytes (ulimit -v), so that a model that
    slipped past the memory check fails instead of filling the machine's RAM."""
    def preexec():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return preexec


@pytest.mark.parametrize("strategy,n", [("none", 1), ("mirrored", 2)])
def test_a_model_too_large_for_memory_is_refused_while_its_graph_is_built(strategy, n, tmp_path):
    """`--set filters=100000000`: digits' conv2 kernel alone needs 639.5 PiB. TensorFlow filled
    10 GB of RAM for 30 s, then failed with "training failed at step None: Cannot parse tensor
    from proto ... check the input's labels", leaving config.yaml and an events file; under
    ulimit -v it died of a segmentation fault. Under mirrored on 2 devices the graph build
    failed first, with a ValueError traceback from the gradient all-reduce ("Split size at
    index 6 must be >= 0"), exit 1, leaving config.yaml: now the variable is refused as it is
    created, before the optimizer is built."""
    model_dir = tmp_path / "run"
    proc = run(cli_argv("train", "--model", "digits",
                "--strategy", strategy, "--num_devices", str(n),
                "--set", "filters=100000000", "--model_dir", str(model_dir), "--train_steps", "2"),
               preexec_fn=address_space_limit(16 * 2**30))
    assert proc.returncode == EXIT_USER, proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert err == ("estimator-dist: error: out of memory: the model's variables need at least "
                   "639.5 PiB (the largest: 'digits_cnn/conv2/kernel' [3, 3, 100000000, 200000000] "
                   "639.5 PiB, 'digits_cnn/conv1/kernel' [3, 3, 1, 100000000] 3.4 GiB, "
                   "'digits_cnn/bn1/gamma' [100000000] 381.5 MiB), more than the address-space "
                   "limit (ulimit -v), 16.0 GiB; lower the model's size hparams (--set ...; "
                   "'estimator-dist list' shows them)")
    assert not model_dir.exists()  # config.yaml (and the events file) it had written are gone


def test_the_memory_check_counts_every_variable_against_the_limit():
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("a", [1000], tf.float32)
        tf.compat.v1.get_variable("b", [10, 10], tf.float64)
        variables = tf.compat.v1.global_variables()
        memory.check_variables_fit(variables, (4800, "a test limit"))
        with pytest.raises(UserError) as e:
            memory.check_variables_fit(variables, (4799, "a test limit"))
    assert str(e.value) == ("out of memory: the model's variables need 4.7 KiB (the largest: 'a' "
                            "[1000] 3.9 KiB, 'b' [10, 10] 800 B), more than a test limit, 4.7 KiB; "
                            "lower the model's size hparams (--set ...; 'estimator-dist list' "
                            "shows them)")
    limit, what = memory.memory_limit()
    assert limit > 2**28 and what  # RAM and swap, or this process's ulimit -v


OOM_MODULE = '''
"""A model whose training step (at: step) or session creation (at: init) needs a
[2**31, 2**31] float32 tensor: 2**64 bytes, which TensorFlow refuses at once without
allocating anything."""
import tensorflow as tf

import estimator_dist
from estimator_dist.training.registry import register_model

HUGE = 2 ** 31


@register_model("oom_step", hparams={"learning_rate": 0.1, "optimizer": "sgd", "tensor": "fill",
                                     "at": "step"},
                default_input="guard_xy",
                run_defaults={"batch_size": 16, "eval_steps": 1, "export": "none"})
def oom_step(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features["x"], 3, name="logits")
    scaffold = None
    if mode == tf.estimator.ModeKeys.TRAIN:
        if params["tensor"] == "fill":  # a shape known at run time: ResourceExhaustedError
            n = tf.compat.v1.placeholder_with_default(tf.constant(HUGE, tf.int64), [])
            huge = tf.fill(tf.stack([n, n]), 0.0, name="huge")
        else:  # a constant, as Grappler folds tf.ones/tf.zeros initializers
            huge = tf.zeros([HUGE, HUGE], name="huge")
        if params["at"] == "init":  # assigned: Grappler prunes a stateless op that only
            # a control dependency reaches
            sink = tf.compat.v1.get_local_variable("sink", [], initializer=tf.zeros_initializer())
            scaffold = tf.compat.v1.train.Scaffold(local_init_op=tf.group(
                tf.compat.v1.local_variables_initializer(), sink.assign(tf.reduce_sum(huge))))
        else:
            logits += tf.reduce_sum(huge)
    predictions = {"class_ids": tf.argmax(logits, axis=-1)}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions=predictions, export_outputs={
            "serving_default": tf.estimator.export.PredictOutput(predictions)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    return tf.estimator.EstimatorSpec(mode, loss=loss, scaffold=scaffold,
                                      train_op=estimator_dist.minimize(loss, params))
'''


OOM_FILL = (r"OOM when allocating tensor with shape\[2147483648,2147483648\] and type float on "
            r"\S+ by allocator \w+ \(ResourceExhaustedError\)")
OOM_CONST = (r"the constant 'huge' of shape \[2147483648, 2147483648\] could not be allocated "
             r"\(InvalidArgumentError: Cannot parse tensor from proto\)")


@pytest.mark.parametrize("at,tensor,what", [
    ("step", "fill", OOM_FILL), ("step", "const", OOM_CONST), ("init", "fill", OOM_FILL)])
def test_out_of_memory_in_a_session_is_one_line_exit_1(at, tensor, what, tmp_path, monkeypatch,
                                                       capsys):
    """A tensor TensorFlow cannot allocate in a training step or while the session initializes
    (the variables fit): one line naming it and the fix, exit 1, where it was "training failed
    at step None: ...; check the input's labels" (a traceback with --verbose). A checkpoint
    written before the step stays; a model_dir with none, created by the run, is removed."""
    (tmp_path / "oom_models.py").write_text(OOM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    model_dir = tmp_path / "run"
    code = main(["train", "--import", "oom_models", "--model", "oom_step", "--set",
                 f"tensor={tensor}", "--set", f"at={at}", "--model_dir", str(model_dir),
                 "--train_steps", "3"])
    err = capsys.readouterr().err
    assert code == EXIT_INTERNAL and err.count("\n") == 1 and "Traceback" not in err, err
    where, kept = (("at step 1", f"the latest checkpoint is {model_dir / 'model.ckpt-0'}")
                   if at == "step" else ("before the first step (initializing the variables)",
                                         "no checkpoint was written"))
    assert re.fullmatch(
        rf"estimator-dist: error: out of memory {re.escape(where)}: {what}; lower --batch_size "
        rf"or the model's size hparams \(--set \.\.\.; 'estimator-dist list' shows them\); "
        rf"{re.escape(kept)}; --verbose shows TensorFlow's traceback\n", err), err
    if at == "step":
        assert latest_step(model_dir) == 0
    else:
        assert not model_dir.exists()  # config.yaml and the events file it had written are gone


def test_out_of_memory_before_the_first_step_names_the_initialization(tmp_path):
    """Raised by a real session; the guard's hook has no step yet (variables initializing)."""
    with tf.Graph().as_default():
        huge = tf.zeros([2**31, 2**31], name="init_huge")
        with tf.compat.v1.Session() as session:
            with pytest.raises(OutOfMemory) as e:
                with guards.TrainingGuard(str(tmp_path)):
                    session.run(tf.reduce_sum(huge))
    assert str(e.value) == (
        "out of memory before the first step (initializing the variables): the constant "
        "'init_huge' of shape "
        "[2147483648, 2147483648] could not be allocated (InvalidArgumentError: Cannot parse "
        "tensor from proto); lower --batch_size or the model's size hparams (--set ...; "
        "'estimator-dist list' shows them); no checkpoint was written; --verbose shows "
        "TensorFlow's traceback")
    assert e.value.exit_code == EXIT_INTERNAL
