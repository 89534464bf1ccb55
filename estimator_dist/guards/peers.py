"""A lost multi_worker_mirrored peer: every worker exits retryable, so that the cluster restarts.

Under multi_worker_mirrored every step all-reduces with every worker. Kubeflow's
operator recreates a failed pod ALONE: the new worker cannot join the collective
its old self left, and the others wait in it forever (a chief waited 150 s+ at its
step, measured; `CommunicationOptions(timeout_seconds=15)` on the strategy did not
end that wait under Estimator, one run measured). So:
- a training step (session run) that has not returned after `limit` seconds
  (StallHook: the longest of PEER_STALL_MIN_S, STALL_FACTOR times the longest step
  after the first, twice the first, which includes the warm-up and the peers'
  start; the first step itself: FIRST_STEP_LIMIT_S) exits EXIT_PEER_LOST at once with
  one line; the time between steps (checkpoint saves) does not count;
- a step that fails because a peer went away (a cancelled, unavailable, aborted or
  timed-out collective: the recreated worker's first step) is that same exit.
EXIT_PEER_LOST is >= 128: the operator (restartPolicy ExitCode) and `cluster` restart
the task, and once every task has restarted they resume together from the last
checkpoint.
"""
import threading
import time
from typing import Optional

import tensorflow as tf

from estimator_dist import timers
from estimator_dist.compat import internals
from estimator_dist.guards import signals
from estimator_dist.guards import stop_messages
from estimator_dist.errors import EXIT_PEER_LOST, ReportedError, message, op_error_line

PEER_STALL_MIN_S = 60.0  # timers.py: peer_stall_min_s
# A parameter_server worker whose session is not ready after this long: its ps tasks (or the
# chief) are gone or never came (under Slurm no launcher stops it: it waited forever).
SESSION_DEADLINE_S = 900.0  # timers.py: session_deadline_s
ALL_REDUCE_PEER = ("a peer worker is gone (a worker restarted alone cannot rejoin the others' "
                   "all-reduce)")
PS_PEER = "a ps task (or the chief) is gone"
# The first step waits for every peer to start (a pod may wait for its node or image).
FIRST_STEP_LIMIT_S = 900.0
STALL_FACTOR = 20
# What a step ends with when a peer is gone or was replaced.
PEER_ERRORS = (tf.errors.CancelledError, tf.errors.UnavailableError, tf.errors.AbortedError,
               tf.errors.DeadlineExceededError)
# A worker recreated alone meets its group's leader, which still knows its old self:
# FailedPreconditionError "... current incarnation doesn't match with one in the group".
INCARNATION = "incarnation"
# What a Horovod rank's collective fails with once another rank has ended (preempted,
# crashed or failed): Horovod's own message (its SHUT_DOWN_ERROR), an UnknownError; or,
# when the rank was moving data with it at that moment, gloo's transport error ("[.../gloo/
# transport/tcp/pair.cc:589] Read error [127.0.0.1]:25523: Connection reset by peer").
HOROVOD_SHUT_DOWN = "Horovod has been shut down"
GLOO_TRANSPORT = "gloo/transport/"


# TensorFlow creates a session again at once when creating it failed for a peer's sake: about
# 12 tries a second (a 2-worker digits chief, measured), one core busy for as long as the peer
# is gone (a launcher's 20 s stop, an orchestrator's restart). Between tries: a pause doubling
# from RETRY_PAUSE_FIRST_S up to RETRY_PAUSE_MAX_S, so a peer back soon is joined soon.
RETRY_PAUSE_FIRST_S = 0.1
RETRY_PAUSE_MAX_S = 2.0


def retry_pause(failures: int) -> float:
    """Seconds to wait after the `failures`th failed session creation in a row."""
    return min(RETRY_PAUSE_MAX_S, RETRY_PAUSE_FIRST_S * 2 ** (failures - 1))


def pause_between_session_retries():
    """This process's session re-creations after a lost peer wait retry_pause() each."""
    internals.pause_before_session_retries(lambda failures: time.sleep(retry_pause(failures)))


def is_peer_error(error: BaseException) -> bool:
    """A step that failed because a peer went away or was recreated alone (retryable)."""
    if isinstance(error, PEER_ERRORS):
        return True
    return isinstance(error, tf.errors.FailedPreconditionError) and \
        INCARNATION in message(error)


def is_horovod_shut_down(error: BaseException) -> bool:
    """A Horovod step that failed because another rank ended: that rank's exit says why."""
    return isinstance(error, tf.errors.OpError) and (HOROVOD_SHUT_DOWN in message(error) or
                                                     GLOO_TRANSPORT in message(error))


