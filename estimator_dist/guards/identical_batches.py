"""Workers fed the same batches under multi_worker_mirrored, stopped at the first step.

An input_fn that ignores its input_context (TensorFlow's official inputs do, and nothing
in TensorFlow checks) gives every worker the whole dataset in the same order when the
run is seeded: N workers then compute the same gradients, and train as one at N times
the cost.

The model_fn wrapper records a fingerprint of each replica's batch: its features and
labels serialized and hashed, ops that run only when fetched, so at the first step
alone. After that step every worker all-reduces its fingerprint in the graph, as the
preemption vote does (preemption_vote.py): each replica writes its worker's fingerprint
into its own row of a summed variable, so every worker reads the same rows and decides
the same. When two workers' batches are equal every worker raises the same UserError
before its second step: none is left waiting in a collective, and the step is not saved
(MonitoredSession runs no hook's end(), so no checkpoint save, after an exception).
"""
import collections

import tensorflow as tf

from estimator_dist.errors import UserError
from estimator_dist.graph import model_fn_wrap

FINGERPRINTS = "estimator_dist_batch_fingerprints"
SCOPE = "identical_batches"
FLAG = "--allow_identical_batches"
# The 62-bit fingerprint travels as float32 chunks, each exact (a 24-bit significand).
CHUNK_BITS = 21
CHUNKS = 3
BUCKETS = 1 << 62


def fingerprint(features, labels) -> tf.Tensor:
    """An int64 hash of a batch: equal batches give equal ones, different ones (values,
    shapes, order) differ but with a chance of 2**-62."""
    parts = [t for t in tf.nest.flatten((features, labels), expand_composites=True)
             if t is not None]
    serialized = tf.strings.join([tf.io.serialize_tensor(t) for t in parts])
    return tf.strings.to_hash_bucket_fast(serialized, BUCKETS)


def fingerprinted(model_fn):
    """A model_fn recording the fingerprint of each TRAIN batch it is given (one per
    replica, in the graph's FINGERPRINTS collection)."""
    def call(arguments, build):
        if arguments.get("mode") == model_fn_wrap.TRAIN:
            with tf.name_scope(SCOPE):
                tf.compat.v1.add_to_collection(
                    FINGERPRINTS, fingerprint(arguments.get("features"), arguments.get("labels")))
        return build()

    return model_fn_wrap.around_arguments(model_fn, call)


def chunks(value: int):
    """A fingerprint as CHUNKS float32-exact numbers."""
    mask = (1 << CHUNK_BITS) - 1
    return [float((value >> (CHUNK_BITS * i)) & mask) for i in range(CHUNKS)]


def sharing(rows, workers: int) -> int:
    """How many workers read a first batch another worker read too. rows: one per replica,
    each its worker's fingerprint (a worker's replicas are as many as any other's)."""
    per_worker = max(1, len(rows) // max(1, workers))
    counts = collections.Counter(tuple(row) for row in rows)
    return sum(count // per_worker for count in counts.values() if count > per_worker)


def identical_error(shared: int, workers: int, input_name: str) -> UserError:
    who = f"all {workers} workers" if shared == workers else f"{shared} of {workers} workers"
    return UserError(
        f"{who} read the same first batch from input '{input_name}' (its input_fn does not "
        f"shard by input_context), so they would train on the same data; give the input_fn "
        f"an input_context argument and shard its dataset: ds.shard(input_context."
        f"num_input_pipelines, input_context.input_pipeline_id), or pass {FLAG} if every "
        f"worker is meant to read the same batches")


class FirstBatchHook(tf.compat.v1.train.SessionRunHook):
    """Fetches the first replica's fingerprint in the first step, then compares every
    worker's (the module's docstring): a UserError when two are equal. Nothing after."""

    def __init__(self, workers: int, input_name: str):
        self._workers = workers
        self._input_name = input_name
        self._pending = False

    def begin(self):
        recorded = tf.compat.v1.get_collection(FINGERPRINTS)
        self._pending = bool(recorded)
        if not recorded:
            return
        self._fingerprint = recorded[0]
        strategy = tf.distribute.get_strategy()
        replicas = strategy.num_replicas_in_sync
        with tf.compat.v1.variable_scope(SCOPE, reuse=tf.compat.v1.AUTO_REUSE):
            rows = tf.compat.v1.get_variable(
                "rows", shape=[replicas, CHUNKS], dtype=tf.float32, trainable=False,
                initializer=tf.compat.v1.zeros_initializer(),
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                synchronization=tf.VariableSynchronization.ON_WRITE,
                aggregation=tf.compat.v1.VariableAggregation.SUM)
        self._mine = tf.compat.v1.placeholder(tf.float32, [CHUNKS], name=f"{SCOPE}/mine")

        def exchange(var):
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            row = tf.one_hot(replica, replicas, dtype=tf.float32)[:, None] * self._mine[None, :]
            return tf.identity(var.assign(row))

        self._rows = strategy.experimental_local_results(strategy.run(exchange, args=(rows,)))[0]

    def before_run(self, run_context):
        if self._pending:
            return tf.compat.v1.train.SessionRunArgs(self._fingerprint)
        return None

    def after_run(self, run_context, run_values):
        if not self._pending:
            return
        self._pending = False
        rows = run_context.session.run(self._rows, {self._mine: chunks(int(run_values.results))})
        shared = sharing(rows.tolist(), self._workers)
        if shared:
            raise identical_error(shared, self._workers, self._input_name)
