"""Preemption: SIGTERM during training writes a final checkpoint, then exits 143.

Schedulers preempt with SIGTERM and a grace period before SIGKILL (Kubernetes:
30 s by default). By default Python dies on SIGTERM at once, losing every step
since the last periodic checkpoint. Here the signal only sets a flag; after the
session run in flight, guards.GuardHook saves a checkpoint with Estimator's own
saver and raises Preempted, which skips the evaluation and export that a normal
end of training would start (they could outlast the grace period). An evaluation
in flight between two training steps is cut short before its next batch
(guards.EvaluationStopHook). The process exits 143 (128 + SIGTERM), the code
schedulers treat as retryable, and rerunning the same command resumes from that
checkpoint. Ctrl-C (SIGINT) in a local run does the same and exits 130: it used to
drop every step since the last periodic checkpoint.

In a cluster the chief (the one task that writes checkpoints) does the same when
it saves alone (parameter servers, Horovod), but its step in flight waits for its
peers, which a scheduler may be stopping at the same moment: so a deadline
(`PEER_DEADLINE_S`) starts with the signal, after which the task exits 143 at
once, as it did by default. Under multi_worker_mirrored, whose saves need every
worker, the workers vote to stop at one step and save it together
(preemption_vote.py), within the same deadline. The evaluator, ps tasks and the
workers of parameter-server training write no checkpoint: they exit 143 at once
(the evaluator removing an export it was writing), from the thread that reads the
signal, never by raising from a signal handler into TensorFlow (`exit_now`). Before a
run's guard takes over (start-up) and after it SIGTERM exits 143 at once too
(`exit_on_sigterm`). Every role: one line, exit 143.
"""
import contextlib
import os
import signal
import sys
import threading

import tensorflow as tf

from estimator_dist.errors import (EXIT_INTERRUPTED, EXIT_PREEMPTED, OUTSIDE_THE_RUN, Interrupted,
                                   Preempted)

CHECKPOINT_BASENAME = "model.ckpt"  # Estimator's CheckpointSaverHook name
# A cluster chief's time from SIGTERM to exit, at most: under Kubernetes' default grace
# period (30 s) before SIGKILL.
PEER_DEADLINE_S = 20.0  # timers.py: peer_deadline_s


# Signals that stop a run as SIGTERM does (a final checkpoint, exit 143): Slurm's pre-timeout
# warning (`--signal=USR1@N`, `scancel --signal=USR1`) killed a run at once (exit 138).
SAVE_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@contextlib.contextmanager
def on_sigterm(callback, enabled: bool = True, at_once=None, pass_signum: bool = False):
    """Call `callback()` on SIGTERM, SIGUSR1 or SIGUSR2 (SAVE_SIGNALS) while inside (main
    thread only; elsewhere a no-op). See on_signal."""
    with on_signal(SAVE_SIGNALS, callback, enabled, at_once, pass_signum):
        yield


@contextlib.contextmanager
def on_signal(signums, callback, enabled: bool = True, at_once=None, pass_signum: bool = False):
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
def stop_on_sigterm(make_error):
    """Inside: SIGTERM raises `make_error()` in the main thread, so the cleanup of what
    is being written (storage.cleanup_on_failure) runs instead of a sudden death."""
    def stop():
        raise make_error()

    with on_sigterm(stop):
        yield


# A cluster task's question (run.py asks it): the step at which the chief finished the run,
# or None. Asked on SIGTERM: a task stopped after that is done, not preempted.
_RUN_FINISHED = []


def when_run_finished(check):
    """Register `check() -> RunFinished or None` for finished_instead (one per process)."""
    _RUN_FINISHED[:] = [check]


def finished_instead(error):
    """RunFinished instead of a Preempted that came after the chief finished the run."""
    if not isinstance(error, Preempted) or not _RUN_FINISHED:
        return error
    try:
        finished = _RUN_FINISHED[0]()
    except Exception:  # noqa: BLE001 - an unreadable marker: preempted it is
        return error
    return error if finished is None else finished


def exit_now(error, cleanup=None):
    """One line, then exit with the error's code (Preempted: 143) at once: called from a
    thread (SignalWatch's), so nothing is raised into TensorFlow's C++ (an exception raised from a Python signal handler while TF
    ran a callback surfaced as pybind11's "error_already_set: MISMATCH" RuntimeError, exit 1:
    an evaluator SIGTERMed while it waited for a checkpoint, 5 times in 12)."""
    error = finished_instead(error)
    try:
        if cleanup:
            cleanup()
    finally:
        line = f"estimator-dist: {error.label}: {error}\n".encode("utf-8", "replace")
        with contextlib.suppress(OSError):
            os.write(2, line)
        os._exit(error.exit_code)  # noqa: SLF001 - the main thread may be blocked in TensorFlow


@contextlib.contextmanager
def exit_on_sigterm(make_error, cleanup=None):
    """Inside: SIGTERM is `exit_now(make_error())`, whatever the main thread is doing."""
    with on_sigterm(lambda: None, at_once=lambda: exit_now(make_error(), cleanup)):
        yield


def save_final_checkpoint(session, saver, model_dir: str, step: int) -> str:
    """Save model_dir/model.ckpt-<step> with Estimator's saver (unless it just did)."""
    done = [p for p in saver.last_checkpoints if p.endswith(f"-{step}")]
    if done:
        return done[-1]
    path = saver.save(session, os.path.join(model_dir, CHECKPOINT_BASENAME), global_step=step)
    with contextlib.suppress(Exception):  # best effort: keep TensorBoard's last points
        tf.compat.v1.summary.FileWriterCache.get(model_dir).flush()
    return path


