"""CIFAR-10 as tf.data: the official binary files, or a synthetic stand-in of the same shape."""
import hashlib
import http.client
import os
import random
import shutil
import tarfile
import tempfile
import urllib.request
import zlib

import numpy as np
import tensorflow as tf

from estimator_dist import devices as devices_lib
from estimator_dist import reader_priority
from estimator_dist.errors import UserError
from estimator_dist.registry import register_input

HEIGHT = WIDTH = 32
CHANNELS = 3
NUM_CLASSES = 10
IMAGE_BYTES = HEIGHT * WIDTH * CHANNELS
RECORD_BYTES = 1 + IMAGE_BYTES
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILE = "test_batch.bin"
ALL_FILES = TRAIN_FILES + (TEST_FILE,)
ARCHIVE_DIR = "cifar-10-batches-bin"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"
DEFAULT_DATA_DIR = os.path.join("~", ".cache", "estimator-dist", "cifar10")
# Bounds connect and each read; a hung DNS lookup is not covered (urllib has no knob for it).
DOWNLOAD_TIMEOUT_S = 20
# Everything a failed download or a broken archive raises (offline, proxy, disk, gzip).
_FETCH_ERRORS = (OSError, ValueError, EOFError, tarfile.TarError, zlib.error,
                 http.client.HTTPException)
SERVING_FEATURES = {"image": [[HEIGHT, WIDTH, CHANNELS], "float32"]}

DECODE_CHUNK = 1000
WHOLE_SPLIT = 1 << 30  # a batch size larger than any split: the whole split as one element
EPOCHS = 1 << 40
PAD = 4
SYNTHETIC_TRAIN_EXAMPLES = 1024
SYNTHETIC_EVAL_EXAMPLES = 256
# Fixed, not params["seed"]: every worker must generate the same examples so that
# sharding splits one dataset instead of drawing N different ones.
SYNTHETIC_SEED = 1234
SYNTHETIC_NOISE = 48.0

_MISSING_HINT = ("place data_batch_1.bin..data_batch_5.bin and test_batch.bin "
                 "(from cifar-10-binary.tar.gz) in {root} or {root}/" + ARCHIVE_DIR +
                 ", or run with --synthetic to train on random data")


def _root(params):
    return os.path.abspath(os.path.expanduser(params.get("data_dir") or DEFAULT_DATA_DIR))


def find_data_dir(root):
    """The directory under `root` holding all six CIFAR-10 .bin files, or None."""
    for candidate in (root, os.path.join(root, ARCHIVE_DIR)):
        if all(os.path.isfile(os.path.join(candidate, f)) for f in ALL_FILES):
            return candidate
    return None


def _bad_size(data_dir):
    """(path, size) of the first .bin file that is not a whole number of records, or None."""
    for name in ALL_FILES:
        path = os.path.join(data_dir, name)
        size = os.path.getsize(path)
        if size == 0 or size % RECORD_BYTES:
            return path, size
    return None


def _one_line(exc):
    return " ".join(str(exc).split()) or type(exc).__name__


def _download(url, dest, expected_md5):
    """Stream `url` to `dest`, checking its md5; OSError/ValueError on any failure."""
    digest = hashlib.md5()
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, \
            open(dest, "wb") as out:
        while True:
            chunk = response.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != expected_md5:
        raise ValueError(f"md5 {digest.hexdigest()} != expected {expected_md5}")


def _extract(archive, dest_dir):
    """Copy the CIFAR-10 files out of `archive` into `dest_dir` under their base names only.

    Member paths are never used as output paths, so '../' entries, absolute names
    and links cannot write outside `dest_dir`.
    """
    wanted = set(ALL_FILES) | {"batches.meta.txt"}
    found = set()
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            parts = member.name.replace("\\", "/").strip("/").split("/")
            if not member.isfile() or parts[-1] not in wanted:
                continue
            if parts[:-1] not in ([], [ARCHIVE_DIR]):
                continue
            with tar.extractfile(member) as src, \
                    open(os.path.join(dest_dir, parts[-1]), "wb") as out:
                shutil.copyfileobj(src, out)
            found.add(parts[-1])
    missing = [f for f in ALL_FILES if f not in found]
    if missing:
        raise ValueError(f"archive lacks {', '.join(missing)}")


