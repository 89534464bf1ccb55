"""How a process reacts to a signal: the handlers, their watcher thread and the deadline.

Schedulers preempt with SIGTERM and a grace period before SIGKILL (Kubernetes:
30 s by default). By default Python dies on SIGTERM at once, losing every step
since the last periodic checkpoint. During training the signal only sets a flag;
after the session run in flight, the training guard's GuardHook saves a checkpoint
with Estimator's own saver and exits 143, skipping the evaluation and
export that a normal end of training would start (they could outlast the grace
period). An evaluation in flight between two training steps is cut short before its
next batch (EvaluationStopHook). The process exits 143 (128 + SIGTERM), the code
schedulers treat as retryable, and rerunning the same command resumes from that
checkpoint. Ctrl-C (SIGINT) in a local run does the same and exits 130: it used to
drop every step since the last periodic checkpoint.

In a cluster the chief (the one task that writes checkpoints) does the same when
it saves alone (parameter servers), but its step in flight waits for its
peers, which a scheduler may be stopping at the same moment: so a deadline
(`PEER_DEADLINE_S`, `exit_by_deadline`) starts with the signal, after which the task
exits 143 at once, as it did by default. Under multi_worker_mirrored, whose saves need
every worker, the workers vote to stop at one step and save it together
(preemption_vote.py), within the same deadline; Horovod's ranks vote the same way
inside their gradient all-reduce (training/horovod_train.py), rank 0 saving. The
evaluator, ps tasks and the workers of parameter-server training write no checkpoint:
they exit 143 at once (the evaluator removing an export it was writing), from the
thread that reads the signal, never by raising from a signal handler into TensorFlow
(`exit_now`). Every
role: one line (stop_messages.py builds it), exit 143.

The reactions, named for what the process does on SIGTERM (SIGUSR1, SIGUSR2), each
while inside its `with` block but the first:
- `exit_on_sigterm_by_default()`: a `train` process's reaction from its start, before
  TensorFlow is imported, and whenever no block below reacts: one line, exit 143;
- `exit_on_sigterm(make_error)`: one line, exit at once from the watcher thread,
  whatever the main thread is doing (start-up, a task that writes no checkpoint);
- `raise_on_sigterm(make_error)`: raise the error in the main thread, so that the
  cleanup of what is being written runs (a command, the chief's final evaluation or
  export);
- `call_on_sigterm(callback)` (`call_on_signal` for any signal): call `callback` in the
  main thread and, with at_once, another from the watcher thread (the training guard).
"""
import contextlib
import os
import signal
import sys
import threading

from estimator_dist import errors
from estimator_dist import process_temp
from estimator_dist.guards import stop_messages

# A cluster chief's time from SIGTERM to exit, at most: under Kubernetes' default grace
# period (30 s) before SIGKILL.
PEER_DEADLINE_S = 20.0  # timers.py: peer_deadline_s


# Signals that stop a run as SIGTERM does (a final checkpoint, exit 143): Slurm's pre-timeout
# warning (`--signal=USR1@N`, `scancel --signal=USR1`) killed a run at once (exit 138).
SAVE_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def exit_on_sigterm_by_default():
    """`train` until its own SIGTERM handling starts (importing TensorFlow alone takes
    seconds), and after it: one line and exit 143, as later; it died by the raw signal
    (-15). A plain handler, for the process's life (the blocks below put it back when they
    end): the main thread runs Python while it imports, and no thread is started yet."""
    def handler(signum, frame):
        os.write(2, f"estimator-dist: preempted: {errors.OUTSIDE_THE_RUN}\n".encode())
        process_temp.hard_exit(errors.EXIT_PREEMPTED)  # nothing written yet

    # SIGUSR1/SIGUSR2 too: Slurm's pre-timeout warning stops a run as SIGTERM does.
    for signum in SAVE_SIGNALS:
        signal.signal(signum, handler)


@contextlib.contextmanager
def call_on_sigterm(callback, enabled: bool = True, at_once=None, pass_signum: bool = False):
    """Call `callback()` on SIGTERM, SIGUSR1 or SIGUSR2 (SAVE_SIGNALS) while inside (main
    thread only; elsewhere a no-op). See call_on_signal."""
    with call_on_signal(SAVE_SIGNALS, callback, enabled, at_once, pass_signum):
        yield