def where_to_resume(checkpoint, none: str = "no checkpoint was written") -> str:
    return f"the latest checkpoint is {checkpoint}" if checkpoint else none


def retry(then: str = "", signum: int = signal.SIGTERM) -> str:
    """The end of every preemption line: the retryable exit code and what a rerun does.
    SIGINT (Ctrl-C, a local run's only): 130, what a shell reports for it."""
    code = f"{EXIT_INTERRUPTED}" if signum == signal.SIGINT else f"{EXIT_PREEMPTED} (retryable)"
    return f"exit code {code}; rerun the same command" + (f" {then}" if then else "")


def stopped_by(signum: int, message: str):
    """Preempted (SIGTERM, exit 143) or Interrupted (Ctrl-C, exit 130) with `message`, which
    follows the signal's name."""
    if signum == signal.SIGINT:
        return Interrupted(f"Ctrl-C (SIGINT) {message}")
    return Preempted(f"{signal_name(signum)} {message}")


def preempted(step: int, checkpoint, latest=None, signum: int = signal.SIGTERM):
    then = retry("to resume from it", signum)
    if checkpoint is None:
        error = stopped_by(signum, f"at step {step}: no final checkpoint (the model_fn's "
                                   f"Scaffold has its own saver); the latest is {latest}; {then}")
    else:
        error = stopped_by(signum, f"at step {step}: saved {checkpoint}; {then}")
    error.step = step
    return error


def preempted_during_evaluation(checkpoint, signum: int = signal.SIGTERM):
    """SIGTERM (or Ctrl-C) while Estimator evaluated the checkpoint it had just saved."""
    return stopped_by(signum, f"during an evaluation between training steps: stopped it (no "
                              f"metrics written); {where_to_resume(checkpoint)}; "
                              f"{retry('to resume from it', signum)}")


def export_stopped(checkpoint) -> Preempted:
    """SIGTERM while a cluster's chief (no evaluator task) exported the final checkpoint."""
    return Preempted(f"SIGTERM during the chief's final export: stopped it (the partial export "
                     f"was removed); training is done, {where_to_resume(checkpoint)}; "
                     f"{retry('to export it')}")


def final_evaluation_stopped(checkpoint) -> Preempted:
    """SIGTERM while a cluster's chief (no evaluator task) evaluated the final checkpoint."""
    return Preempted(f"SIGTERM during the chief's evaluation of the final checkpoint: stopped "
                     f"it; training is done, {where_to_resume(checkpoint)}; "
                     f"{retry('to evaluate and export it')}")


def command_stopped(command: str) -> Preempted:
    """SIGTERM to evaluate, export, predict, report or tfjob."""
    return Preempted(f"SIGTERM: '{command}' stopped; anything it was writing was removed; "
                     f"{retry()}")


def evaluator_stopped(checkpoint) -> Preempted:
    """SIGTERM to a cluster's evaluator: it stops where it is (it writes no checkpoints)."""
    return Preempted(f"SIGTERM: the evaluator stopped (an export it was writing is removed); "
                     f"{where_to_resume(checkpoint, 'no checkpoint yet')}; "
                     f"{retry('to go on evaluating')}")


def task_stopped(what: str, checkpoint) -> Preempted:
    """SIGTERM to a task that writes no checkpoint: a ps, a parameter-server worker (or a
    Horovod rank > 0); the chief saves. what: 'ps task' or 'worker' (Role.what)."""
    return Preempted(f"SIGTERM: this {what} stopped (the chief writes the checkpoints); "
                     f"{where_to_resume(checkpoint, 'no checkpoint yet')}; "
                     f"{retry('to rejoin the run')}")


def connecting_stopped(checkpoint) -> Preempted:
    """SIGTERM to a cluster task before its training session existed."""
    return Preempted(f"SIGTERM before training started (building the graph or waiting for "
                     f"the peers): nothing to save; {where_to_resume(checkpoint)}; "
                     f"{retry('to resume')}")


def outside_the_run() -> Preempted:
    """SIGTERM outside the run's guard (starting, connecting to its peers, reporting)."""
    return Preempted(OUTSIDE_THE_RUN)


def preempted_outside_training(checkpoint, signum: int = signal.SIGTERM):
    return stopped_by(signum, f"outside a training step: {where_to_resume(checkpoint)}; "
                              f"{retry('to resume', signum)}")


def exit_by_deadline(seconds: float, latest):
    """Exit 143 in `seconds` unless the process ends first (a daemon timer; `latest()` names
    the checkpoint a rerun resumes from)."""
    def give_up():
        sys.stderr.write(f"estimator-dist: preempted: SIGTERM: the step in flight (or the "
                         f"session's wait for its peers) did not end within {seconds:.0f} s (its "
                         f"peers may be gone); no final checkpoint; "
                         f"{where_to_resume(latest())}; {retry('to resume')}\n")
        sys.stderr.flush()
        os._exit(EXIT_PREEMPTED)  # noqa: SLF001 - threads blocked in TensorFlow never return

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    return timer


def preempted_by_peers(step, error, latest) -> Preempted:
    """After SIGTERM the step failed, its peers gone (stopped by the same scheduler)."""
    return Preempted(f"SIGTERM at step {step}: the step in flight failed ({error}), its peers "
                     f"stopping too; no final checkpoint; {where_to_resume(latest)}; "
                     f"{retry('to resume')}")
