"""The Horovod + Estimator recipe inside the training graph, done for the user.

- input: each rank reads its own shard (the input_fn gets an InputContext of
  `size` pipelines; one that takes none has its batches sharded). Every element
  carries a "real data" flag, and after the rank's input ends it yields filler
  batches flagged 0, so a rank that runs out never leaves the others waiting in
  an all-reduce (horovod#182).
- model_fn: `estimator_dist.minimize` wraps the optimizer in
  `hvd.DistributedOptimizer` (gradients averaged over the ranks) and
  all-reduces two votes with them: "my input ended" and "stop now" (rank 0's
  early stopping). A step in which any rank is out of data applies no update on
  any rank, and every rank stops after it: all end at the same global step.
  The loss Estimator reports (progress, TensorBoard) is the mean over the ranks
  with data, as under MirroredStrategy, not rank 0's alone.
- hooks: broadcast every variable from rank 0 once the session exists (fresh or
  restored), and stop every rank on the same step when a vote says so: an input ran
  out, rank 0's early stop, or SIGTERM to any rank (the guard's VOTE reaction: rank 0
  saves that step, as multi_worker_mirrored's workers do; a rank that left at once
  made rank 0's step fail, and the whole job's preemption saved nothing).
"""
import tensorflow as tf

from estimator_dist.distribute import horovod as hvd_lib
from estimator_dist.guards import memory
from estimator_dist.graph import model_fn_wrap
from estimator_dist.graph import numerics
from estimator_dist.graph import train_op as train_op_lib
from estimator_dist.errors import UserError

TRAIN = tf.estimator.ModeKeys.TRAIN
FEATURES = "estimator_dist_horovod_features"
HAS_DATA = "estimator_dist_horovod_has_data"
VOTES = "estimator_dist_horovod_votes"
STOP_REQUEST = "estimator_dist_horovod_stop_request"
# A rank's stop request: 1 for rank 0's early stop, SIGNALLED per rank that got SIGTERM;
# the all-reduced sum says both (float32 counts exactly far past any job's ranks).
SIGNALLED = 1000.0


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def train_input_fn(fn, params, rank: int, size: int, input_name: str):
    """The TRAIN input_fn of one rank: its shard, flagged, never running out.

    fn: `(mode, params, config, input_context)` with a `takes_context` attribute
    (runner.checked_input).
    """
    def input_fn(config=None):
        context = tf.distribute.InputContext(num_input_pipelines=size, input_pipeline_id=rank,
                                             num_replicas_in_sync=size)
        ds = fn(TRAIN, params, config, context)
        if not isinstance(ds, tf.data.Dataset):
            raise UserError(f"input '{input_name}' returned {type(ds).__name__}; under --strategy "
                            f"horovod an input_fn must return a tf.data.Dataset")
        memory.check_batch_fits(ds, params, input_name)
        if not fn.takes_context:  # it cannot shard itself: each rank takes every size-th batch
            ds = ds.shard(size, rank)
        return flagged(ds)

    return input_fn


def _pack(element, flag: float):
    element = element if isinstance(element, tuple) else (element,)
    features = {FEATURES: element[0], HAS_DATA: tf.constant(flag, tf.float32)}
    return (features,) + tuple(element[1:])


def _empty_batch(ds):
    """One element of zero examples shaped like ds's, or None if its spec has no fixed rank."""
    specs = tf.nest.flatten(ds.element_spec)
    if not all(isinstance(s, tf.TensorSpec) and s.shape.rank is not None for s in specs):
        return None
    return tf.data.Dataset.from_tensors(tf.nest.map_structure(
        lambda s: tf.zeros([d if d is not None else 0 for d in s.shape.as_list()], s.dtype),
        ds.element_spec))


def flagged(ds):
    """ds's elements flagged 1.0, then filler flagged 0.0 forever.

    The filler is ds's first element read again (a batch the model can run on;
    its gradients are all-reduced but never applied, its loss never reported),
    or an empty batch when ds has no element at all.
    """
    empty = _empty_batch(ds)
    first = ds.take(1) if empty is None else ds.take(1).concatenate(empty).take(1)
    filler = first.repeat().map(lambda *e: _pack(e, 0.0))
    return ds.map(lambda *e: _pack(e, 1.0)).concatenate(filler)


def unpack(features):
    """(the input's own features, the real-data flag) or (features, None) if not flagged."""
    if isinstance(features, dict) and HAS_DATA in features:
        return features[FEATURES], features[HAS_DATA]
    return features, None


