"""TF1's synchronous parameter servers: a model_fn's tf.compat.v1.train.SyncReplicasOptimizer.

The TF1 pattern: wrap the optimizer in `SyncReplicasOptimizer(opt, replicas_to_aggregate=W,
total_num_replicas=W)` and return `opt.make_session_run_hook(config.is_chief)` in the
EstimatorSpec's training_hooks. It is between-graph replication: every worker builds its own
graph against variables on the ps tasks, which is `--strategy none` with ps tasks in TF_CONFIG
(or one local process). Under a tf.distribute strategy (parameter_server, mirrored, ...) its
apply_gradients fails inside the strategy ("`colocate_vars_with` must only be passed a
variable created in this tf.distribute.Strategy.scope()"), and tower, accumulation and
Horovod apply gradients themselves: refused there with one line saying where it runs.

Shutdown: the chief's queue runner waits in the gradient accumulators for the next step's
gradients, which never come once training ends; the session's coordinator then waited its
120 s grace period and the thread printed a CancelledError traceback when the session
closed. QuietShutdownHook ends that wait quietly at once.
"""
from typing import Optional

import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist.graph import model_fn_wrap
from estimator_dist.errors import UserError


def refusal(setting: str) -> UserError:
    return UserError(f"tf.compat.v1.train.SyncReplicasOptimizer does not run with {setting}: "
                     f"it is TF1's between-graph replication, which runs with ps tasks and "
                     f"--strategy none (estimator-dist cluster --workers N --ps M --strategy "
                     f"none); or drop it and keep {setting} with estimator_dist.minimize(loss)")


def _sync_hooks(spec):
    return [h for h in spec.training_hooks if internals.is_sync_replicas_hook(h)]


def checked(model_fn, refused_by: Optional[str]):
    """model_fn (full signature) whose SyncReplicasOptimizer is refused when a setting rules it
    out (`refused_by`: strategies.sync_replicas_refused_by), and whose chief shuts its queue
    runner down quietly.

    Innermost, next to the user's function: it must see the spec before tower, accumulation
    or Horovod reject its own train_op, and the optimizer's own error under a strategy.
    """
    def sync_checked_model_fn(features, labels, mode, params, config=None):
        try:
            spec = model_fn(features, labels, mode, params, config)
        except Exception as e:  # noqa: BLE001 - only its own failure is turned into the line
            if refused_by and internals.raised_by_sync_replicas(e):
                raise refusal(refused_by) from None
            raise
        hooks = _sync_hooks(spec) if mode == model_fn_wrap.TRAIN else []
        if hooks and refused_by:
            _mark_built_ops_used(hooks)
            raise refusal(refused_by)
        if not hooks:
            return spec
        return spec._replace(training_hooks=list(spec.training_hooks) +
                             [QuietShutdownHook(h) for h in hooks])

    return sync_checked_model_fn


def _mark_built_ops_used(hooks):
    """The refused graph is never run: without this TensorFlow logs an "Object was never used"
    stack (of the optimizer's readiness check) under the one-line refusal."""
    for hook in hooks:
        ready = getattr(internals.sync_optimizer_of(hook), "ready_for_local_init_op", None)
        if hasattr(ready, "mark_used"):
            ready.mark_used()


class QuietShutdownHook(tf.compat.v1.train.SessionRunHook):
    """Ends the chief's SyncReplicasOptimizer queue runner quietly when training ends.

    Its thread is blocked in a session run that only the session's close cancels. At end()
    (before the session closes) the thread is let go from the coordinator, whose close would
    wait 120 s for it, and a CancelledError becomes the queue runner's normal end instead of
    a thread traceback. Private attributes of TensorFlow 1's queue runner and coordinator
    (compat/internals.py): there is no public way to do either.
    """

    def __init__(self, sync_hook):
        self._sync_hook = sync_hook
        self._coord = None

    def after_create_session(self, session, coord):
        self._coord = coord

    def end(self, session):
        runner = internals.sync_queue_runner(self._sync_hook)  # set on the chief only
        if runner is None or self._coord is None:
            return
        internals.end_queue_runner_quietly(runner, self._coord)
