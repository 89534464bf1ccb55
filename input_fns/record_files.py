"""TFRecord shards -> records: per-pipeline sharding by file, parallel interleave, shuffle.

Model Garden r1 imagenet_main.py's reader: the file list is sharded among the input
pipelines (input_context) before anything else, so each pipeline opens only its own
files (by record when there are fewer files than pipelines); training shuffles the files and a buffer of records and repeats, eval reads
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


def _pipelines(input_context):
    if input_context is None or input_context.num_input_pipelines <= 1:
        return 1, 0
    return input_context.num_input_pipelines, input_context.input_pipeline_id


def records(files, training: bool, params, input_context=None, what="records"):
    """A dataset of serialized records from this pipeline's share of `files`.

    The share: file i goes to pipeline i % num_input_pipelines. With fewer files than
    pipelines (a validation split of one shard, read by two workers) each pipeline
    reads every file and keeps record i when i % num_input_pipelines is its id:
    correct, at the cost of reading all the files, and said once in the log.
    Training: files shuffled, CYCLE_LENGTH read in parallel, records shuffled in a
    buffer of params["shuffle_buffer"], repeated. Eval: files in order, once.
    """
    files = list(files)
    count, index = _pipelines(input_context)
    by_record = count > len(files)
    if by_record:
        tf.compat.v1.logging.warning(
            "%s: %d file(s) for %d input pipelines: each reads them all and keeps 1 record "
            "in %d; write at least %d shards to split them by file", what, len(files), count,
            count, count)
    elif count > 1:
        files = files[index::count]
    ds = tf.data.Dataset.from_tensor_slices(files)
    seed = _seed(params) if training else None
    if training and not by_record:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(CYCLE_LENGTH, len(files)),
                       num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=not training or by_record)
    if by_record:
        ds = ds.shard(count, index)
    if training:
        buffer = int(params.get("shuffle_buffer") or DEFAULT_SHUFFLE_BUFFER)
        ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    return ds


def batched(ds, parse, batch_size: int, training: bool, padded: bool = False):
    """Parse each record, batch (training drops the last partial batch), prefetch; padded:
    variable-length features padded to the longest in the batch.

    Each op of the pipeline runs on one thread (r1's max_intra_op_parallelism = 1): records
    are parsed in parallel already; an op that splits its work across the cores takes
    cores from the training step's op shards (measured alone, the pipeline's CPU per image
    is the same either way, within noise).
    """
    if batch_size <= 0:
        raise UserError(f"--batch_size {batch_size}: must be > 0")
    options = tf.data.Options()
    options.threading.max_intra_op_parallelism = 1
    ds = ds.with_options(options)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not training)
    ds = ds.padded_batch(batch_size, drop_remainder=training) if padded else \
        ds.batch(batch_size, drop_remainder=training)
    return ds.prefetch(tf.data.AUTOTUNE)


def data_dir(params, input_name: str, holds: str) -> str:
    """--data_dir of a records input, or one line naming what it must hold."""
    directory = params.get("data_dir")
    if not directory:
        raise UserError(f"input '{input_name}' needs --data_dir: a directory of "
                        f"train-*/validation-* TFRecord shards {holds}")
    return str(directory)
