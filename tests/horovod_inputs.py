"""Inputs for the Horovod tests, imported into every rank with `--import horovod_inputs`.

- `uneven`: one pass over the tiny data (tests/tiny_models.py) in which rank 0
  reads the first $UNEVEN_SPLIT examples and rank 1 the rest, so the ranks'
  inputs end after different numbers of batches;
- `tiny_stream`: the tiny data in order, forever, without input_context;
- `crash_once`: tiny_stream whose rank 1 kills itself once, at a given batch.
"""
import os
import signal

import tensorflow as tf

from estimator_dist.training.registry import register_input
from tiny_models import TRAIN, X, Y, prepare_tiny  # noqa: F401 - also registers tiny_v1


@register_input("uneven", prepare=prepare_tiny)
def uneven_input(mode, params, input_context=None):
    """Finite shards of different lengths when training on 2 pipelines; else all of X once."""
    x, y = X, Y
    if mode == TRAIN and input_context is not None and input_context.num_input_pipelines == 2:
        split = int(os.environ.get("UNEVEN_SPLIT", "7"))
        part = slice(0, split) if input_context.input_pipeline_id == 0 else slice(split, None)
        x, y = x[part], y[part]
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(params["batch_size"])


@register_input("tiny_stream", prepare=prepare_tiny)
def tiny_stream(mode, params):
    """The tiny data in order (forever when training); it takes no input_context.

    MirroredStrategy hands its replicas consecutive batches of one pipeline;
    under --strategy horovod each rank takes every size-th batch of it: the same
    examples per replica.
    """
    ds = tf.data.Dataset.from_tensor_slices(({"x": X}, Y))
    return (ds.repeat() if mode == TRAIN else ds).batch(params["batch_size"])


@register_input("crash_once", prepare=prepare_tiny)
def crash_once(mode, params, input_context=None):
    """tiny_stream, but rank 1 SIGKILLs itself at its batch $CRASH_AT unless $CRASH_MARKER exists.

    The marker is written just before, so the restarted job runs through.
    """
    ds = tiny_stream(mode, params)
    marker = os.environ.get("CRASH_MARKER", "")
    if mode != TRAIN or input_context is None or input_context.input_pipeline_id != 1 or \
            not marker or os.path.exists(marker):
        return ds
    crash_at = int(os.environ["CRASH_AT"])

    def die_at(index):
        if index == crash_at:
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return index

    def passthrough(index, element):
        checked = tf.numpy_function(die_at, [index], tf.int64)
        with tf.control_dependencies([checked]):
            return tf.nest.map_structure(tf.identity, element)

    return ds.enumerate().map(passthrough)
