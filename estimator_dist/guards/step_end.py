"""Every task of an srun step ends by itself (no launcher stops the others there).

Under the `cluster` launcher the run ends when the chief ends: the launcher then stops the ps
tasks (which serve forever) and any task still starting, by PID. Under Slurm nobody does:
`srun` waits for every task, so a parameter_server step never ended (`srun --wait` killed the
ps: FAILED, 137). So the tasks of a step tell each other through the shared model_dir: each
task but the ps writes `model_dir/.slurm/<job>.<step>.<restart>/<task>` with its exit code
when it ends, and every task but the chief watches the chief's:
- a ps exits 0 once the chief and every worker have ended (or STEP_END_GRACE_S after the
  chief, for a worker that died without a word);
- a worker (or the evaluator) still running STEP_END_GRACE_S after the chief ended exits
  with the chief's exit code (0 after a finished run: a worker still starting, waiting for
  a session it no longer needs); the evaluator of a finished run is left to its final
  evaluation and export;
- on SIGTERM (or SIGUSR1/SIGUSR2: Slurm signals every task at once) a ps waits for the chief
  to save its final checkpoint (the chief's marker), at most PS_SIGTERM_WAIT_S, then exits
  143: exiting at once, it took the variables the chief was saving with it.
Imports no TensorFlow.
"""
import contextlib
import json
import os
import shutil
import threading
import time
from typing import Callable, List, Mapping, Optional

from estimator_dist import process_temp
from estimator_dist import timers
from estimator_dist.errors import EXIT_PREEMPTED

SUBDIR = ".slurm"
# Seconds a task may go on after the chief ended before it is ended (timers.py).
STEP_END_GRACE_S = 30.0  # timers.py: step_end_grace_s
POLL_S = 0.5


def step_dir(model_dir: str, environ: Mapping[str, str] = os.environ) -> str:
    """This step's marker folder: a requeued job (SLURM_RESTART_COUNT) gets a fresh one."""
    key = ".".join(environ.get(name, "0") or "0" for name in
                   ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"))
    return os.path.join(model_dir, SUBDIR, key)


def mark(model_dir: str, task: str, code: int, environ: Mapping[str, str] = os.environ):
    """Task `task` (e.g. 'chief:0') ended with exit code `code`. Only into an existing
    model_dir: a run refused before it made one leaves none behind."""
    if not os.path.isdir(model_dir):
        return
    folder = step_dir(model_dir, environ)
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{task}.tmp{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump({"exit_code": code}, f)
        os.replace(tmp, os.path.join(folder, task))


def ended(model_dir: str, task: str, environ: Mapping[str, str] = os.environ) -> Optional[int]:
    """Task `task`'s exit code once it ended, else None."""
    try:
        with open(os.path.join(step_dir(model_dir, environ), task)) as f:
            return int(json.load(f)["exit_code"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def clear_stale(model_dir: str, environ: Mapping[str, str] = os.environ):
    """The chief, starting: other steps' markers (an earlier job, or this job before its
    requeue) are no news to anyone."""
    root = os.path.join(model_dir, SUBDIR)
    ours = os.path.basename(step_dir(model_dir, environ))
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if name != ours:
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _exit(code: int, line: str = ""):
    if line:
        with contextlib.suppress(OSError):
            os.write(2, f"estimator-dist: {line}\n".encode("utf-8", "replace"))
    process_temp.hard_exit(code)  # the main thread may be blocked in TensorFlow


class Watch:
    """A daemon thread, in every task of a step but the chief: ends this task when the run
    has ended (see the module's docstring). `exit` is `_exit` (os._exit) in real runs."""

    def __init__(self, model_dir: str, task: str, workers: List[str],
                 environ: Mapping[str, str] = os.environ, exit: Callable = _exit,
                 clock=time.monotonic):
        self.model_dir, self.task, self.workers = model_dir, task, workers
        self.environ, self._exit, self._clock = environ, exit, clock
        self.grace = timers.seconds("step_end_grace_s", STEP_END_GRACE_S, environ)
        self.signalled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-end", daemon=True)

    @property
    def is_ps(self) -> bool:
        return self.task.startswith("ps:")

    def start(self) -> "Watch":
        self._thread.start()
        return self

    def _run(self):
        chief_seen = None
        while True:
            code = ended(self.model_dir, "chief:0", self.environ)
            now = self._clock()
            if code is not None and chief_seen is None:
                chief_seen = now
            if self.is_ps and self.signalled.is_set() and code is not None:
                self._exit(EXIT_PREEMPTED)
                return
            if code is not None and self._decide(code, now - chief_seen):
                return
            time.sleep(POLL_S)

    def _decide(self, chief_code: int, since: float) -> bool:
        """Act on the chief's end `since` seconds ago; True once this task was ended."""
        late = since >= self.grace
        if self.is_ps:
            done = all(ended(self.model_dir, w, self.environ) is not None for w in self.workers)
            if done or late:
                self._exit(0 if chief_code == 0 else chief_code)
                return True
            return False
        if not late or (chief_code == 0 and self.task.startswith("evaluator:")):
            return False
        self._exit(chief_code, f"the chief ended (exit code {chief_code}) {since:.0f} s ago "
                               f"and this {self.task.split(':')[0]} had not: stopped it too"
                   if chief_code else "")
        return True

    def on_signal(self, limit_s: float, latest: Callable[[], Optional[str]]):
        """A ps on SIGTERM/SIGUSR1/SIGUSR2: exit 143 once the chief has saved and ended, at
        the latest `limit_s` seconds from now (from the signal's watcher thread)."""
        self.signalled.set()
        if not self._thread.is_alive():
            self.start()

        def give_up():
            self._exit(EXIT_PREEMPTED,
                       f"preempted: a signal stopped this ps task; the chief did not end "
                       f"within {limit_s:.0f} s; the latest checkpoint is {latest()}; exit "
                       f"code {EXIT_PREEMPTED} (retryable); rerun the step to resume")

        timer = threading.Timer(limit_s, give_up)
        timer.daemon = True
        timer.start()


_watch: Optional[Watch] = None


def start(model_dir: str, task: str, workers: List[str]) -> Watch:
    """Start this process's watch (once)."""
    global _watch  # noqa: PLW0603 - one per process, read by the ps's signal handling
    if _watch is None:
        _watch = Watch(model_dir, task, workers).start()
    return _watch


def current() -> Optional[Watch]:
    return _watch
