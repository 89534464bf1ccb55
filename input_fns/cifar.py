"""CIFAR-10 as tf.data: the official binary files, or a synthetic stand-in of the same shape."""
import hashlib
import http.client
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zlib

import numpy as np
import tensorflow as tf

from estimator_dist.distribute import devices as devices_lib
from estimator_dist import files
from estimator_dist.training import position, reader_priority
from estimator_dist.errors import UserError
from estimator_dist.training.registry import register_input
from input_fns import cifar_split
from input_fns.batch_limit import check_training_batch

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
ENDLESS = 1 << 62  # batches of a training pipeline
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


def _bad_label(data_dir):
    """(path, record, label) of the first record whose label byte is not a class, or None.

    Reads only the label bytes (a strided view of a memory map)."""
    for name in ALL_FILES:
        path = os.path.join(data_dir, name)
        labels = np.memmap(path, np.uint8, mode="r")[::RECORD_BYTES]
        wrong = np.flatnonzero(labels >= NUM_CLASSES)
        if wrong.size:
            return path, int(wrong[0]), int(labels[wrong[0]])
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
    """Download and extract into root/cifar-10-batches-bin; nothing half-written survives.

    On failure the directories made for root are removed again (only those, only if
    empty), so a mistyped or offline --data_dir leaves no empty tree behind.
    """
    created = files.missing_dirs(root)
    archive = staging = None
    done = False
    try:
        os.makedirs(root, exist_ok=True)
        fd, archive = tempfile.mkstemp(dir=root, prefix=".cifar-10-binary.", suffix=".part")
        os.close(fd)
        staging = tempfile.mkdtemp(dir=root, prefix=".cifar-10-extract.")
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
        done = True
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        if archive and os.path.exists(archive):
            os.remove(archive)
        if not done:
            files.remove_empty_dirs(created)


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
    wrong = _bad_label(data_dir)
    if wrong:
        raise UserError(
            f"{wrong[0]} record {wrong[1]} has label {wrong[2]}, not a class 0-{NUM_CLASSES - 1}: "
            f"it is not a CIFAR-10 binary file (or is damaged); delete it to re-download, or "
            f"run with --synthetic")
    return dict(extra, data_dir=data_dir)


