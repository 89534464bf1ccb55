"""What tests share to start processes and read what they leave: the CLI as a user runs it,
local clusters, process checks, checkpoints, ports, and the short timers of process tests.

Import what you need (`from support import run_cli, Run, latest_step`); conftest.py re-exports
its long-standing names (REPO, run_cli, run_on_a_terminal). No TensorFlow at import.
"""
import glob
import os
import re
import signal
import subprocess
import sys
import threading
import time

import warm
from estimator_dist import checkpoint_files, timers
from estimator_dist.launch.ports import free_ports, release_ports  # noqa: F401 - for tests

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")
# A small, seeded digits run: the train flags of most process tests.
TRAIN = ["--model", "digits", "--batch_size", "32", "--seed", "1"]
# The waits a process test does not need to sit out (timers.py), for a test that shows the
# behaviour behind them: set in `environment(short_timers=True)`. Long enough for a loaded
# 2-core machine: a stall of 8 s is 40 times the longest digits step seen here under load.
SHORT_TIMERS = {"peer_stall_min_s": 8.0, "peer_deadline_s": 8.0, "stop_grace_s": 12.0}


def environment(*pythonpath, short_timers=False, **extra):
    """This process's environment for a child: `pythonpath` entries first on PYTHONPATH (the
    rest kept), unbuffered output, SHORT_TIMERS when asked, and `extra` variables."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    path = [str(p) for p in pythonpath] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    env.pop("PYTHONPATH", None)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    if short_timers:
        env[timers.ENV] = short_timers_setting()
    return env


def short_timers_setting(**seconds_of):
    """SHORT_TIMERS, with `seconds_of` instead where given, as timers.ENV's value
    (`monkeypatch.setenv(timers.ENV, ...)` for a launcher run in the test's own process: its
    tasks inherit it)."""
    return timers_setting(**{**SHORT_TIMERS, **seconds_of})


def timers_setting(**seconds_of):
    """timers.ENV's value that shortens only the timers given (the rest keep the product's)."""
    return ",".join(f"{name}={seconds:g}" for name, seconds in seconds_of.items())


def cli_argv(*args):
    """`python -m estimator_dist ARGS`, the arguments as text."""
    return [sys.executable, "-m", "estimator_dist", *map(str, args)]


# The subprocess arguments a warm start (warm.py) takes; any other starts a new interpreter.
WARM_KWARGS = frozenset({"cwd", "env", "stdout", "stderr", "text", "universal_newlines",
                         "capture_output", "timeout"})


def _warm_args(argv, kwargs, cold):
    """The CLI arguments of `argv` when it can start warm, else None."""
    argv = [str(a) for a in argv]
    if cold or argv[:3] != cli_argv() or set(kwargs) - WARM_KWARGS:
        return None
    if not (kwargs.get("text") or kwargs.get("universal_newlines")):
        return None
    env = kwargs.get("env")
    return argv[3:] if warm.can_start(argv[3:], os.environ if env is None else env) else None


def popen(argv, cold=False, **kwargs):
    """subprocess.Popen(argv, **kwargs), warm (warm.py) when argv is cli_argv()'s and the
    arguments allow; `cold`: a new interpreter (a test of what happens while it imports)."""
    args = _warm_args(argv, kwargs, cold)
    if args is None:
        return subprocess.Popen(argv, **kwargs)
    return warm.Process(args, kwargs.get("cwd") or os.getcwd(), kwargs.get("env"),
                        kwargs.get("stdout"), kwargs.get("stderr"))


def run_argv(argv, cold=False, **kwargs):
    """subprocess.run(argv, **kwargs), warm as popen() is (capture_output=True)."""
    args = _warm_args(argv, kwargs, cold)
    if args is None or not kwargs.get("capture_output"):
        return subprocess.run(argv, **kwargs)
    return warm.run(args, cwd=kwargs.get("cwd") or os.getcwd(), env=kwargs.get("env"),
                    timeout=kwargs.get("timeout"))


def run_cli(*args, timeout=300, cwd=REPO, env=None, cold=False):
    """`python -m estimator_dist ARGS` in a process of its own, as a user runs it (warm.py:
    started warm where that is the same; `cold`: a new interpreter): the finished process,
    with `.seconds` it took."""
    started = time.monotonic()
    done = run_argv(cli_argv(*args), cold=cold, cwd=cwd, env=env, capture_output=True,
                    text=True, timeout=timeout)
    done.seconds = time.monotonic() - started
    return done


def slurm_up() -> str:
    """Why the real-Slurm tests cannot run here ('' when they can: `make slurm` started it)."""
    import shutil

    if shutil.which("srun") is None:
        return "Slurm is not installed (make slurm installs and starts it, as root)"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    return "" if "is UP" in ping.stdout else "slurmctld is not running (make slurm starts it)"


def srun_cli(srun_args, *args, timeout=300, cwd=REPO, env=None):
    """`srun SRUN_ARGS python -m estimator_dist ARGS`: a Slurm step whose tasks run the CLI as
    typed (the finished srun, with `.seconds`)."""
    started = time.monotonic()
    done = subprocess.run(["srun", *map(str, srun_args), *cli_argv(*args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    done.seconds = time.monotonic() - started
    return done


def supervise(supervisor) -> int:
    """Run a launcher.Supervisor from the repository, whose tasks run `python -m
    estimator_dist` as a user's would: the chief's exit code."""
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        return supervisor.run()
    finally:
        os.chdir(cwd)


def run_on_a_terminal(args, columns=None, timeout=120):
    """`python -m estimator_dist ARGS` writing to a pseudo-terminal (`columns` wide when given),
    as from a user's shell: (exit code, everything it wrote, as text)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(cli_argv(*args), stdout=slave, stderr=slave, cwd=REPO)
    os.close(slave)
    output = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    return proc.wait(timeout), output.decode()


