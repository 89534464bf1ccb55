"""Applying a step's gradients, at once or every K micro-batches (`--accumulate_steps K`).

With K > 1 each session run (one micro-batch of `--batch_size` examples) adds
n x (its mean gradient) to local accumulators and n to an example count; every
K-th run also applies sum / count with the optimizer and zeroes the
accumulators. The applied gradient is the example-weighted mean over the K
micro-batches, i.e. the gradient of the mean loss over all their examples: one
update equals one step on a K times larger batch (exactly so for models
without batch norm).

global_step counts applied updates, not micro-batches. `--train_steps` is the
number of updates, each consuming K x batch_size examples; learning-rate
schedules, checkpoint and evaluation intervals are in updates too. A checkpoint
is only written after a run that moved global_step, i.e. right after an
update, so the accumulators are local variables that are never saved and
checkpoints interchange with runs without accumulation. A run that stops
mid-cycle (the input ran out) drops that cycle's partial sums.

Batch norm: the update ops run on every micro-batch, so the moving statistics
move K times per update, each time from one micro-batch's statistics; the
forward pass, too, normalizes with micro-batch statistics.

Under a tf.distribute strategy (mirrored) each replica keeps its own sums in
sync-on-read variables; at the update the example counts are all-reduced and
the optimizer's own all-reduce adds up the replicas' sums, so replicas
communicate once per update, not per micro-batch.

The K-th run is chosen by `AccumulateHook`, which adds the update to that run's
fetches: the update happens in the same session run as the last micro-batch.
"""
import tensorflow as tf

from estimator_dist.graph import numerics

# Every replica's update-and-reset op (replicas build their own; the hook runs all).
UPDATE_COLLECTION = "estimator_dist_accumulated_updates"


def trainable(var_list=None):
    """`var_list`, or every trainable variable as the optimizer's minimize() would take."""
    if var_list is None:
        var_list = (tf.compat.v1.trainable_variables()
                    + tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES))
    return list(dict.fromkeys(var_list))


def gradients(loss, var_list):
    """The gradients of `loss` for `var_list`.

    Plain tf.gradients on purpose: the optimizer's compute_gradients divides the
    loss by the replica count under a strategy, and accumulation sums replicas itself.
    """
    return tf.compat.v1.gradients(loss, var_list)


def build_train_op(optimizer, grads_and_vars, num_examples, accumulate_steps=1, update_ops=(),
                   loss=None):
    """The train op (and session hooks) that applies `grads_and_vars`.

    Args:
      optimizer: a tf.compat.v1.train optimizer.
      grads_and_vars: the mean gradient over this step's `num_examples` examples.
      num_examples: scalar tensor; weighs this micro-batch when accumulating.
      accumulate_steps: K; 1 applies at once.
      update_ops: run with every micro-batch (batch-norm statistics).
      loss: this (micro-)batch's loss; it and every gradient must be finite for
        the run to add or apply anything (numerics.guard).
    Returns:
      (train_op, hooks).
    """
    global_step = tf.compat.v1.train.get_or_create_global_step()
    if accumulate_steps == 1:
        with tf.control_dependencies(list(update_ops)):
            checked = numerics.guard(loss, grads_and_vars, num_examples)
            return optimizer.apply_gradients(checked, global_step=global_step), []
    numerics.require_gradients(grads_and_vars)
    pairs = [(g, v) for g, v in grads_and_vars if g is not None]
    count = tf.cast(num_examples, tf.float32)
    with tf.compat.v1.variable_scope("accumulate", reuse=tf.compat.v1.AUTO_REUSE):
        sums = [_local_zeros(_base_name(v), v.shape, v.dtype) for _, v in pairs]
        examples = _local_zeros("examples", [], tf.float32)
    # Checked after weighting: an empty micro-batch's NaN mean is zeroed, not an error.
    weighted = numerics.guard(loss, [(_weighted(g, count), v) for g, v in pairs], count)
    adds = [s.assign_add(g) for s, (g, _) in zip(sums, weighted)]
    with tf.control_dependencies(list(update_ops)):
        accumulate_op = tf.group(*adds, examples.assign_add(count), name="accumulate")
    with tf.control_dependencies([accumulate_op]):
        local_total = examples.read_value()
        totals = [s.read_value() for s in sums]
    # A name scope of its own: under mirrored this all-reduce's merge_call would
    # otherwise take the name scope Adam's beta1_power is then named after.
    with tf.name_scope("accumulate"):
        total = tf.maximum(_sum_over_replicas(local_total), 1.0)
    mean = [(t / tf.cast(total, t.dtype), v) for t, (_, v) in zip(totals, pairs)]
    update = optimizer.apply_gradients(numerics.guard(None, mean), global_step=global_step)
    with tf.control_dependencies([update]):
        reset = tf.group(*[s.assign(tf.zeros_like(s)) for s in sums + [examples]],
                         name="accumulated_update")
    tf.compat.v1.add_to_collection(UPDATE_COLLECTION, reset)
    return accumulate_op, [AccumulateHook(accumulate_steps)]


def _base_name(var):
    return var.name.split(":")[0]


def _local_zeros(name, shape, dtype):
    """A per-replica local variable (never checkpointed), zero at session start."""
    return tf.compat.v1.get_variable(
        name, shape=shape, dtype=dtype, initializer=tf.compat.v1.zeros_initializer(),
        trainable=False, collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM)


def _weighted(grad, count):
    """count x grad as a dense tensor; exactly zero for an empty micro-batch (its mean may be NaN)."""
    grad = tf.convert_to_tensor(grad)
    return tf.where(count > 0, grad * tf.cast(count, grad.dtype), tf.zeros_like(grad))


def _sum_over_replicas(value):
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return value
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)


class AccumulateHook(tf.compat.v1.train.SessionRunHook):
    """Adds the accumulated update to every K-th run's fetches.

    Runs are counted from session creation, when the accumulators are
    (re)initialized as local variables, so count and sums always agree.
    """

    def __init__(self, accumulate_steps: int):
        self._k = accumulate_steps
        self._runs = 0
        self._update = None

    def begin(self):
        self._update = tf.group(*tf.compat.v1.get_collection(UPDATE_COLLECTION))

    def after_create_session(self, session, coord):
        self._runs = 0

    def before_run(self, run_context):
        self._runs += 1
        if self._runs % self._k:
            return None
        return tf.compat.v1.train.SessionRunArgs(self._update)
