"""Exact data position: the training batch of global step k is a function of (seed, k) alone.

The examples of batch number n are positions n*G .. n*G+G-1 (G: the global batch) of an
endless sequence of epochs, each epoch a permutation of the N training examples drawn
from (seed, epoch); a batch may span two epochs. Whatever the number of workers and
replicas, the global batch is cut into `batch_slices` equal slices, one per replica, and
each input pipeline yields its own slices only. An input that starts at
params["start_step"] (the checkpoint's step on a resume) continues the stream at the next
example: a restart, with any worker count, neither repeats nor skips one.

The run puts into params (training/plan.py Plan.params):
  start_step        the global step the input starts at (0 for a fresh run)
  global_batch_size G, the examples of one step (of one batch, with --accumulate_steps)
  batch_slices      the slices G is cut into each step: the replicas, or 1 when the
                    input yields the whole global batch (tower, one device)
  batches_per_step  input batches per global step (--accumulate_steps)
  batch_size        one slice: G // batch_slices
Which slices a pipeline yields comes from its input_context (pipeline i of n yields
slices i*d .. i*d+d-1, d = batch_slices // n, in this order: Estimator's strategies hand
a pipeline's consecutive elements to its local replicas in turn).

Imports no TensorFlow at module level beyond what `index_batches` needs; NumPy does the
arithmetic, so `global_batch_indices` is usable (and testable) anywhere.
"""
from typing import Dict, Optional, Tuple

import numpy as np

ENDLESS = 1 << 62
# The data order of a run without --seed: every worker must draw the same permutations,
# so "no seed" cannot mean "each process its own".
DEFAULT_DATA_SEED = 0


def data_seed(params: Dict) -> int:
    seed = params.get("seed")
    return DEFAULT_DATA_SEED if seed is None else int(seed)


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of epoch `epoch` of `num_examples` examples."""
    return np.random.default_rng([seed, epoch, 1]).permutation(num_examples)


def global_batch_indices(num_examples: int, global_batch: int, seed: int,
                         batch: int) -> np.ndarray:
    """The example indices (int64 [global_batch]) of batch number `batch` of the stream."""
    if num_examples <= 0:
        raise ValueError("no examples: an empty split has no batches")
    start = batch * global_batch
    first, last = start // num_examples, (start + global_batch - 1) // num_examples
    order = np.concatenate([epoch_order(num_examples, seed, e) for e in range(first, last + 1)])
    offset = start - first * num_examples
    return order[offset:offset + global_batch].astype(np.int64)


def resolved(params: Dict, input_context=None) -> Dict:
    """params with the position keys an input called outside a run may lack: one slice per
    replica in sync (or one), slices of params["batch_size"]."""
    total = int(params.get("batch_slices") or (
        max(input_context.num_replicas_in_sync, input_context.num_input_pipelines)
        if input_context is not None else 1))
    return {**params, "batch_slices": total,
            "global_batch_size": params.get("global_batch_size") or
            int(params["batch_size"]) * total}


def layout(params: Dict, input_context=None) -> Tuple[int, int, int]:
    """(first slice, slices per step, slices in all) of this input pipeline.

    Raises:
      ValueError: the slices do not divide among the pipelines.
    """
    total = int(params.get("batch_slices") or 1)
    pipelines, index = 1, 0
    if input_context is not None and input_context.num_input_pipelines > 1:
        pipelines, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    if total % pipelines:
        raise ValueError(f"{total} batch slices do not divide among {pipelines} input pipelines")
    per = total // pipelines
    return index * per, per, total


def start_element(params: Dict, input_context=None) -> int:
    """The first element this pipeline yields: start_step's first batch, its first slice."""
    _, per, _ = layout(params, input_context)
    return int(params.get("start_step") or 0) * int(params.get("batches_per_step") or 1) * per


def element_position(params: Dict, input_context, element: int) -> Tuple[int, int, int]:
    """(batch number, first example in the batch, slice size) of this pipeline's element
    number `element` counted from the stream's start (start_element included)."""
    first, per, total = layout(params, input_context)
    global_batch = int(params["global_batch_size"])
    size = global_batch // total
    return element // per, (first + element % per) * size, size


def slice_indices(num_examples: int, params: Dict, input_context, element: int) -> np.ndarray:
    """The example indices of this pipeline's element number `element`."""
    batch, lo, size = element_position(params, input_context, element)
    indices = global_batch_indices(num_examples, int(params["global_batch_size"]),
                                   data_seed(params), batch)
    return indices[lo:lo + size]


def index_batches(num_examples: int, params: Dict, input_context=None,
                  start: Optional[int] = None):
    """An endless tf.data.Dataset of int64 [batch_size] example indices: this pipeline's
    slices of the global batches, from params["start_step"] on.

    Gather the examples with them, e.g. `ds.map(lambda i: (tf.gather(x, i), tf.gather(y, i)))`.
    """
    import tensorflow as tf

    params = resolved(params, input_context)
    size = int(params["global_batch_size"]) // layout(params, input_context)[2]
    first = start_element(params, input_context) if start is None else start

    def indices(element):
        return slice_indices(num_examples, params, input_context, int(element))

    def one(element):
        out = tf.numpy_function(indices, [element], tf.int64, stateful=False)
        out.set_shape([size])
        return out

    return tf.data.Dataset.range(first, ENDLESS).map(one)


def gathered(indices, features, labels):
    """(features, labels) batches of in-memory arrays (a dict of arrays, or one array) at
    the example indices of each element of `indices` (index_batches)."""
    import tensorflow as tf

    features = tf.nest.map_structure(tf.constant, features)
    labels = tf.constant(labels)
    return indices.map(lambda i: (tf.nest.map_structure(lambda v: tf.gather(v, i), features),
                                  tf.gather(labels, i)))
