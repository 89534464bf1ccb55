"""Workers fed the same examples under multi_worker_mirrored, stopped in the first steps.

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
Their labels are compared the same way a few steps later (FirstBatchHook).
"""
import collections
import hashlib
import math

import numpy as np
import tensorflow as tf

from estimator_dist.errors import UserError
from estimator_dist.graph import model_fn_wrap

FINGERPRINTS = "estimator_dist_batch_fingerprints"
LABELS = "estimator_dist_batch_labels"
SCOPE = "identical_batches"
FLAG = "--allow_identical_batches"
# The 62-bit fingerprint travels as float32 chunks, each exact (a 24-bit significand).
CHUNK_BITS = 21
CHUNKS = 3
BUCKETS = 1 << 62
LABELS_WANTED = 512
MAX_LABEL_STEPS = 64
MIN_LABEL_BITS = 64.0
# Labels in runs (sorted by class) or repeating with a short period are the same on every
# shard of an unshuffled dataset: such sequences are never compared.
MIN_LABEL_CHANGES = 64
MAX_LABEL_PERIOD = 64


def fingerprint(features, labels) -> tf.Tensor:
    """An int64 hash of a batch: equal batches give equal ones, different ones (values,
    shapes, order) differ but with a chance of 2**-62."""
    parts = [t for t in tf.nest.flatten((features, labels), expand_composites=True)
             if t is not None]
    serialized = tf.strings.join([tf.io.serialize_tensor(t) for t in parts])
    return tf.strings.to_hash_bucket_fast(serialized, BUCKETS)


def fingerprinted(model_fn):
    """A model_fn recording the fingerprint of each TRAIN batch it is given (one per
    replica, in the graph's FINGERPRINTS collection) and the first replica's labels
    (LABELS). Collections of tensors: the meta graph a checkpoint writes takes them."""
    def call(arguments, build):
        if arguments.get("mode") == model_fn_wrap.TRAIN:
            labels = arguments.get("labels")
            first = not tf.compat.v1.get_collection(FINGERPRINTS)
            with tf.name_scope(SCOPE):
                tf.compat.v1.add_to_collection(
                    FINGERPRINTS, fingerprint(arguments.get("features"), labels))
            for t in tf.nest.flatten(labels, expand_composites=True) if first else ():
                if t is not None:
                    tf.compat.v1.add_to_collection(LABELS, t)
        return build()

    return model_fn_wrap.around_arguments(model_fn, call)


def chunks(value: int):
    """A fingerprint as CHUNKS float32-exact numbers."""
    mask = (1 << CHUNK_BITS) - 1
    return [float((value >> (CHUNK_BITS * i)) & mask) for i in range(CHUNKS)]