def _fetch(root, url, expected_md5):
    """Download and extract into root/cifar-10-batches-bin; nothing half-written survives."""
    os.makedirs(root, exist_ok=True)
    fd, archive = tempfile.mkstemp(dir=root, prefix=".cifar-10-binary.", suffix=".part")
    os.close(fd)
    staging = tempfile.mkdtemp(dir=root, prefix=".cifar-10-extract.")
    try:
        _download(url, archive, expected_md5)
        _extract(archive, staging)
        bad = _bad_size(staging)
        if bad:
            raise ValueError(f"archive member {os.path.basename(bad[0])} has {bad[1]} bytes, "
                             f"not a multiple of {RECORD_BYTES}")
        target = os.path.join(root, ARCHIVE_DIR)
        if not os.path.isdir(target):
            os.rename(staging, target)
        else:
            for name in os.listdir(staging):
                os.replace(os.path.join(staging, name), os.path.join(target, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if os.path.exists(archive):
            os.remove(archive)


def prepare(params):
    """Find the CIFAR-10 binary files (downloading them if absent); returns extra params.

    Raises:
      UserError: the files are absent and cannot be downloaded, fail the checksum,
        or have a size that is not a whole number of records.
    """
    extra = {"serving_features": SERVING_FEATURES, "num_classes": NUM_CLASSES}
    if params.get("synthetic"):
        return dict(extra, data_dir=params.get("data_dir") or None)
    root = _root(params)
    data_dir = find_data_dir(root)
    if data_dir is None:
        url = params.get("cifar_url") or CIFAR_URL
        md5 = params.get("cifar_md5") or CIFAR_MD5
        tf.compat.v1.logging.info("CIFAR-10 not found in %s; downloading %s", root, url)
        try:
            _fetch(root, url, md5)
        except _FETCH_ERRORS as exc:
            raise UserError(f"CIFAR-10 not found in {root} and fetching {url} failed "
                            f"({_one_line(exc)}); " + _MISSING_HINT.format(root=root)) from None
        data_dir = find_data_dir(root)
    bad = _bad_size(data_dir)
    if bad:
        raise UserError(
            f"{bad[0]} has {bad[1]} bytes, not a positive multiple of {RECORD_BYTES} "
            f"(one CIFAR-10 record): it is truncated or not from the binary archive; "
            f"delete it to re-download, or run with --synthetic")
    return dict(extra, data_dir=data_dir)


def _data_files(params, training):
    root = _root(params)
    data_dir = find_data_dir(root)
    if data_dir is None:
        raise UserError(f"CIFAR-10 not found in {root}; " + _MISSING_HINT.format(root=root))
    names = TRAIN_FILES if training else (TEST_FILE,)
    return [os.path.join(data_dir, n) for n in names]


def decode_records(raw):
    """N 3073-byte records (label byte, then CHW pixels) -> (uint8 HWC images [N,32,32,3],
    int32 labels [N])."""
    records = tf.reshape(tf.io.decode_raw(raw, tf.uint8), [-1, RECORD_BYTES])
    labels = tf.cast(records[:, 0], tf.int32)
    chw = tf.reshape(records[:, 1:], [-1, CHANNELS, HEIGHT, WIDTH])
    return tf.transpose(chw, [0, 2, 3, 1]), labels


def _class_colours():
    rng = np.random.RandomState(SYNTHETIC_SEED)
    return rng.uniform(48.0, 208.0, size=(NUM_CLASSES, CHANNELS)).astype(np.float32)


def synthetic_example(index):
    """Example `index` of the synthetic set: noise around a per-class colour (learnable labels).

    Stateless ops keyed by the index, not numpy arrays, keep the graph (and the
    graph.pbtxt Estimator writes) free of a 3 MB constant.
    """
    seed = tf.stack([tf.constant(SYNTHETIC_SEED, tf.int64), index])
    label = tf.cast(tf.random.stateless_uniform(
        [], seed=seed, minval=0, maxval=NUM_CLASSES, dtype=tf.int64), tf.int32)
    noise = tf.random.stateless_normal([HEIGHT, WIDTH, CHANNELS], seed=seed + 1)
    colour = tf.gather(tf.constant(_class_colours()), label)
    image = tf.clip_by_value(colour + SYNTHETIC_NOISE * noise, 0.0, 255.0)
    return image, label


def examples(params, training, input_context=None):
    """The split's decoded examples one by one, (uint8 or float32 [32,32,3], int32 label), in a
    fixed order; with an input_context only this pipeline's share.

    Records are decoded DECODE_CHUNK at a time: per record, the decode costs a fraction.
    """
    if params.get("synthetic"):
        start = 0 if training else SYNTHETIC_TRAIN_EXAMPLES
        count = SYNTHETIC_TRAIN_EXAMPLES if training else SYNTHETIC_EVAL_EXAMPLES
        return _shard(tf.data.Dataset.range(start, start + count), input_context) \
            .map(synthetic_example, num_parallel_calls=tf.data.AUTOTUNE)
    records = tf.data.FixedLengthRecordDataset(_data_files(params, training), RECORD_BYTES)
    return _shard(records, input_context).batch(DECODE_CHUNK).map(decode_records).unbatch()


def _shard(ds, input_context):
    """Shard the undecoded elements: each pipeline decodes only its part."""
    if input_context is not None and input_context.num_input_pipelines > 1:
        return ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds


def preprocess(images, labels, training):
    """A batch [B,32,32,3]: pad-4 random crop and flip when training; per-image standardization.

    Vectorized over the batch: each image gets its own shift (-4..4 pixels in both axes,
    zeros shifted in, as cropping a zero-padded image) and its own coin for the flip
    (uint8 pixels go into the crop as they are: it writes float32).
    """
    if training:
        n = batch_size_of(images)
        shift = lambda: tf.random.uniform([n], -PAD, PAD + 1, tf.int32)  # noqa: E731
        images = shifted_crops(images, shift(), shift(), tf.random.uniform([n]) < 0.5)
    return {"image": tf.image.per_image_standardization(tf.cast(images, tf.float32))}, labels


def batch_size_of(images):
    """The batch dimension: static when known (training batches), else a tensor.

    With static box shapes grappler's cost model can price the crop: with dynamic
    ones it logs an "Error in PredictCost()" warning that TF_CPP_MIN_LOG_LEVEL
    does not silence.
    """
    return images.shape[0] if images.shape[0] is not None else tf.shape(images)[0]


def shifted_crops(images, dy, dx, flip):
    """out[b, i, j] = images[b, i + dy[b], j + dx[b]] (0 outside), mirrored left-right where flip[b].

    One crop_and_resize with nearest sampling whose samples all land on pixel centres,
    instead of pad + two batched gathers: per 256-image batch, decoding plus the crop
    7.1-7.5 ms of CPU instead of 11.0-11.7, the whole reader 12.0 instead of 13.7
    (README "Performance"). A 1-pixel zero border keeps every real pixel strictly
    inside the sampled range, so float rounding at the edges only ever reads zeros.
    """
    n = batch_size_of(images)
    padded = tf.pad(images, [[0, 0], [1, 1], [1, 1], [0, 0]])
    dy, dx = tf.cast(dy, tf.float32), tf.cast(dx, tf.float32)
    # Normalized by the padded extent - 1 (33), a box spanning 31 pixels gives a
    # sampling step of exactly one pixel for a 32-pixel crop.
    top, bottom = (dy + 1) / (HEIGHT + 1), (dy + HEIGHT) / (HEIGHT + 1)
    left, right = (dx + 1) / (WIDTH + 1), (dx + WIDTH) / (WIDTH + 1)
    boxes = tf.stack([top, tf.where(flip, right, left), bottom, tf.where(flip, left, right)], axis=1)
    return tf.image.crop_and_resize(padded, boxes, tf.range(n), [HEIGHT, WIDTH],
                                    method="nearest", extrapolation_value=0.0)


@register_input("cifar", prepare=prepare)
def cifar_input(mode, params, input_context=None):
    """CIFAR-10 as ({"image": float32 [B,32,32,3]}, int32 [B]); batch_size is per pipeline.

    Training decodes the split (this pipeline's shard) once into memory (154 MB of
    uint8 for the whole training set) and draws batches from a new permutation every
    epoch; eval reads the test set once, in file order.
    """
    training = mode == tf.estimator.ModeKeys.TRAIN
    batch_size = int(params["batch_size"])
    if batch_size <= 0:
        raise UserError(f"batch_size {batch_size} must be > 0; fix it with --set batch_size=128")
    ds = examples(params, training, input_context)
    if training:
        ds = shuffled_batches(ds, batch_size, params.get("seed"))
    else:
        ds = ds.batch(batch_size)  # eval keeps the last, partial batch
    # Training batches all have batch_size examples: a static batch dimension.
    static = batch_size if training else None

    def augment_and_standardize(*batch):
        images, labels = gather_batch(*batch) if training else batch
        features, labels = preprocess(images, labels, training)
        features["image"].set_shape([static, HEIGHT, WIDTH, CHANNELS])
        labels.set_shape([static])
        return features, labels

    # Whole batches at a time cost a fraction of per-image work (README "Performance");
    # parallel calls and prefetch keep it off the training step, the reader's priority
    # keeps it from slowing the step down (reader_priority.py).
    nice = int(params.get("reader_nice", reader_priority.DEFAULT_NICE))
    ds = ds.map(reader_priority.lowered(augment_and_standardize, nice),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(pipeline_options())


def gather_batch(index, images, labels):
    """The examples at `index` of the split: one element of shuffled_batches."""
    return tf.gather(images, index), tf.gather(labels, index)


def shuffled_batches(examples_ds, batch_size, seed=None):
    """Endless (indices [batch_size], all images, all labels) of a split held in memory.

    The split is decoded once, into one tensor; each epoch is a new permutation of
    its indices (a full shuffle, not a buffer's), and a batch may span two epochs.
    The pixels are gathered by the caller's map function, on the reader's threads:
    the thread that assembles these elements only moves indices.
    """
    base = random.SystemRandom().randrange(1 << 31) if seed is None else int(seed)

    def epochs(images, labels):
        n = tf.shape(labels, out_type=tf.int64)[0]

        def permutation(epoch):
            return tf.random.experimental.stateless_shuffle(
                tf.range(n), seed=tf.stack([tf.constant(base, tf.int64), epoch]))

        def with_split(index):
            return index, images, labels

        order = tf.data.Dataset.range(EPOCHS).map(permutation).unbatch()
        return order.batch(batch_size, drop_remainder=True).map(with_split)

    return examples_ds.batch(WHOLE_SPLIT).flat_map(epochs)


def pipeline_options() -> tf.data.Options:
    """The reader's own threads: half the cores, one thread per op.

    By default tf.data takes a thread per core and lets each op use them all, which
    on a small machine competes with the training step for the same cores
    (ResNet-20 on 2 cores: 334 -> 283 ms of CPU per step with these settings, README
    "Performance").
    """
    options = tf.data.Options()
    options.threading.private_threadpool_size = max(1, devices_lib.available_cores() // 2)
    options.threading.max_intra_op_parallelism = 1
    # Fused into one op, the synthetic examples' map and the batch of the whole split
    # (shuffled_batches) would allocate WHOLE_SPLIT examples up front.
    options.experimental_optimization.map_and_batch_fusion = False
    return options
