"""What a process stopped by a signal says: the error its one line and exit code come from.

Each line names the signal, what was saved (or why nothing was), the checkpoint a rerun
resumes from and the exit code: 143 (retryable) for SIGTERM, SIGUSR1 and SIGUSR2, 130 for
Ctrl-C. signals.py decides when a process stops; these say how it reports it. A cluster
task stopped after its chief finished the run reports that instead (`finished_instead`).
"""
import signal

from estimator_dist.errors import (EXIT_INTERRUPTED, EXIT_PREEMPTED, OUTSIDE_THE_RUN, Interrupted,
                                   Preempted)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


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


def deadline_passed(seconds: float, checkpoint) -> str:
    """A cluster task's step in flight outlasted its deadline after SIGTERM
    (signals.exit_by_deadline)."""
    return (f"SIGTERM: the step in flight (or the session's wait for its peers) did not end "
            f"within {seconds:.0f} s (its peers may be gone); no final checkpoint; "
            f"{where_to_resume(checkpoint)}; {retry('to resume')}")


def preempted_by_peers(step, error, latest) -> Preempted:
    """After SIGTERM the step failed, its peers gone (stopped by the same scheduler)."""
    return Preempted(f"SIGTERM at step {step}: the step in flight failed ({error}), its peers "
                     f"stopping too; no final checkpoint; {where_to_resume(latest)}; "
                     f"{retry('to resume')}")


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
