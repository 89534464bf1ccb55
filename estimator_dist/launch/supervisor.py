"""Run a TF_CONFIG cluster as local processes on 127.0.0.1, with a watchdog.

Every task is `python -m estimator_dist train ...` with its own TF_CONFIG and a
free loopback port. Output lines are prefixed with the task name. The run ends
when the chief ends: the evaluator (if any) gets time to evaluate and export the
final checkpoint, then every remaining task (ps tasks never exit by themselves)
is stopped by PID, and the chief's exit code is returned.

Signals: Ctrl-C (SIGINT) or SIGTERM to the launcher stops every task and exits 128 +
the signal's number (130, 143), as every task does. The launcher's own output may be
gone (`| tee log` killed by the same Ctrl-C): writing to it never stops the clean-up,
and each task gets SIGTERM from the kernel if the launcher dies anyway (SIGKILL).

Watchdog: a task that dies is restarted, at most --max_restarts times in all, when its
exit code says a restart can help (128-255, or killed by a signal); 1-127 is permanent
(Kubeflow's restartPolicy ExitCode rule): the cluster stops at once with that code.
Under parameter-server training a dead worker or evaluator is restarted alone
(the others carry on); a dead ps loses the variables it holds, and under
multi_worker_mirrored a dead peer hangs the others forever, so in those cases the
whole cluster is stopped and started again, resuming from the last checkpoint.
A task that exits 144 (a peer is gone) only reports another task's end: the launcher
waits PEER_LOST_SETTLE_SECONDS for that task's own exit code (a preempted rank 0's 143,
or a permanent failure that must stop the cluster) and acts on it instead.
"""
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from estimator_dist import process_temp
from estimator_dist import timers
from estimator_dist.errors import EXIT_PEER_LOST
from estimator_dist.launch import layout
from estimator_dist.launch.ports import LOOPBACK, free_ports, release_ports  # noqa: F401
from estimator_dist.distribute import role as role_lib

EXIT_CLUSTER_FAILED = 3
# SIGTERM to SIGKILL when the launcher stops a task: longer than a task that handles
# SIGTERM takes to save and exit by itself (signals.PEER_DEADLINE_S, 20 s).
STOP_GRACE_SECONDS = 25.0  # timers.py: stop_grace_s
POLL_SECONDS = 0.2
# A task's 144 says a peer ended: how long the launcher waits for that peer's own exit code.
# Horovod rank 0, preempted, exits 143 a moment after its peers saw Horovod shut down.
PEER_LOST_SETTLE_SECONDS = 10.0  # timers.py: peer_lost_settle_s


def permanent(code: int) -> bool:
    """The rule of Kubeflow's restartPolicy ExitCode, which the TFJobs `tfjob` writes use:
    1-127 is a permanent failure (a user error, a NaN/Inf step, a full disk, a crash: a
    restart would repeat it); 128-255 (preempted 143, peer lost 144) and death by a signal
    are retried."""
    return 1 <= code <= 127


def listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((LOOPBACK, port)) == 0


@dataclass
class Task:
    """One process of the cluster.

    `kind` is what its name says (worker for worker:1). A Horovod rank has no port of
    its own: `ready` says when it reached the rendezvous, `kind` is given
    (role_lib.kind_of_rank: chief for rank 0, else worker) and `env` holds its HOROVOD_*
    variables.
    """

    name: str
    argv: List[str]
    tf_config: str
    port: Optional[int] = None
    process: Optional[subprocess.Popen] = None
    started_at: float = 0.0
    up: bool = False
    reader: Optional[threading.Thread] = field(default=None, repr=False)
    env: Dict[str, str] = field(default_factory=dict)
    ready: Optional[Callable[[], bool]] = field(default=None, repr=False)
    kind: str = ""  # chief, worker, ps or evaluator; "": its name's (layout.kind_of)
    last_line: str = ""  # its last line of output: said when it fails permanently
    lost_at: Optional[float] = None  # when the launcher saw it exit 144 (a peer is gone)

    def __post_init__(self):
        self.kind = self.kind or layout.kind_of(self.name)

    @property
    def traits(self) -> role_lib.TaskTraits:
        """What the launcher needs to know about this kind of task (role_lib.TASK_TRAITS)."""
        return role_lib.TASK_TRAITS[self.kind]


PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Loaded here: between fork and exec the child only calls it.
_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent: int):
    """preexec_fn: the kernel sends the task SIGTERM when the launcher dies (even by SIGKILL),
    so no task outlives it (they stayed alive with PPID 1, hung). SIGTERM, not SIGKILL: a
    task still saves its final checkpoint. If the launcher died before this ran, exit now."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGTERM)  # noqa: SLF001 - in the forked child, before exec


class Supervisor:
    """Starts tasks, prefixes their output, restarts the dead, stops everything at the end."""

    def __init__(self, tasks: List[Task], whole_restart: bool, max_restarts: int,
                 startup_timeout: float, final_eval_timeout: float = 600.0,
                 emit: Callable[[str], None] = print, relaunch: Optional[Callable] = None,
                 workers_exit_timeout: float = 0.0, watch: Optional[Callable[[], None]] = None,
                 drop_exhausted: bool = False):
        self.tasks = tasks
        self.whole_restart = whole_restart
        self.max_restarts = max_restarts
        self.startup_timeout = startup_timeout
        self.final_eval_timeout = final_eval_timeout
        self.emit = emit
        self.relaunch = relaunch  # () -> new task list (fresh ports) for whole restarts
        # Seconds the workers get to end by themselves once the chief is done (Horovod
        # ranks stop on the same step as rank 0, then exit); 0: stop them at once.
        self.workers_exit_timeout = workers_exit_timeout
        # Elastic runs (elastic.py): `watch` is called at every poll and raises Reform to
        # stop the cluster for a new size; with drop_exhausted a training task that exits
        # when the restarts are used up raises Reform (its slot dropped) instead of failing.
        self.watch = watch
        self.drop_exhausted = drop_exhausted
        self.restarts = 0
        self._lock = threading.Lock()
        self._output_gone = False

    def _write(self, line: str):
        """emit(line), unless the output is gone (a closed pipe: `| tee` stopped by the same
        Ctrl-C): then the line is dropped, and nothing stops the clean-up or the draining of
        the tasks' pipes (a task blocked writing to a full pipe never exits)."""
        with self._lock:
            if self._output_gone:
                return
            try:
                self.emit(line)
            except (BrokenPipeError, ValueError):  # ValueError: writing to a closed file
                self._output_gone = True
                _detach_stdout()

    def say(self, text: str):
        self._write(f"[launcher] {text}")

    def _pump(self, task: Task, stream):
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.strip():
                task.last_line = line
            self._write(f"[{task.name}] " + line)
        stream.close()

    def start(self, task: Task):
        # The task's previous process, if a signal killed it (the launcher's SIGKILL after
        # the grace, the OOM killer): it could not remove its temporary directory.
        process_temp.remove_if_killed(task.process)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **task.env}
        env.pop("TF_CONFIG", None)  # a Horovod rank must not see one (RunConfig would read it)
        if task.tf_config:
            env["TF_CONFIG"] = task.tf_config
        parent = os.getpid()
        task.process = subprocess.Popen(task.argv, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=lambda: die_with_parent(parent))
        task.started_at, task.lost_at = time.monotonic(), None
        task.up = (task.port is None and task.ready is None) or not task.traits.listens
        task.reader = threading.Thread(target=self._pump, args=(task, task.process.stdout), daemon=True)
        task.reader.start()
        self.say(f"started {task.name} pid {task.process.pid}"
                 + (f" on {LOOPBACK}:{task.port}" if task.port and task.traits.listens else ""))

    def stop_tasks(self, tasks: List[Task]):
        """SIGTERM to every task at once, SIGKILL to those alive STOP_GRACE_SECONDS later; by
        PID, never by name. All at once: multi_worker_mirrored workers stop together (their
        vote), and n tasks take one grace period, not n. A ps task only serves variables
        (checkpoints are the chief's): it is stopped once the others are gone, since the
        chief's final save reads the variables it holds (SIGTERM too: it says how it ended)."""
        alive = [t for t in tasks if t.process is not None and t.process.poll() is None]
        servers = [t.process for t in alive if t.traits.serves_forever]
        others = [t.process for t in alive if not t.traits.serves_forever]
        for group in (others, servers):
            for proc in group:
                proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timers.seconds("stop_grace_s", STOP_GRACE_SECONDS)
            for proc in group:
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
        for proc in others + servers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for task in tasks:
            process_temp.remove_if_killed(task.process)

    def stop_all(self):
        # A second Ctrl-C or SIGTERM must not cut the clean-up short and orphan tasks.
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.stop_tasks(self.tasks)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for task in self.tasks:
            if task.reader:
                task.reader.join(timeout=2)

    def _check_startup(self, task: Task):
        if task.up:
            return
        if task.ready() if task.ready else listening(task.port):
            task.up = True
        elif time.monotonic() - task.started_at > self.startup_timeout:
            where = ("reach the Horovod rendezvous" if task.ready
                     else f"start listening on {LOOPBACK}:{task.port}")
            raise ClusterFailed(f"{task.name} did not {where} within {self.startup_timeout:.0f} s "
                                f"(see its lines above); raise --startup_timeout if the machine "
                                f"is slow")

    def _restart(self, task: Task, code: int):
        if self.restarts >= self.max_restarts and self.drop_exhausted and task.traits.trains:
            raise Reform(f"{task.name} exited with code {code} and --max_restarts "
                         f"{self.max_restarts} is used up", dropped=1)
        if self.restarts >= self.max_restarts:
            raise ClusterFailed(f"{task.name} exited with code {code} and --max_restarts "
                                f"{self.max_restarts} is used up")
        self.restarts += 1
        if self.whole_restart or task.traits.serves_forever or (task.traits.chief and self.relaunch):
            self.say(f"{task.name} exited with code {code}; restarting the whole cluster from the "
                     f"last checkpoint (restart {self.restarts}/{self.max_restarts})")
            self.stop_all()
            if self.relaunch:  # fresh ports: the old ones are free again only now
                stopped, self.tasks = self.tasks, self.relaunch()
                release_tasks_ports(stopped)
            for t in self.tasks:
                self.start(t)
        else:
            self.say(f"{task.name} exited with code {code}; restarting it "
                     f"(restart {self.restarts}/{self.max_restarts})")
            self.start(task)

    def _failed(self, task: Task, code: int) -> int:
        """A task failed permanently (permanent()): the cluster ends at once with its code."""
        if task.reader:
            task.reader.join(timeout=2)  # its last line, read to the end
        self.say(f"{task.name} exited with code {code}, a permanent failure (1-127: a restart "
                 f"would repeat it); stopping the cluster"
                 + (f". Its last line: {task.last_line.strip()}" if task.last_line else ""))
        self.stop_all()
        return code

    def _workers_ended_cleanly(self) -> bool:
        """Wait for the workers to exit by themselves; False if one failed or had to be stopped."""
        deadline = time.monotonic() + self.workers_exit_timeout
        workers = [t for t in self.tasks if t.traits.trains and not t.traits.chief]
        while time.monotonic() < deadline and any(t.process.poll() is None for t in workers):
            time.sleep(POLL_SECONDS)
        clean = True
        for task in workers:
            code = task.process.poll()
            if code is None:
                self.say(f"{task.name} did not end within {self.workers_exit_timeout:.0f} s of "
                         f"the chief; stopping it")
            elif code != 0:
                self.say(f"{task.name} exited with code {code} after the chief finished")
            clean = clean and code == 0
        return clean

    def _finish(self, chief: Task) -> int:
        if self.workers_exit_timeout and not self._workers_ended_cleanly():
            self.stop_all()
            return EXIT_CLUSTER_FAILED
        evaluator = next((t for t in self.tasks if t.traits.evaluates), None)
        if evaluator and evaluator.process.poll() is None:
            self.say("chief finished; waiting for the evaluator's final evaluation and export")
            deadline = time.monotonic() + self.final_eval_timeout
            while evaluator.process.poll() is None and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
            if evaluator.process.poll() is None:
                self.say(f"the evaluator did not finish within {self.final_eval_timeout:.0f} s; "
                         f"stopping it")
            elif evaluator.process.returncode != 0:
                self.say(f"the evaluator exited with code {evaluator.process.returncode}")
        self.stop_all()
        return chief.process.returncode

    def run(self) -> int:
        """Run the cluster; whatever ends the run (a signal, a closed output, a bug), every
        task is stopped before this returns."""
        try:
            return self._run()
        finally:
            self.stop_all()
            release_tasks_ports(self.tasks)

    def _next_exit(self):
        """(task, exit code) the launcher acts on now, or None. A 144 (a peer is gone) waits
        PEER_LOST_SETTLE_SECONDS for the exit it reports while other tasks still train."""
        now, lost = time.monotonic(), None
        for task in self.tasks:
            code = task.process.poll()
            if code is None:
                self._check_startup(task)
            elif code == EXIT_PEER_LOST:
                task.lost_at = task.lost_at or now
                lost = task if lost is None or task.lost_at < lost.lost_at else lost
            elif code != 0 or task.traits.chief:  # a worker's 0: done, the chief ends the run
                return task, code
        if lost is None:
            return None
        training = [t for t in self.tasks if t.traits.trains and t.process.poll() is None]
        settle = timers.seconds("peer_lost_settle_s", PEER_LOST_SETTLE_SECONDS)
        if training and now - lost.lost_at < settle:
            return None
        return lost, EXIT_PEER_LOST

    def _run(self) -> int:
        for task in self.tasks:
            self.start(task)
        try:
            while True:
                time.sleep(POLL_SECONDS)
                exited = self._next_exit()
                if exited is None:
                    if self.watch:  # after the exits: a chief that finished ends the run
                        self.watch()
                    continue
                task, code = exited
                if task.traits.chief and code == 0:
                    return self._finish(task)
                if permanent(code):
                    return self._failed(task, code)
                self._restart(task, code)
        except Reform as e:
            self.say(f"{e.reason}: stopping every task at its next step to re-form")
            raise
        except ClusterFailed as e:
            self.say(f"error: {e}")
            self.stop_all()
            return EXIT_CLUSTER_FAILED
        except KeyboardInterrupt as e:
            signum = getattr(e, "signum", signal.SIGINT)
            self.say(f"{signal.Signals(signum).name}; stopping every task")
            self.stop_all()
            return 128 + signum


def release_tasks_ports(tasks: List[Task]):
    """Stop holding the tasks' ports (ports.py): once the tasks are gone for good."""
    release_ports([task.port for task in tasks if task.port])


class ClusterFailed(Exception):
    """The cluster cannot finish: a task never came up, or restarts are used up."""


class Reform(Exception):
    """An elastic cluster must stop (every task stopped as on SIGTERM: a checkpoint of the
    step they stop at) and start again at another size; `dropped`: slots lost for good."""

    def __init__(self, reason: str, dropped: int = 0):
        super().__init__(reason)
        self.reason = reason
        self.dropped = dropped
        self.at = time.time()


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM to the launcher: the run ends with 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def install_signal_handlers():
    """SIGTERM behaves like Ctrl-C (the supervisor stops every task) but exits 143, as a
    task does on SIGTERM (it exited 130)."""

    def handler(signum, frame):
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _detach_stdout():
    """Point fds 1 and 2 at /dev/null once the output is gone, so that Python's flush at exit
    does not fail (and print a BrokenPipeError) after the run ended cleanly."""
    same = os.path.sameopenfile(1, 2) if _is_open(2) else False
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2) if same else (1,):
        os.dup2(devnull, fd)
    os.close(devnull)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