@contextlib.contextmanager
def call_on_signal(signums, callback, enabled: bool = True, at_once=None,
                   pass_signum: bool = False):
    """Call `callback()` (`callback(signum)` with pass_signum) on signal `signums` (one or a
    tuple) while inside (main thread only; elsewhere a no-op).

    at_once: also called, from a watcher thread, the moment SIGTERM arrives. Python runs
    `callback` only when the main thread next runs Python code, which a call blocked in
    TensorFlow's C++ can put off forever (a chief's session waiting for a parameter
    server that never comes was alive 60 s after SIGTERM, until SIGKILL; measured).
    """
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = (signums,) if isinstance(signums, int) else tuple(signums)

    def handler(signum, _frame):
        return callback(signum) if pass_signum else callback()

    previous = {s: signal.signal(s, handler) for s in signums}
    watch = SignalWatch(signums, at_once) if at_once else None
    # Without at_once, an enclosing SignalWatch (exit_on_sigterm) must not act on it too.
    muted = None if at_once else signal.set_wakeup_fd(-1)
    try:
        yield
    finally:
        if watch:
            watch.close()
        if muted is not None:
            signal.set_wakeup_fd(muted, warn_on_full_buffer=False)
        for s, handler_before in previous.items():
            signal.signal(s, handler_before)


class SignalWatch:
    """Calls `callback()` in a daemon thread when `signum` arrives, even while the main
    thread is blocked: Python's C-level handler writes the signal's number to a wakeup
    fd (signal.set_wakeup_fd) at once, and this thread reads it. Main thread only."""

    def __init__(self, signums, callback):
        self._signums = (signums,) if isinstance(signums, int) else tuple(signums)
        self._callback = callback
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._run, name="sigterm-watch", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:  # close(): the write end is gone
                return
            if any(s in data for s in self._signums):
                self._callback()

    def close(self):
        signal.set_wakeup_fd(self._previous)
        os.close(self._write)
        self._thread.join(timeout=5)
        os.close(self._read)


@contextlib.contextmanager
def raise_on_sigterm(make_error):
    """Inside: SIGTERM raises `make_error()` in the main thread, so the cleanup of what
    is being written (storage.cleanup_on_failure) runs instead of a sudden death.

    Once raised, the block ends with that error whatever comes out of it: raised in the
    Python code pybind11 runs to build a TensorFlow error, it came out as a RuntimeError
    ("MISMATCH of original and normalized active exception types"; a chief stopped in its
    final export printed a traceback)."""
    raised = []

    def stop():
        raised.append(make_error())
        raise raised[-1]

    with call_on_sigterm(stop):
        try:
            yield
        except BaseException as e:
            if raised and e is not raised[-1]:
                raise raised[-1] from None
            raise


# What the `with` blocks around training undo on their way out (the model_dir lock, a
# worker's shadow dirs, the elastic step file's stop), which os._exit would skip: exit_now
# calls each with its error, innermost first.
_ON_EXIT_NOW = []


@contextlib.contextmanager
def on_exit_now(callback):
    """Inside: exit_now calls `callback(error)` before it exits the process."""
    _ON_EXIT_NOW.append(callback)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            _ON_EXIT_NOW.remove(callback)


def exit_now(error, cleanup=None):
    """One line, then exit with the error's code (Preempted: 143) at once: called from a
    thread (SignalWatch's), so nothing is raised into TensorFlow's C++ (an exception raised
    from a Python signal handler while TF ran a callback surfaced as pybind11's
    "error_already_set: MISMATCH" RuntimeError, exit 1: an evaluator SIGTERMed while it
    waited for a checkpoint, 5 times in 12); or from the main thread when what remains is
    TensorFlow's teardown (a vote's stop, the checkpoint written). The on_exit_now
    callbacks run first."""
    error = stop_messages.finished_instead(error)
    try:
        if cleanup:
            cleanup()
        for callback in reversed(list(_ON_EXIT_NOW)):
            with contextlib.suppress(Exception):
                callback(error)
    finally:
        line = f"estimator-dist: {error.label}: {error}\n".encode("utf-8", "replace")
        with contextlib.suppress(OSError):
            os.write(2, line)
        process_temp.hard_exit(error.exit_code)  # the main thread may be blocked in TensorFlow


def exit_from_main_thread(error):
    """exit_now from the main thread, its buffered output flushed first (the progress lines)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    exit_now(error)


@contextlib.contextmanager
def exit_on_sigterm(make_error, cleanup=None):
    """Inside: SIGTERM is `exit_now(make_error())`, whatever the main thread is doing."""
    with call_on_sigterm(lambda: None, at_once=lambda: exit_now(make_error(), cleanup)):
        yield


def exit_by_deadline(seconds: float, latest):
    """Exit 143 in `seconds` unless the process ends first (a daemon timer; `latest()` names
    the checkpoint a rerun resumes from)."""
    def give_up():
        sys.stderr.write(f"estimator-dist: preempted: "
                         f"{stop_messages.deadline_passed(seconds, latest())}\n")
        sys.stderr.flush()
        process_temp.hard_exit(errors.EXIT_PREEMPTED)  # threads blocked in TF never return

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    return timer