class PeerLost(ReportedError):
    """A multi_worker_mirrored peer or another Horovod rank is gone: retryable."""

    exit_code = EXIT_PEER_LOST


def _resume(latest) -> str:
    return (f"{stop_messages.where_to_resume(latest)}; exit code {EXIT_PEER_LOST} (retryable): "
            f"rerun every task (the TFJob operator and 'cluster' restart it) to resume from it")


def peer_failed(error: tf.errors.OpError, step, latest) -> PeerLost:
    return PeerLost(f"training stopped at step {step}: a peer worker went away or was restarted "
                    f"({op_error_line(error)}; {type(error).__name__}); {_resume(latest)}")


def rank_ended(error: tf.errors.OpError, step, latest) -> PeerLost:
    """step None: the rank had not trained yet (rank 0's resume step had not reached it)."""
    seen = HOROVOD_SHUT_DOWN if HOROVOD_SHUT_DOWN in message(error) else op_error_line(error)
    when = "before its first step" if step is None else f"at step {step}"
    return PeerLost(f"training stopped {when}: another Horovod rank ended "
                    f"({seen}; its own line says why); {_resume(latest)}")


class _StepEnded(tf.compat.v1.train.SessionRunHook):
    """The first hook of the list: the step's session run has returned."""

    def __init__(self, stall: "StallHook"):
        self._stall = stall

    def after_run(self, run_context, run_values):
        self._stall.step_ended()


def stalled(seconds: float, steps: int, latest, lost: str = ALL_REDUCE_PEER) -> PeerLost:
    return PeerLost(f"a training step has not returned for {seconds:.0f} s (after {steps} steps "
                    f"of this run): {lost}; {_resume(latest)}")


def session_not_ready(seconds: float, latest) -> PeerLost:
    return PeerLost(f"this worker's training session was not ready after {seconds:.0f} s: "
                    f"{PS_PEER} or never came; {_resume(latest)}")


def session_deadline(created, model_dir: str) -> threading.Timer:
    """Exit EXIT_PEER_LOST unless `created()` (the session exists) SESSION_DEADLINE_S from now
    (a parameter_server worker; cancel() the timer when training ends)."""
    seconds = timers.seconds("session_deadline_s", SESSION_DEADLINE_S)

    def check():
        if not created():
            signals.exit_now(session_not_ready(seconds, tf.train.latest_checkpoint(model_dir)))

    timer = threading.Timer(seconds, check)
    timer.daemon = True
    timer.start()
    return timer


class StallHook(tf.compat.v1.train.SessionRunHook):
    """Exits EXIT_PEER_LOST when a step has not returned after `limit()` seconds.

    It times the session run alone: it goes last among the hooks (its before_run is the
    last before the run) and its `ended` hook first (the first after_run). A hook that
    takes its time after a step (the bench's gate holds a worker there between bursts)
    is not a step that has not returned: timed in after_run order, it made a paused
    MWMS worker exit 144 after 60 s.
    """

    def __init__(self, model_dir: str, min_seconds: Optional[float] = None, poll_s: float = 1.0,
                 lost: str = ALL_REDUCE_PEER):
        self._model_dir = model_dir
        self._lost = lost
        self._min = (timers.seconds("peer_stall_min_s", PEER_STALL_MIN_S) if min_seconds is None
                     else min_seconds)
        self._poll = poll_s
        self._started = None  # monotonic time the step in flight started, None between steps
        self._first = None
        self._longest = 0.0
        self._steps = 0
        self._done = threading.Event()
        self._thread = None
        self.ended = _StepEnded(self)

    def limit(self) -> float:
        if self._first is None:  # the first step: peers may still be starting
            return FIRST_STEP_LIMIT_S
        return max(self._min, STALL_FACTOR * self._longest, 2 * self._first)

    def before_run(self, run_context):
        self._started = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="peer-stall", daemon=True)
            self._thread.start()

    def step_ended(self):
        if self._started is None:
            return
        took = time.monotonic() - self._started
        self._started = None
        if self._first is None:
            self._first = took
        else:
            self._longest = max(self._longest, took)
        self._steps += 1

    def end(self, session):
        self._done.set()

    def _watch(self):
        while not self._done.wait(self._poll):
            started = self._started
            if started is not None and time.monotonic() - started > self.limit():
                latest = tf.train.latest_checkpoint(self._model_dir)
                signals.exit_now(stalled(time.monotonic() - started, self._steps, latest,
                                         self._lost))