def cli_in_process(argv, capsys, monkeypatch):
    """`estimator-dist ARGV` called in this process, for a command that must refuse (or only
    write a file) before any process starts; starting one fails the test instead (no process
    is started, no signal handler of the launcher installed): (exit code, stdout, stderr)."""
    from estimator_dist.cli.main import main

    def no_task(*_args, **_kwargs):
        raise AssertionError(f"estimator-dist {' '.join(map(str, argv))}: a task was started")

    # By dotted names: the tier rule (conftest.py) reads names, and this starts nothing. Every
    # process start (a cluster's task, a bench case, a Horovod rank) goes through Popen.
    monkeypatch.setattr("subprocess.Popen", no_task)
    monkeypatch.setattr("estimator_dist.launch.cluster.install_signal_handlers", lambda: None)
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# Every Run started in this process, for stop_left_running.
_STARTED = []


def stop_left_running():
    """SIGTERM (the launcher stops its tasks) to each Run still running, then SIGKILL if it
    outlasts the wait: conftest.py calls it after every test, so that a test that failed or
    hit its pytest timeout (a loaded machine) leaves no cluster training on beside the
    next ones."""
    while _STARTED:
        run = _STARTED.pop()
        try:
            run.stop()
        except Exception:  # it outlasted stop()'s wait
            run.proc.kill()
            run.proc.wait()


class Run:
    """`python -m estimator_dist COMMAND ARGS` (default `cluster`) as a subprocess whose output
    is collected line by line as it comes, with the time each line came: stdout and stderr
    together in `lines`, or stderr apart in `errors` (stderr_apart)."""

    def __init__(self, args, timeout=300, cwd=REPO, command="cluster", env=None,
                 stderr_apart=False, prefix=(), cold=False):
        self.started = time.monotonic()
        self.proc = popen(  # prefix: e.g. srun's argv, which runs the command
            [*map(str, prefix), *cli_argv(command, *args)], cold=cold, cwd=cwd,
            env=env or environment(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stderr_apart else subprocess.STDOUT, text=True)
        self.lines, self.errors = [], []
        self.times = []  # when each of `lines` came (time.monotonic())
        self.ended = None  # when stdout ended (the process closed it, at its exit)
        self.timeout = timeout
        _STARTED.append(self)
        self._readers = [threading.Thread(target=self._read, daemon=True)]
        if stderr_apart:
            self._readers.append(threading.Thread(target=self._read_errors, daemon=True))
        for reader in self._readers:
            reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.times.append(time.monotonic())
            self.lines.append(line.rstrip("\n"))
        self.ended = time.monotonic()

    def _read_errors(self):
        for line in self.proc.stderr:
            self.errors.append(line.rstrip("\n"))

    def time_of(self, pattern):
        """When the first line matching `pattern` (re.search) came."""
        return next(t for t, line in zip(self.times, self.lines) if re.search(pattern, line))

    def pid_of(self, task):
        """The PID of the task's latest start."""
        pid = None
        for line in list(self.lines):
            m = re.match(rf"\[launcher\] started {re.escape(task)} pid (\d+)", line)
            if m:
                pid = int(m.group(1))
        return pid

    def wait(self):
        try:
            code = self.proc.wait(self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
            raise AssertionError("run timed out:\n" + "\n".join(self.lines[-40:])) from None
        for reader in self._readers:
            reader.join(5)
        return code

    def stop(self):
        """SIGTERM (the launcher stops every task) if it still runs: for a `finally`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)

    @property
    def text(self):
        return "\n".join(self.lines)

    @property
    def shown(self):
        """The output so far for a failure's message: stderr after stdout if kept apart."""
        return "\n".join([*self.lines, "--- stderr ---", *self.errors] if self.errors
                         else self.lines)


def wait_for(run, pattern, start=0, seconds=180):
    """(the first match of `pattern` in the run's lines from line `start` on, the index of
    its line), waiting for it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for i, line in enumerate(list(run.lines)[start:], start):
            m = re.search(pattern, line)
            if m:
                return m, i
        if run.proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"no line matching {pattern!r}:\n" + run.shown)


def alive(pid):
    """Whether process `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pids, seconds):
    """Wait up to `seconds` for every one of `pids` to end: those still alive."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def kill_left(pids):
    """SIGKILL to those of `pids` still alive: for a `finally`."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def checkpoint_steps(model_dir):
    """The steps of the checkpoints in model_dir, ascending (their .index files)."""
    return checkpoint_files.index_steps(str(model_dir))


def latest_step(model_dir):
    """The global step saved in model_dir's latest checkpoint (the one its `checkpoint` state
    file names: what a resume reads); None without one."""
    import tensorflow as tf

    latest = checkpoint_files.latest_prefix(str(model_dir))
    return int(tf.train.load_checkpoint(latest).get_tensor("global_step")) if latest else None


def final_export(model_dir):
    """The saved_model.pb files of model_dir's exports (any exporter)."""
    return glob.glob(os.path.join(str(model_dir), "export", "*", "*", "saved_model.pb"))
