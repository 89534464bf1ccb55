"""TFRecord shards -> records: per-pipeline sharding by file, parallel interleave, shuffle.

Model Garden r1 imagenet_main.py's reader: the file list is sharded among the input
pipelines (input_context) before anything else, so each pipeline opens only its own
files; training shuffles the files and a buffer of records and repeats, eval reads
each of its files once, in order.
"""
import random

import tensorflow as tf

from estimator_dist.errors import UserError

CYCLE_LENGTH = 10  # files read at once (r1: 10)
DEFAULT_SHUFFLE_BUFFER = 10000  # records (r1: 10,000)


def _seed(params):
    seed = params.get("seed")
    return random.SystemRandom().randrange(1 << 31) if seed is None else int(seed)


def pipeline_files(files, input_context, what: str):
    """This pipeline's files: file i goes to pipeline i % num_input_pipelines.

    Raises:
      UserError: fewer files than pipelines (a pipeline would read nothing).
    """
    files = list(files)
    if input_context is None or input_context.num_input_pipelines <= 1:
        return files
    count = input_context.num_input_pipelines
    if len(files) < count:
        raise UserError(f"{what}: {len(files)} file(s) for {count} input pipelines, which "
                        f"are sharded by file; write at least {count} shards (e.g. "
                        f"estimator-dist tfrecords --shards {count})")
    return files[input_context.input_pipeline_id::count]


def records(files, training: bool, params, input_context=None, what="records"):
    """A dataset of serialized records from this pipeline's share of `files`.

    Training: files shuffled, CYCLE_LENGTH read in parallel, records shuffled in a
    buffer of params["shuffle_buffer"], repeated. Eval: files in order, once.
    """
    files = pipeline_files(files, input_context, what)
    ds = tf.data.Dataset.from_tensor_slices(files)
    seed = _seed(params) if training else None
    if training:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(CYCLE_LENGTH, len(files)),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=not training)
    if training:
        buffer = int(params.get("shuffle_buffer") or DEFAULT_SHUFFLE_BUFFER)
        ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    return ds


def batched(ds, parse, batch_size: int, training: bool, padded: bool = False):
    """Parse each record, batch (training drops the last partial batch), prefetch; padded:
    variable-length features padded to the longest in the batch."""
    if batch_size <= 0:
        raise UserError(f"--batch_size {batch_size}: must be > 0")
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not training)
    ds = ds.padded_batch(batch_size, drop_remainder=training) if padded else \
        ds.batch(batch_size, drop_remainder=training)
    return ds.prefetch(tf.data.AUTOTUNE)