class _Minimize:
    """minimize() under Horovod: average gradients over ranks, vote, apply only if all have data."""

    def __init__(self, has_data):
        self.has_data = has_data
        self.calls = 0
        self.mean_loss = None  # the loss averaged over the ranks that have data

    def __call__(self, loss, params, update_ops=None, var_list=None, optimizer=None):
        hvd = _hvd()
        self.calls += 1
        compressed = params.get("gradient_compression", "none") == "fp16"
        optimizer = hvd.DistributedOptimizer(
            train_op_lib.optimizer_for(params, optimizer),
            compression=hvd.Compression.fp16 if compressed else hvd.Compression.none,
            groups=hvd_lib.gradient_groups())
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.control_dependencies(train_op_lib.collect_update_ops(update_ops)):
            grads_and_vars = train_op_lib.gradients(optimizer, loss, var_list)
        stop_request = tf.compat.v1.placeholder_with_default(0.0, [], name=STOP_REQUEST)
        own_loss = tf.where(self.has_data > 0, tf.cast(loss, tf.float32), 0.0)
        sums = hvd.allreduce(tf.stack([1.0 - self.has_data, stop_request, own_loss,
                                       self.has_data]), op=hvd.Sum, name="estimator_dist_votes")
        votes = sums[:2]
        self.mean_loss = tf.cast(sums[2] / tf.maximum(sums[3], 1.0), loss.dtype)
        tf.compat.v1.add_to_collection(VOTES, votes)
        tf.compat.v1.add_to_collection(STOP_REQUEST, stop_request)

        def apply():
            # Every rank takes the same branch: the votes are all-reduced.
            note = " after its fp16 all-reduce (float16 overflows past 65504)" if compressed else ""
            update = optimizer.apply_gradients(
                numerics.guard(self.mean_loss, grads_and_vars, note=note), global_step=global_step)
            with tf.control_dependencies([update]):
                return tf.constant(True)

        return tf.cond(tf.equal(votes[0], 0.0), apply, lambda: tf.constant(False)).op


def wrap_model_fn(model_fn, model_name: str):
    """The model_fn of one rank: TRAIN mode goes through Horovod's minimize; others unchanged."""

    def horovod_model_fn(features, labels, mode, params, config):
        features, has_data = unpack(features)
        if mode != TRAIN:
            return _call(model_fn, features, labels, mode, params, config)
        has_data = tf.constant(1.0) if has_data is None else has_data
        handler = _Minimize(has_data)
        with train_op_lib.minimize_handler(handler):
            spec = _call(model_fn, features, labels, mode, params, config)
        if handler.calls != 1:
            raise UserError(
                f"model '{model_name}' " + ("builds its own train_op" if not handler.calls else
                                            f"calls estimator_dist.minimize {handler.calls} times")
                + "; --strategy horovod needs exactly one estimator_dist.minimize(loss, params) "
                  "call, which averages the gradients over the ranks (a model_fn that keeps "
                  "its own, a canned Estimator's included, trains under multi_worker_mirrored)")
        return spec._replace(loss=handler.mean_loss)

    return horovod_model_fn


def _call(model_fn, features, labels, mode, params, config):
    return model_fn_wrap.estimator_call(model_fn)(features, labels, mode, params, config)


class BroadcastHook(tf.compat.v1.train.SessionRunHook):
    """Rank 0's variables to every rank once the session exists, fresh or restored.

    It must come before the hooks that read the global step when the session is
    created: a rank > 0 starts from step 0 in its scratch model_dir.
    """

    def begin(self):
        hvd = _hvd()
        self._op = hvd.broadcast_global_variables(0)

    def after_create_session(self, session, coord):
        session.run(self._op)


class StopTogetherHook(tf.compat.v1.train.SessionRunHook):
    """Stops every rank after the same step: when an input ran out, rank 0 asked to stop,
    or a rank got SIGTERM.

    `should_stop` (rank 0's early stopping, or None) is asked every `every_steps`
    steps; its answer is voted in the next step, so all ranks stop after it. The
    training guard's vote (guards/training_guard.py, VOTE) sets `signalled` on SIGTERM;
    the next step's vote stops every rank after it: `stopped_at` is that step and
    `signalled_workers` how many ranks got SIGTERM (preemption_vote.preempted's line).
    """

    def __init__(self, should_stop=None, every_steps: int = 1, say=None):
        self._should_stop = should_stop
        self._every_steps = max(1, every_steps)
        self._say = say
        self._stop_wanted = False
        self.ended_at = None  # global step at which an input ran out
        self.signalled = False  # set by the SIGTERM handler
        self.stopped_at = None
        self.signalled_workers = 0

    @property
    def stopped_early(self) -> bool:
        """Whether rank 0's early-stopping decision ended training (runner's final export)."""
        return bool(getattr(self._should_stop, "fired", False))

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        votes = graph.get_collection(VOTES)
        requests = graph.get_collection(STOP_REQUEST)
        if len(votes) != 1 or len(requests) != 1:
            raise UserError("--strategy horovod: the model_fn must build its train op with "
                            "estimator_dist.minimize(loss, params)")
        self._votes, self._request = votes[0], requests[0]
        self._global_step = tf.compat.v1.train.get_global_step()
        self._last_check = None

    def before_run(self, run_context):
        request = (1.0 if self._stop_wanted else 0.0) + (SIGNALLED if self.signalled else 0.0)
        feed = {self._request: request} if request else None
        return tf.compat.v1.train.SessionRunArgs(
            {"votes": self._votes, "step": self._global_step}, feed_dict=feed)

    def after_run(self, run_context, run_values):
        out_of_data, stop = run_values.results["votes"]
        step = int(run_values.results["step"])
        if out_of_data > 0:
            self.ended_at = step
            if self._say:
                self._say(f"an input shard ran out at step {step}: every rank stops there")
            run_context.request_stop()
            return
        if stop >= SIGNALLED:
            self.signalled_workers = int(stop // SIGNALLED)
            # The step the savers' end() saves (the fetch above may precede the update).
            self.stopped_at = int(run_context.session.run(self._global_step))
            run_context.request_stop()
            return
        if stop > 0:
            run_context.request_stop()
            return
        if self._should_stop is not None and not self._stop_wanted:
            step += 1
            if self._last_check is None or step - self._last_check >= self._every_steps:
                self._last_check = step
                self._stop_wanted = bool(self._should_stop())
