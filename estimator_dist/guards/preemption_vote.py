"""Preemption under multi_worker_mirrored: every worker stops at one step, then all save.

A checkpoint save there needs every worker (Keras batch norm's statistics are
all-reduced when read; a worker saving alone waits forever, measured), and a
scheduler may stop one worker or all of them. So SIGTERM only marks the worker
that got it. Every few steps all workers run one all-reduce of [SIGTERMs seen,
seconds since the last vote]: a sum above zero stops every worker after that
same step (`request_stop`), and Estimator's saver hooks, one on every worker
(the chief's into model_dir), save the final checkpoint together, as at a normal
end of training. The workers then exit 143, before TensorFlow's session teardown
(ExitAfterTheVoteHook), and a restart resumes from it.

The votes come about every VOTE_EVERY_S seconds whatever the step time: each
vote picks the steps to the next from the mean step time it summed, and since
every worker computes that from the same all-reduced numbers, they all agree.
"""
import math
import sys
import time

import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist.guards import signals
from estimator_dist.guards import stop_messages
from estimator_dist.errors import Preempted

VOTE_EVERY_S = 2.0
FIRST_VOTE_STEPS = 10
MAX_VOTE_STEPS = 10000
SCOPE = "preemption_vote"


def steps_to_next_vote(seconds_summed: float, replicas: int, steps: int) -> int:
    """Steps until the next vote: VOTE_EVERY_S of steps at the mean step time measured
    (`seconds_summed` over `replicas` for the last `steps` steps)."""
    step_seconds = seconds_summed / max(1, replicas) / max(1, steps)
    if step_seconds <= 0.0:
        return MAX_VOTE_STEPS
    return max(1, min(MAX_VOTE_STEPS, int(math.ceil(VOTE_EVERY_S / step_seconds))))


class VoteHook(tf.compat.v1.train.SessionRunHook):
    """All workers vote every few steps whether one got SIGTERM; if so all stop there.

    `signalled` is set by the SIGTERM handler; after a stop, `stopped_at` is the
    step every worker stopped at and `signalled_workers` how many got SIGTERM.
    Steps are counted from the restored global step, one per `runs_per_step`
    session runs (--accumulate_steps), so votes fall on whole steps.
    """

    def __init__(self, workers: int, runs_per_step: int = 1):
        self._workers = max(1, workers)
        self._runs_per_step = max(1, runs_per_step)
        self.signalled = False
        self.stopped_at = None
        self.signalled_workers = 0

    def begin(self):
        strategy = tf.distribute.get_strategy()
        # Each replica adds its worker's numbers: a worker with several devices counts
        # as many times.
        self._replicas = max(1, strategy.num_replicas_in_sync)
        self._global_step = tf.compat.v1.train.get_global_step()
        with tf.compat.v1.variable_scope(SCOPE, reuse=tf.compat.v1.AUTO_REUSE):
            votes = tf.compat.v1.get_variable(
                "votes", shape=[2], dtype=tf.float32, trainable=False,
                initializer=tf.compat.v1.zeros_initializer(),
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                synchronization=tf.VariableSynchronization.ON_WRITE,
                aggregation=tf.compat.v1.VariableAggregation.SUM)
        self._mine = tf.compat.v1.placeholder(tf.float32, [2], name=f"{SCOPE}/mine")

        def vote(var):
            return tf.identity(var.assign(self._mine))

        self._summed = strategy.experimental_local_results(strategy.run(vote, args=(votes,)))[0]

    def after_create_session(self, session, coord):
        self.step = int(session.run(self._global_step))
        self._runs = 0
        self._steps_since_vote = 0
        self._next_vote = FIRST_VOTE_STEPS
        self._since = time.perf_counter()

    def after_run(self, run_context, run_values):
        self._runs += 1
        if self._runs % self._runs_per_step:
            return
        self.step += 1
        self._steps_since_vote += 1
        if self._steps_since_vote < self._next_vote:
            return
        now = time.perf_counter()
        signalled, seconds = run_context.session.run(
            self._summed, {self._mine: [float(self.signalled), now - self._since]})
        if signalled > 0:
            self.stopped_at = self.step
            self.signalled_workers = int(round(signalled * self._workers / self._replicas))
            run_context.request_stop()
            return
        self._next_vote = steps_to_next_vote(seconds, self._replicas, self._steps_since_vote)
        self._steps_since_vote = 0
        self._since = time.perf_counter()


def preempted(vote: VoteHook, names_checkpoint: bool, model_dir: str) -> Preempted:
    """The one line of a worker that stopped on a vote (the chief names its checkpoint:
    Role.names_checkpoint_on_vote)."""
    step = vote.stopped_at
    who = "SIGTERM" if vote.signalled else "SIGTERM to another worker"
    if names_checkpoint:
        latest = tf.train.latest_checkpoint(model_dir)
        saved = (f"saved {latest}" if latest and latest.endswith(f"-{step}")
                 else f"no final checkpoint; {stop_messages.where_to_resume(latest)}")
    else:
        saved = f"the chief saved model.ckpt-{step} in {model_dir}"
    error = Preempted(f"{who} at step {step}: every worker stopped there "
                      f"({vote.signalled_workers} got SIGTERM); {saved}; "
                      f"{stop_messages.retry('to resume from it')}")
    error.step = step
    return error


class ExitAfterTheVoteHook(tf.compat.v1.train.SessionRunHook):
    """A task stopped by a vote exits 143 once every hook's end() has run, the voted step
    saved, instead of in TensorFlow's session close: its teardown of the input's iterator
    waits for tf.data's autotuning thread to wake (measured on a lone chief: 8.7 to over 20
    s, past the peer deadline 3 times in 5, which then exited saying "no final checkpoint"
    beside the one it had saved)."""

    def __init__(self, vote: VoteHook, names_checkpoint: bool, model_dir: str):
        self._vote, self._names_checkpoint, self._model_dir = vote, names_checkpoint, model_dir

    def after_create_session(self, session, coord):
        internals.before_session_close(session, self.exit_if_voted)

    def exit_if_voted(self):
        """Exit 143 if a vote stopped training (its step saved by then: the savers' end()
        ran); also from an evaluation that the final save started (EvaluationStopHook)."""
        if self._vote.stopped_at is None or sys.exc_info()[0] is not None:
            return  # not a vote's stop, or a failure on its way out: the guard says it
        signals.exit_from_main_thread(
            preempted(self._vote, self._names_checkpoint, self._model_dir))