def sharing(rows, per_worker: int) -> int:
    """How many workers read what another worker read too. rows: one per replica, each its
    worker's fingerprint (every worker has per_worker replicas)."""
    counts = collections.Counter(tuple(row) for row in rows)
    return sum(count // per_worker for count in counts.values() if count > per_worker)


def identical_error(shared: int, workers: int, input_name: str,
                    labels_over: int = 0) -> UserError:
    who = f"all {workers} workers" if shared == workers else f"{shared} of {workers} workers"
    what = (f"the same labels in the same order in their first {labels_over} steps (their "
            f"features differ: random augmentation?)" if labels_over else "the same first batch")
    return UserError(
        f"{who} read {what} from input '{input_name}' (its input_fn does not "
        f"shard by input_context), so they would train on the same data; give the input_fn "
        f"an input_context argument and shard its dataset: ds.shard(input_context."
        f"num_input_pipelines, input_context.input_pipeline_id), or pass {FLAG} if every "
        f"worker is meant to read the same examples")


class FirstBatchHook(tf.compat.v1.train.SessionRunHook):
    """Compares every worker's first batch after the first step (the module's docstring),
    and their labels after the first few: a UserError when two workers' are equal.

    A worker's first batch can differ from another's although its examples are the same:
    random augmentation drawn apart on each worker. The labels then still come in the same
    order. They are compared once LABELS_WANTED of them were read (at most
    MAX_LABEL_STEPS steps), and only when they carry MIN_LABEL_BITS of information (their
    count times the entropy of their observed frequencies), so that workers reading
    different examples cannot match by chance (a run of one class never counts), and
    change often and never repeat with a short period (label_bits).
    """

    def __init__(self, workers: int, input_name: str, batch_size: int):
        self._workers = workers
        self._input_name = input_name
        self._label_steps = max(1, min(MAX_LABEL_STEPS, math.ceil(LABELS_WANTED /
                                                                  max(1, batch_size))))
        self._runs = 0
        self._last_run = 0  # nothing to compare until begin() finds the fingerprints

    def begin(self):
        recorded = tf.compat.v1.get_collection(FINGERPRINTS)
        if not recorded:
            return
        self._fingerprint = recorded[0]
        self._labels = tf.compat.v1.get_collection(LABELS)
        self._last_run = self._label_steps if self._labels else 1
        self._label_hash = hashlib.blake2b(digest_size=8)
        self._label_keys = []
        strategy = tf.distribute.get_strategy()
        replicas = strategy.num_replicas_in_sync
        self._per_worker = max(1, replicas // max(1, self._workers))
        with tf.compat.v1.variable_scope(SCOPE, reuse=tf.compat.v1.AUTO_REUSE):
            rows = tf.compat.v1.get_variable(
                "rows", shape=[replicas, CHUNKS + 1], dtype=tf.float32, trainable=False,
                initializer=tf.compat.v1.zeros_initializer(),
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                synchronization=tf.VariableSynchronization.ON_WRITE,
                aggregation=tf.compat.v1.VariableAggregation.SUM)
        self._mine = tf.compat.v1.placeholder(tf.float32, [CHUNKS + 1], name=f"{SCOPE}/mine")

        def exchange(var):
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            row = tf.one_hot(replica, replicas, dtype=tf.float32)[:, None] * self._mine[None, :]
            return tf.identity(var.assign(row))

        self._rows = strategy.experimental_local_results(strategy.run(exchange, args=(rows,)))[0]

    def before_run(self, run_context):
        if self._runs >= self._last_run:
            return None
        fetches = {}
        if self._runs == 0:
            fetches["batch"] = self._fingerprint
        if self._labels:
            fetches["labels"] = self._labels
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        if self._runs >= self._last_run:
            return
        self._runs += 1
        results = run_values.results
        if "labels" in results:
            add_labels(results["labels"], self._label_hash, self._label_keys)
        if "batch" in results:
            rows = self._exchange(run_context, chunks(int(results["batch"])) + [0.0])
            shared = sharing(rows, self._per_worker)
            if shared:
                raise identical_error(shared, self._workers, self._input_name)
        if self._labels and self._runs == self._label_steps:
            value = int.from_bytes(self._label_hash.digest(), "little") % BUCKETS
            rows = self._exchange(run_context,
                                  chunks(value) + [label_bits(self._label_keys)])
            shared = sharing([r for r in rows if r[-1] >= MIN_LABEL_BITS], self._per_worker)
            if shared:
                raise identical_error(shared, self._workers, self._input_name,
                                      labels_over=self._runs)

    def _exchange(self, run_context, row):
        return run_context.session.run(self._rows, {self._mine: row}).tolist()


def add_labels(labels, digest, keys: list):
    """One batch's labels into the running hash and the list of each example's label."""
    arrays = [np.asarray(a) for a in labels]
    for a in arrays:
        digest.update(repr((a.dtype.str, a.shape)).encode())
        digest.update(np.ascontiguousarray(a).tobytes())
    examples = arrays[0].shape[0] if arrays[0].ndim else 1
    for i in range(examples):
        keys.append(b"".join(np.ascontiguousarray(a[i] if a.ndim else a).tobytes()
                             for a in arrays))


def label_bits(keys: list) -> float:
    """The information in a label sequence: its length times the entropy (collision
    entropy, -log2 of the chance two labels are equal) of the observed frequencies; 0 for
    a sequence that is the same on every shard of an unshuffled dataset (few changes, a
    short period)."""
    total = len(keys)
    if not total:
        return 0.0
    collision = sum((c / total) ** 2 for c in collections.Counter(keys).values())
    changes = sum(a != b for a, b in zip(keys, keys[1:]))
    periodic = any(keys[p:] == keys[:-p] for p in range(1, min(MAX_LABEL_PERIOD, total - 1) + 1))
    if collision >= 1 or changes < MIN_LABEL_CHANGES or periodic:
        return 0.0
    return float(total * -math.log2(collision))