def training_examples(params) -> int:
    """Examples in the training split (all pipelines), from the file sizes alone."""
    if params.get("synthetic"):
        return SYNTHETIC_TRAIN_EXAMPLES
    return sum(os.path.getsize(path) // RECORD_BYTES for path in _data_files(params, True))


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


def standardized(images, labels):
    """An eval batch: per-image standardization, as the model_fn applies to served images."""
    return {"image": tf.image.per_image_standardization(tf.cast(images, tf.float32))}, labels


def training_split(params, input_context=None) -> cifar_split.PaddedSplit:
    """This pipeline's share of the training split, decoded into memory (NumPy) once.

    Sharded as `Dataset.shard` would: record i goes to pipeline i % num_input_pipelines.
    """
    count, index = 1, 0
    if input_context is not None and input_context.num_input_pipelines > 1:
        count, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    if params.get("synthetic"):
        images, labels = synthetic_arrays(SYNTHETIC_TRAIN_EXAMPLES)
        return cifar_split.PaddedSplit(images[index::count], labels[index::count])
    records = np.concatenate([np.fromfile(path, np.uint8) for path in _data_files(params, True)])
    if records.size % RECORD_BYTES:
        raise UserError(f"the CIFAR-10 training files in {_root(params)} hold {records.size} "
                        f"bytes, not whole {RECORD_BYTES}-byte records: they changed since the "
                        f"run started; restore them or run with --synthetic")
    return cifar_split.PaddedSplit(*decode_record_array(records[index * RECORD_BYTES:], count))


def decode_record_array(records, every=1):
    """decode_records in NumPy, for every `every`-th record of the uint8 array `records`."""
    records = records.reshape(-1, RECORD_BYTES)[::every]
    return (records[:, 1:].reshape(-1, CHANNELS, HEIGHT, WIDTH).transpose(0, 2, 3, 1),
            records[:, 0].astype(np.int32))


def synthetic_arrays(count):
    """The synthetic training examples as NumPy arrays: uint8 images [count,32,32,3], int32
    labels; noise around a per-class colour like synthetic_example (another draw of it)."""
    rng = np.random.RandomState(SYNTHETIC_SEED)
    labels = rng.randint(0, NUM_CLASSES, count).astype(np.int32)
    noise = rng.standard_normal((count, HEIGHT, WIDTH, CHANNELS)).astype(np.float32)
    images = _class_colours()[labels][:, None, None, :] + SYNTHETIC_NOISE * noise
    return np.rint(np.clip(images, 0.0, 255.0)).astype(np.uint8), labels


@register_input("cifar", prepare=prepare, data_flags=("data_dir", "synthetic", "reader_nice"))
def cifar_input(mode, params, input_context=None):
    """CIFAR-10 as ({"image": float32 [B,32,32,3]}, int32 [B]); batch_size is per pipeline.

    Training decodes the whole split once into memory, padded and mirrored for the
    crops (480 MB for the whole training set, cifar_split.py), in every pipeline: each
    takes its slices of the global batches, which follow a new permutation every epoch
    (training/position.py); eval reads the test set once, in file order.
    """
    training = mode == tf.estimator.ModeKeys.TRAIN
    batch_size = int(params["batch_size"])
    if batch_size <= 0:
        raise UserError(f"batch_size {batch_size} must be > 0; fix it with --set batch_size=128")
    if not training:  # the test set once, in file order, the last partial batch kept
        ds = examples(params, False, input_context).batch(batch_size).map(
            standardized, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.prefetch(tf.data.AUTOTUNE).with_options(pipeline_options())
    check_training_batch("cifar", params, training_examples(params), input_context)
    return training_batches(params, batch_size, input_context) \
        .prefetch(tf.data.AUTOTUNE).with_options(pipeline_options())


def training_batches(params, batch_size, input_context=None) -> tf.data.Dataset:
    """Endless augmented, standardized batches: this pipeline's slices of the global batches,
    from params['start_step'] on (training/position.py; batch k a function of (seed, k)).

    The reader's CPU is taken from the training step's cores: one NumPy call per batch
    (cifar_split.py), on the reader's own threads at a lower priority (reader_priority.py).
    """
    split = training_split(params)  # every pipeline the whole split: it takes its slices
    if not len(split):  # an empty split: no batches (not endless epochs of nothing)
        return tf.data.Dataset.from_tensors((
            {"image": tf.zeros([batch_size, HEIGHT, WIDTH, CHANNELS])},
            tf.zeros([batch_size], tf.int32))).take(0)
    position_params = position.resolved(params, input_context)
    batches = cifar_split.Batches(split, int(position_params["global_batch_size"]),
                                  position.data_seed(params),
                                  reader_priority.nice_value(params.get("reader_nice")))

    def element(j):
        return batches.slice(*position.element_position(position_params, input_context, int(j)))

    def batch(j):
        images, labels = tf.numpy_function(element, [j], (tf.float32, tf.int32), stateful=False)
        images.set_shape([batch_size, HEIGHT, WIDTH, CHANNELS])
        labels.set_shape([batch_size])
        return {"image": images}, labels

    first = position.start_element(position_params, input_context)
    return tf.data.Dataset.range(first, ENDLESS).map(batch, num_parallel_calls=tf.data.AUTOTUNE)


def pipeline_options() -> tf.data.Options:
    """The reader's own threads: half the cores, one thread per op.

    By default tf.data takes a thread per core and lets each op use them all, which
    on a small machine competes with the training step for the same cores
    (ResNet-20 on 2 cores: 334 -> 283 ms of CPU per step with these settings,
    docs/speed.md).
    """
    options = tf.data.Options()
    options.threading.private_threadpool_size = max(1, devices_lib.available_cores() // 2)
    options.threading.max_intra_op_parallelism = 1
    return options
