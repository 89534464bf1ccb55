"""`--gradient_compression fp16|bf16`: gradients cross the wire in 16 bits, are applied in float32.

Each replica's gradient (already divided by the replica count, as the tf.compat.v1
optimizers do under a strategy) is cast to the 16-bit type, summed over every
replica in that type by the strategy's all-reduce (MultiWorkerMirrored: its
collective over the network, half the bytes), and cast back. The optimizer then
applies the sum with its own update, slots and global step, skipping its own
float32 all-reduce: the values it gets are already every replica's sum. Variables,
optimizer slots and checkpoints stay float32.

The sum runs in the 16-bit type (the collective adds what it is given): float16
holds ~3 significant digits and overflows past 65504; bfloat16 keeps float32's
range with ~2 digits. Sparse gradients (IndexedSlices) are reduced uncompressed.
A gradient that overflowed the 16-bit type is caught by the non-finite guard,
named as such (numerics.py).

Horovod compresses with its own hvd.Compression.fp16 (horovod_train.py).
"""
from typing import List, Tuple

import tensorflow as tf

from estimator_dist.compat import internals

DTYPES = {"fp16": tf.float16, "bf16": tf.bfloat16}
RANGE_NOTE = {"fp16": "float16 overflows past 65504", "bf16": "bfloat16 overflowed"}


def active(setting: str) -> bool:
    """Compress here: a setting other than none, and replicas to reduce over."""
    context = tf.distribute.get_replica_context()
    return setting in DTYPES and context is not None and \
        tf.distribute.has_strategy() and context.num_replicas_in_sync > 1


def all_reduce(grads_and_vars, setting: str) -> List[Tuple]:
    """Every replica's sum of the gradients, reduced in the 16-bit type (dense ones)."""
    context = tf.distribute.get_replica_context()
    dtype = DTYPES[setting]
    dense = [i for i, (g, _) in enumerate(grads_and_vars)
             if g is not None and not isinstance(g, tf.IndexedSlices)]
    sparse = [i for i, (g, _) in enumerate(grads_and_vars) if isinstance(g, tf.IndexedSlices)]
    reduced = {}
    if dense:
        summed = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                    [tf.cast(grads_and_vars[i][0], dtype) for i in dense])
        reduced.update({i: tf.cast(s, grads_and_vars[i][0].dtype) for i, s in zip(dense, summed)})
    if sparse:
        summed = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                    [grads_and_vars[i][0] for i in sparse])
        reduced.update(zip(sparse, summed))
    return [(reduced.get(i), v) for i, (_, v) in enumerate(grads_and_vars)]


def apply_reduced(optimizer, grads_and_vars, global_step):
    """optimizer.apply_gradients for gradients every replica already holds summed: its update,
    slots and global step, without its own all-reduce."""

    def merge(distribution, pairs):
        with internals.already_reduced(distribution):
            return internals.distributed_apply(optimizer, distribution, pairs, global_step)

    return tf.distribute.get_replica_context().merge_call(merge, args=(grads_and_vars,))

