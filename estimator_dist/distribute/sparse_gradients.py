"""Sparse gradients (tf.IndexedSlices: embedding, categorical and `linear_model` feature
columns, any tf.gather) under `mirrored` and `multi_worker_mirrored`.

TensorFlow 2.15 all-reduces IndexedSlices with collective all-gathers, and a graph session's
collective executor keeps each collective instance's shape from its first run: when the next
step's batch touches a different number of rows, the gather aborts ("Shape mismatch in the
collective instance ... expected shape [14] but another member in the group expected shape
[12]", at step 2; plain Estimator fails the same way). Only fixed shapes can cross a
collective, so the strategy's batch_reduce_to is wrapped:

- mirrored (one process): the slices are summed on one device (ReductionToOneDevice
  concatenates them; no collective) and copied to every replica: no dense copy of the table.
- multi_worker_mirrored: each worker scatters its slices into the variable's dense shape and
  counts the rows it touched; both go through the collective all-reduce (fixed shapes), and
  the rows some replica touched are sliced back out. The optimizer then applies the sparse
  update one device would (rows nobody touched stay as they are: momentum and Ftrl do not
  move them). The cost is the variable's dense size per step, per sparse gradient.

Dense gradients keep the strategy's own all-reduce; graphs without IndexedSlices are as
before.
"""
import copy

import tensorflow as tf

from estimator_dist.compat import internals


def reduce_exactly(strategy: tf.distribute.Strategy, across_workers: bool):
    """Make `strategy` reduce IndexedSlices exactly (see the module doc); returns it."""
    internals.replace_batch_reduce(strategy, ExactSparseReduce(strategy, across_workers))
    return strategy


class ExactSparseReduce:
    """The strategy's batch_reduce_to with IndexedSlices reduced as the module doc says.

    Estimator deep-copies the strategy (a multi-worker one through its distribute
    coordinator); the copy's reduce must be the copy's, hence __deepcopy__."""

    def __init__(self, strategy, across_workers: bool):
        self.strategy = strategy
        self.across_workers = across_workers
        self.one_device = tf.distribute.ReductionToOneDevice()

    def __deepcopy__(self, memo):
        return ExactSparseReduce(copy.deepcopy(self.strategy, memo), self.across_workers)

    def __call__(self, reduce_op, value_destination_pairs, options=None):
        strategy = self.strategy

        def reduce(pairs):
            return internals.original_batch_reduce(strategy, reduce_op, pairs, options)

        pairs = list(value_destination_pairs)
        sparse = [i for i, (value, _) in enumerate(pairs) if _is_sparse(strategy, value)]
        if not sparse:
            return reduce(pairs)
        dense = [i for i in range(len(pairs)) if i not in sparse]
        if self.across_workers:
            return _through_dense(strategy, reduce, pairs, dense, sparse)
        out = [None] * len(pairs)
        if dense:
            for i, value in zip(dense, reduce([pairs[i] for i in dense])):
                out[i] = value
        for i, value in zip(sparse, self.one_device.batch_reduce(
                reduce_op, [pairs[i] for i in sparse], options)):
            out[i] = value
        return out


def _is_sparse(strategy, value) -> bool:
    return any(isinstance(v, tf.IndexedSlices) for v in strategy.experimental_local_results(value))


def _through_dense(strategy, reduce, pairs, dense, sparse):
    """Every sparse value as (dense sum, rows touched), reduced in one batch with the dense
    ones, then sliced back into IndexedSlices on each local replica."""
    scattered = []
    for i in sparse:
        value, destination = pairs[i]
        slices = strategy.experimental_local_results(value)
        sums, touched = zip(*[_scatter(s) for s in slices])
        scattered += [(internals.per_replica(sums), destination),
                      (internals.per_replica(touched), destination)]
    reduced = reduce([pairs[i] for i in dense] + scattered)
    out = [None] * len(pairs)
    for i, value in zip(dense, reduced):
        out[i] = value
    for k, i in enumerate(sparse):
        sums = strategy.experimental_local_results(reduced[len(dense) + 2 * k])
        touched = strategy.experimental_local_results(reduced[len(dense) + 2 * k + 1])
        shape = strategy.experimental_local_results(pairs[i][0])[0].dense_shape
        out[i] = internals.mirrored([_gather(s, t, shape) for s, t in zip(sums, touched)])
    return out


def _rows(slices: tf.IndexedSlices):
    static = tf.get_static_value(slices.dense_shape)
    return int(static[0]) if static is not None else slices.dense_shape[0]


def _scatter(slices: tf.IndexedSlices):
    """This replica's slices summed into the dense shape, and how often each row occurs."""
    with tf.device(slices.values.device):
        rows = _rows(slices)
        total = tf.math.unsorted_segment_sum(slices.values, slices.indices, rows)
        touched = tf.math.unsorted_segment_sum(
            tf.ones_like(slices.indices, dtype=tf.float32), slices.indices, rows)
        return total, touched


def _gather(total, touched, dense_shape) -> tf.IndexedSlices:
    """The rows any replica touched, out of the all-reduced dense sum."""
    with tf.device(total.device):
        rows = tf.reshape(tf.where(touched > 0), [-1])
        return tf.IndexedSlices(tf.gather(total, rows), rows, dense_shape)
