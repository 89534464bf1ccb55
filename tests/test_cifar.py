"""The built-in cifar input (binary reader, prepare/download, synthetic) and ResNet model_fn."""
import hashlib
import io
import json
import os
import tarfile
import urllib.request

import numpy as np
import pytest
import tensorflow as tf

import input_fns.cifar as cifar
import input_fns.cifar_split as cifar_split
import model_fns.resnet as resnet
from estimator_dist.errors import UserError
from estimator_dist.training.registry import INPUTS, MODELS

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL
PREDICT = tf.estimator.ModeKeys.PREDICT
RECORDS_PER_FILE = 20
SERVING_FEATURES = {"image": [[32, 32, 3], "float32"]}
CIFAR_HPARAMS = {"depth": 20, "optimizer": "momentum", "learning_rate": 0.1, "momentum": 0.9,
                 "weight_decay": 2e-4, "lr_schedule": "step"}


def write_cifar_files(directory, seed=0):
    """Five train files and a test file of RECORDS_PER_FILE records in the real binary format.

    Returns {file name: (uint8 HWC images [N,32,32,3], uint8 labels [N])}.
    """
    os.makedirs(directory, exist_ok=True)
    rng = np.random.RandomState(seed)
    written = {}
    for name in cifar.ALL_FILES:
        images = rng.randint(0, 256, size=(RECORDS_PER_FILE, 32, 32, 3)).astype(np.uint8)
        labels = (np.arange(RECORDS_PER_FILE) + len(written)) % 10
        labels = labels.astype(np.uint8)
        with open(os.path.join(directory, name), "wb") as f:
            for image, label in zip(images, labels):
                f.write(bytes([label]))
                f.write(image.transpose(2, 0, 1).tobytes())  # the files store CHW
        written[name] = (images, labels)
    return written


def standardize(images):
    """numpy per-image standardization, as tf.image.per_image_standardization defines it."""
    x = images.astype(np.float64)
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    std = x.std(axis=(1, 2, 3), keepdims=True)
    return (x - mean) / np.maximum(std, 1.0 / np.sqrt(32 * 32 * 3))


def make_archive(path, source_dir, extra=()):
    """A cifar-10-binary.tar.gz lookalike of source_dir's files; extra = TarInfo members."""
    with tarfile.open(path, "w:gz") as tar:
        for name in sorted(os.listdir(source_dir)):
            tar.add(os.path.join(source_dir, name), arcname=f"{cifar.ARCHIVE_DIR}/{name}")
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def params_for(data_dir, **overrides):
    params = dict(CIFAR_HPARAMS, batch_size=8, data_dir=str(data_dir), synthetic=False, seed=7,
                  train_steps=10)
    params.update(overrides)
    return params


def collect(dataset):
    images, labels = [], []
    for features, label in dataset:
        images.append(features["image"].numpy())
        labels.append(label.numpy())
    return np.concatenate(images), np.concatenate(labels)


def test_registered_with_the_documented_metadata():
    model = MODELS.get("cifar")
    assert model.fn is resnet.cifar_model_fn
    assert dict(model.hparams) == CIFAR_HPARAMS
    assert model.default_input == "cifar"
    assert {"batch_size", "train_steps", "eval_steps"} <= set(model.run_defaults)
    assert INPUTS.get("cifar").fn is cifar.cifar_input
    assert INPUTS.get("cifar").prepare is cifar.prepare


def test_eval_reads_every_test_record_once_in_order_standardized(tmp_path):
    written = write_cifar_files(tmp_path)
    images, labels = collect(cifar.cifar_input(EVAL, params_for(tmp_path)))
    expected_images, expected_labels = written[cifar.TEST_FILE]
    assert images.shape == (RECORDS_PER_FILE, 32, 32, 3) and images.dtype == np.float32
    assert labels.dtype == np.int32
    np.testing.assert_array_equal(labels, expected_labels)
    np.testing.assert_allclose(images, standardize(expected_images), atol=1e-4)
    np.testing.assert_allclose(images.mean(axis=(1, 2, 3)), 0.0, atol=1e-4)


def test_eval_keeps_the_last_partial_batch(tmp_path):
    write_cifar_files(tmp_path)
    ds = cifar.cifar_input(EVAL, params_for(tmp_path, batch_size=8))
    assert [int(labels.shape[0]) for _, labels in ds] == [8, 8, 4]


@pytest.mark.parametrize("chunk", [1000, 7])  # whole files in one chunk; chunks across files
def test_examples_turn_chw_records_into_hwc_pixels_in_file_order(tmp_path, monkeypatch, chunk):
    written = write_cifar_files(tmp_path)
    monkeypatch.setattr(cifar, "DECODE_CHUNK", chunk)
    images, labels = (np.stack(column) for column in zip(*cifar.examples(
        params_for(tmp_path), training=True).as_numpy_iterator()))
    assert images.dtype == np.uint8 and labels.dtype == np.int32
    np.testing.assert_array_equal(images, np.concatenate([written[n][0] for n in cifar.TRAIN_FILES]))
    np.testing.assert_array_equal(labels, np.concatenate([written[n][1] for n in cifar.TRAIN_FILES]))


def test_numpy_decode_equals_the_tensorflow_decode(tmp_path):
    write_cifar_files(tmp_path)
    raw = (tmp_path / cifar.TEST_FILE).read_bytes()
    want = [t.numpy() for t in cifar.decode_records(tf.constant(
        [raw[i:i + cifar.RECORD_BYTES] for i in range(0, len(raw), cifar.RECORD_BYTES)]))]
    got = cifar.decode_record_array(np.frombuffer(raw, np.uint8))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    odd = cifar.decode_record_array(np.frombuffer(raw, np.uint8)[cifar.RECORD_BYTES:], 2)
    np.testing.assert_array_equal(odd[0], want[0][1::2])


def test_unaugmented_training_batches_are_the_standardized_training_images(tmp_path,
                                                                           monkeypatch):
    written = write_cifar_files(tmp_path)
    unaugmented(monkeypatch)
    images, labels = collect(cifar.cifar_input(TRAIN, params_for(tmp_path, batch_size=100))
                             .take(1))
    train = np.concatenate([written[n][0] for n in cifar.TRAIN_FILES])
    train_labels = np.concatenate([written[n][1] for n in cifar.TRAIN_FILES])
    want = standardize(train).reshape(len(train), -1)
    nearest = ((images.reshape(len(images), 1, -1) - want[None]) ** 2).sum(-1).argmin(axis=1)
    assert sorted(nearest.tolist()) == list(range(len(train)))  # each record once
    np.testing.assert_allclose(images, want[nearest].reshape(images.shape), atol=1e-4)
    np.testing.assert_array_equal(labels, train_labels[nearest])


def unaugmented(monkeypatch):
    """Training batches without the random crop and flip: records can be told apart."""
    crops = cifar_split.PaddedSplit.batch

    def centred(split, index, dy, dx, flip):
        centre = np.full(len(index), cifar_split.PAD)
        return crops(split, index, centre, centre, np.zeros(len(index), bool))

    monkeypatch.setattr(cifar_split.PaddedSplit, "batch", centred)


def train_keys(dataset, batches):
    """Each training image of the first `batches` batches, as bytes to compare."""
    return [image.tobytes() for features, _ in dataset.take(batches)
            for image in np.round(features["image"].numpy(), 3)]


def test_each_training_epoch_visits_every_record_once_in_a_new_order(tmp_path, monkeypatch):
    write_cifar_files(tmp_path)
    unaugmented(monkeypatch)
    keys = train_keys(cifar.cifar_input(TRAIN, params_for(tmp_path, batch_size=20)), 10)
    first, second = keys[:5 * RECORDS_PER_FILE], keys[5 * RECORDS_PER_FILE:]
    assert len(set(first)) == len(first) == 5 * RECORDS_PER_FILE
    assert set(second) == set(first) and second != first


def test_sharded_training_pipelines_draw_disjoint_halves(tmp_path, monkeypatch):
    """Each pipeline takes its half of every global batch (training/position.py): in one
    epoch (5 global batches of 2 x 10) the two halves cover the split once."""
    write_cifar_files(tmp_path)
    unaugmented(monkeypatch)
    halves = []
    for pipeline in (0, 1):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline,
                                         num_replicas_in_sync=2)
        ds = cifar.cifar_input(TRAIN, params_for(tmp_path, batch_size=10), input_context=ctx)
        halves.append(train_keys(ds, 5))  # one epoch of the global batches
        assert len(set(halves[-1])) == 5 * RECORDS_PER_FILE // 2
    assert not set(halves[0]) & set(halves[1])


def test_train_batches_are_augmented_standardized_and_repeat(tmp_path):
    written = write_cifar_files(tmp_path)
    train_labels = set(np.concatenate([written[n][1] for n in cifar.TRAIN_FILES]).tolist())
    ds = cifar.cifar_input(TRAIN, params_for(tmp_path, batch_size=16))
    assert ds.element_spec[0]["image"].shape.as_list() == [16, 32, 32, 3]
    # 100 train records at batch 16: 10 batches only exist if the data repeats.
    batches = list(ds.take(10))
    for features, labels in batches:
        image = features["image"].numpy()
        assert image.dtype == np.float32 and labels.dtype == tf.int32
        np.testing.assert_allclose(image.mean(axis=(1, 2, 3)), 0.0, atol=1e-4)
        np.testing.assert_allclose(image.std(axis=(1, 2, 3)), 1.0, atol=1e-3)
        assert set(labels.numpy().tolist()) <= train_labels


def test_split_batches_are_standardized_padded_crops_and_flips_for_every_offset():
    rng = np.random.RandomState(0)
    offsets = [(dy, dx, f) for dy in range(9) for dx in range(9) for f in (False, True)]
    images = rng.randint(0, 256, size=(len(offsets), 32, 32, 3)).astype(np.uint8)
    images[0] = 7  # a flat crop: the deviation's floor
    images[1, :, :16] = 255  # its flip differs from it
    labels = np.arange(len(offsets)) % 10
    split = cifar_split.PaddedSplit(images, labels)
    dy, dx, flip = (np.array(v) for v in zip(*offsets))
    order = rng.permutation(len(offsets))
    got, got_labels = split.batch(order, dy[order], dx[order], flip[order])
    assert got.dtype == np.float32 and got.shape == (len(offsets), 32, 32, 3)
    np.testing.assert_array_equal(got_labels, labels[order])
    padded = np.pad(images, [(0, 0), (4, 4), (4, 4), (0, 0)])
    crops = np.stack([padded[b, y:y + 32, x:x + 32] for b, (y, x, _) in enumerate(offsets)])
    crops[flip] = crops[flip, :, ::-1]
    want = tf.image.per_image_standardization(tf.constant(crops, tf.float32)).numpy()
    for i, b in enumerate(order):
        np.testing.assert_allclose(got[i], want[b], atol=1e-5, err_msg=str(offsets[b]))


def test_split_offsets_follow_the_padding():
    image = np.arange(32 * 32 * 3).reshape(1, 32, 32, 3) % 251
    split = cifar_split.PaddedSplit(image.astype(np.uint8), np.array([3]))
    centre, _ = split.batch(np.array([0]), np.array([4]), np.array([4]), np.array([False]))
    np.testing.assert_allclose(centre[0], standardize(image)[0], atol=1e-5)
    shifted, _ = split.batch(np.array([0]), np.array([0]), np.array([8]), np.array([False]))
    # dy=0: four zero rows on top; dx=8: the image's columns 4..31, then four zero columns.
    raw = (shifted[0] - shifted[0].min()) / (shifted[0] - shifted[0].min()).max()
    assert np.all(raw[:4] == 0) and np.all(raw[:, 28:] == 0) and np.any(raw[4:, :28] > 0)


def small_split(n=10):
    rng = np.random.RandomState(1)
    return cifar_split.PaddedSplit(rng.randint(0, 256, (n, 32, 32, 3)).astype(np.uint8),
                                   np.arange(n) % 10)


def test_split_batches_are_a_function_of_seed_and_batch_number():
    split = small_split()
    first, again, other = (cifar_split.Batches(split, 4, seed) for seed in (5, 5, 6))
    for k in (3, 0, 7):  # any order, as parallel reader threads would ask
        np.testing.assert_array_equal(first(k)[0], again(k)[0])
    assert not np.array_equal(first(0)[0], other(0)[0])


def test_split_batches_span_epochs_each_a_new_permutation():
    batches = cifar_split.Batches(small_split(10), 4, seed=3)
    order = np.concatenate([batches.indices(k) for k in range(10)])  # 40 = four epochs
    epochs = order.reshape(4, 10)
    for epoch in epochs:
        assert sorted(epoch.tolist()) == list(range(10))
    assert len({tuple(e) for e in epochs}) == 4


def test_split_batches_draw_every_crop_offset_and_both_flips(monkeypatch):
    drawn = []
    monkeypatch.setattr(cifar_split.PaddedSplit, "batch",
                        lambda self, index, dy, dx, flip: drawn.append((dy, dx, flip)))
    batches = cifar_split.Batches(small_split(), 256, seed=0)
    for k in range(4):
        batches(k)
    dy, dx, flip = (np.concatenate(v) for v in zip(*drawn))
    assert set(dy.tolist()) == set(dx.tolist()) == set(range(cifar_split.OFFSETS))
    assert 0.4 < flip.mean() < 0.6


def test_split_batches_come_aligned_for_tensorflow():
    images, _ = cifar_split.Batches(small_split(), 8, seed=0)(0)
    assert images.ctypes.data % cifar_split.ALIGNMENT == 0 and images.flags.c_contiguous


def test_synthetic_training_shards_split_one_fixed_set():
    params = params_for("", synthetic=True)
    whole = cifar.training_split(params)
    assert len(whole) == cifar.SYNTHETIC_TRAIN_EXAMPLES
    np.testing.assert_array_equal(whole.labels, cifar.training_split(params).labels)
    halves = [cifar.training_split(params, tf.distribute.InputContext(2, i, 2)) for i in (0, 1)]
    np.testing.assert_array_equal(halves[0].labels, whole.labels[0::2])
    np.testing.assert_array_equal(halves[1].labels, whole.labels[1::2])


def test_train_shuffle_follows_the_seed(tmp_path):
    write_cifar_files(tmp_path)

    def first_labels(seed):
        ds = cifar.cifar_input(TRAIN, params_for(tmp_path, seed=seed, batch_size=20))
        return np.concatenate([l.numpy() for _, l in ds.take(5)])

    np.testing.assert_array_equal(first_labels(3), first_labels(3))
    assert not np.array_equal(first_labels(3), first_labels(4))


def test_sharded_eval_splits_records_disjointly(tmp_path):
    written = write_cifar_files(tmp_path)
    expected = standardize(written[cifar.TEST_FILE][0]).reshape(RECORDS_PER_FILE, -1)
    seen = []
    for pipeline in (0, 1):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline,
                                         num_replicas_in_sync=2)
        images, _ = collect(cifar.cifar_input(EVAL, params_for(tmp_path), input_context=ctx))
        distances = ((images.reshape(len(images), 1, -1) - expected[None]) ** 2).sum(-1)
        seen.append(set(distances.argmin(axis=1).tolist()))
        assert len(seen[-1]) == len(images) == RECORDS_PER_FILE // 2
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(RECORDS_PER_FILE))


def test_single_pipeline_context_does_not_shard(tmp_path):
    write_cifar_files(tmp_path)
    ctx = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0)
    _, labels = collect(cifar.cifar_input(EVAL, params_for(tmp_path), input_context=ctx))
    assert len(labels) == RECORDS_PER_FILE


def test_synthetic_is_deterministic_learnable_shape():
    params = params_for("", synthetic=True, batch_size=64)
    images, labels = collect(cifar.cifar_input(EVAL, params))
    again, again_labels = collect(cifar.cifar_input(EVAL, params))
    assert images.shape == (cifar.SYNTHETIC_EVAL_EXAMPLES, 32, 32, 3)
    assert images.dtype == np.float32 and labels.dtype == np.int32
    np.testing.assert_array_equal(images, again)
    np.testing.assert_array_equal(labels, again_labels)
    assert set(labels.tolist()) == set(range(10))
    features, train_labels = next(iter(cifar.cifar_input(TRAIN, params)))
    assert features["image"].shape == (64, 32, 32, 3) and train_labels.shape == (64,)


def test_missing_files_without_prepare_name_the_fix(tmp_path):
    with pytest.raises(UserError, match="--synthetic"):
        cifar.cifar_input(TRAIN, params_for(tmp_path / "empty"))


def test_prepare_synthetic_needs_no_files(tmp_path):
    extra = cifar.prepare(params_for(tmp_path / "nothing", synthetic=True))
    assert extra["serving_features"] == SERVING_FEATURES and extra["num_classes"] == 10
    json.dumps(extra)
    assert not (tmp_path / "nothing").exists()


def test_prepare_finds_files_in_the_archive_layout(tmp_path):
    write_cifar_files(tmp_path / cifar.ARCHIVE_DIR)
    extra = cifar.prepare(params_for(tmp_path))
    assert extra["data_dir"] == str(tmp_path / cifar.ARCHIVE_DIR)
    assert extra["serving_features"] == SERVING_FEATURES and extra["num_classes"] == 10
    assert json.loads(json.dumps(extra)) == extra
    # The input_fn finds the nested directory from the user's data_dir too.
    _, labels = collect(cifar.cifar_input(EVAL, params_for(tmp_path)))
    assert len(labels) == RECORDS_PER_FILE


def test_prepare_rejects_a_truncated_file(tmp_path):
    write_cifar_files(tmp_path)
    with open(tmp_path / "data_batch_3.bin", "ab") as f:
        f.write(b"\0" * 5)
    with pytest.raises(UserError, match="data_batch_3.bin") as info:
        cifar.prepare(params_for(tmp_path))
    assert "\n" not in str(info.value) and str(cifar.RECORD_BYTES) in str(info.value)


def test_prepare_rejects_a_file_with_a_label_that_is_not_a_class(tmp_path):
    """Right size, wrong content: it failed at the first step with a traceback."""
    write_cifar_files(tmp_path)
    with open(tmp_path / "test_batch.bin", "r+b") as f:
        f.seek(2 * cifar.RECORD_BYTES)
        f.write(bytes([233]))
    with pytest.raises(UserError, match=r"test_batch.bin record 2 has label 233, not a class "
                                        r"0-9: it is not a CIFAR-10 binary file"):
        cifar.prepare(params_for(tmp_path))


def test_prepare_downloads_and_extracts_a_local_archive(tmp_path):
    written = write_cifar_files(tmp_path / "src")
    md5 = make_archive(tmp_path / "cifar.tar.gz", tmp_path / "src")
    root = tmp_path / "data"
    extra = cifar.prepare(params_for(root, cifar_url=(tmp_path / "cifar.tar.gz").as_uri(),
                                     cifar_md5=md5))
    assert extra["data_dir"] == str(root / cifar.ARCHIVE_DIR)
    assert os.listdir(root) == [cifar.ARCHIVE_DIR]  # no temp archive or staging dir left
    assert sorted(os.listdir(root / cifar.ARCHIVE_DIR)) == sorted(cifar.ALL_FILES)
    _, labels = collect(cifar.cifar_input(EVAL, params_for(root)))
    np.testing.assert_array_equal(labels, written[cifar.TEST_FILE][1])


def test_prepare_default_data_dir_is_under_home_cache(tmp_path, monkeypatch):
    write_cifar_files(tmp_path / "src")
    md5 = make_archive(tmp_path / "cifar.tar.gz", tmp_path / "src")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    extra = cifar.prepare(params_for("", cifar_url=(tmp_path / "cifar.tar.gz").as_uri(),
                                     cifar_md5=md5))
    assert extra["data_dir"] == str(
        tmp_path / "home" / ".cache" / "estimator-dist" / "cifar10" / cifar.ARCHIVE_DIR)


def test_prepare_extraction_cannot_escape_the_data_dir(tmp_path):
    write_cifar_files(tmp_path / "src")
    escape = tarfile.TarInfo("cifar-10-batches-bin/../../escape.bin")
    escape.size = 3
    # Were this member honoured it would replace the good test file with 3 bytes.
    clobber = tarfile.TarInfo(f"{cifar.ARCHIVE_DIR}/../{cifar.TEST_FILE}")
    clobber.size = 3
    link = tarfile.TarInfo(f"{cifar.ARCHIVE_DIR}/batches.meta.txt")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    md5 = make_archive(tmp_path / "evil.tar.gz", tmp_path / "src",
                       extra=[(escape, b"bad"), (clobber, b"bad"), (link, None)])
    root = tmp_path / "a" / "data"
    cifar.prepare(params_for(root, cifar_url=(tmp_path / "evil.tar.gz").as_uri(), cifar_md5=md5))
    assert not list(tmp_path.rglob("escape.bin"))
    assert not (root / cifar.ARCHIVE_DIR / "batches.meta.txt").is_symlink()


def test_prepare_wrong_md5_fails_and_leaves_nothing(tmp_path):
    write_cifar_files(tmp_path / "src")
    make_archive(tmp_path / "cifar.tar.gz", tmp_path / "src")
    root = tmp_path / "data"
    with pytest.raises(UserError, match="md5") as info:
        cifar.prepare(params_for(root, cifar_url=(tmp_path / "cifar.tar.gz").as_uri(),
                                 cifar_md5="0" * 32))
    assert "--synthetic" in str(info.value) and "\n" not in str(info.value)
    assert not [p for p in root.rglob("*") if p.is_file()]


@pytest.mark.parametrize("url", [None, "http://127.0.0.1:9/cifar-10-binary.tar.gz"],
                         ids=["official_url_offline", "refused"])
def test_prepare_unreachable_url_fails_fast_with_the_fix(tmp_path, url, monkeypatch):
    params = params_for(tmp_path / "data")
    if url:
        params["cifar_url"] = url
    attempts = []
    real_urlopen = urllib.request.urlopen

    def urlopen(*args, **kwargs):
        attempts.append(kwargs.get("timeout"))
        return real_urlopen(*args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(UserError) as info:
        cifar.prepare(params)
    message = str(info.value)
    # Fast: one attempt, bounded by the download timeout (no retries, no wait without end).
    assert attempts == [cifar.DOWNLOAD_TIMEOUT_S]
    assert "\n" not in message
    for needed in ("--synthetic", "data_batch_1.bin", "test_batch.bin", str(tmp_path / "data")):
        assert needed in message
    assert not [p for p in (tmp_path / "data").rglob("*") if p.is_file()]


def test_failed_download_removes_only_the_data_dirs_it_made(tmp_path):
    """A missing --data_dir was made for the download and stayed behind, empty, when it failed."""
    absent = (tmp_path / "absent.tar.gz").as_uri()  # fails at once, offline too
    with pytest.raises(UserError, match="fetching .* failed"):
        cifar.prepare(params_for(tmp_path / "a" / "b" / "c", cifar_url=absent))
    assert tmp_path.is_dir() and not (tmp_path / "a").exists()
    kept = tmp_path / "kept"  # existing dirs stay, empty or not; new ones under them go
    (kept / "empty").mkdir(parents=True)
    (kept / "notes.txt").write_text("mine")
    for root in (kept / "empty", kept / "x" / "y"):
        with pytest.raises(UserError, match="fetching .* failed"):
            cifar.prepare(params_for(root, cifar_url=absent))
    assert sorted(os.listdir(kept)) == ["empty", "notes.txt"] and os.listdir(kept / "empty") == []


def build(mode, depth=8, batch=4, labels=True):
    """Call the model_fn in a fresh graph; returns (graph, spec)."""
    graph = tf.Graph()
    with graph.as_default():
        rng = np.random.RandomState(0)
        features = {"image": tf.constant(rng.uniform(0, 255, (batch, 32, 32, 3)), tf.float32)}
        label_tensor = tf.constant(np.arange(batch) % 10, tf.int32) if labels else None
        params = dict(CIFAR_HPARAMS, depth=depth, num_classes=10, train_steps=10)
        spec = resnet.cifar_model_fn(features, label_tensor, mode, params)
    return graph, spec


def test_model_fn_predict_outputs():
    graph, spec = build(PREDICT, labels=False)
    predictions = spec.predictions
    assert predictions["class_ids"].dtype == tf.int64
    assert predictions["class_ids"].shape.as_list() == [4]
    assert predictions["probabilities"].dtype == tf.float32
    assert predictions["probabilities"].shape.as_list() == [4, 10]
    assert "serving_default" in spec.export_outputs
    with graph.as_default(), tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        probabilities = sess.run(predictions["probabilities"])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_model_fn_gives_the_same_answer_for_raw_and_standardized_pixels():
    graph = tf.Graph()
    with graph.as_default():
        raw = tf.constant(np.random.RandomState(1).uniform(0, 255, (2, 32, 32, 3)), tf.float32)
        params = dict(CIFAR_HPARAMS, depth=8)
        with tf.compat.v1.variable_scope("m", reuse=tf.compat.v1.AUTO_REUSE):
            a = resnet.cifar_model_fn({"image": raw}, None, PREDICT, params)
            b = resnet.cifar_model_fn(
                {"image": tf.image.per_image_standardization(raw)}, None, PREDICT, params)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            pa, pb = sess.run([a.predictions["probabilities"], b.predictions["probabilities"]])
    np.testing.assert_allclose(pa, pb, atol=1e-5)


def test_model_fn_eval_outputs():
    _, spec = build(EVAL)
    assert spec.loss.shape.as_list() == [] and spec.loss.dtype == tf.float32
    assert "accuracy" in spec.eval_metric_ops
    assert spec.train_op is None


def test_model_fn_train_outputs_and_batch_norm_updates():
    graph, spec = build(TRAIN)
    assert spec.loss.shape.as_list() == [] and spec.train_op is not None
    with graph.as_default():
        update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        moving = [v for v in tf.compat.v1.global_variables() if "moving_mean" in v.name]
    # depth 8 has 9 batch norms (7 on the main path, 2 on projection shortcuts); each
    # updates its moving mean and variance.
    assert len(moving) == 9 and len(update_ops) == 2 * len(moving)


def batch_norm_run(bn, x, values=None, steps=3):
    """Train-mode outputs after `steps` updates, the moving statistics, all variable values."""
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("net"):
            y = bn(tf.constant(x), True, "bn")
        with tf.compat.v1.variable_scope("net", reuse=True):
            inference = bn(tf.constant(x), False, "bn")
        updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        variables = {v.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for name, value in (values or {}).items():
                variables[name].load(value, session)
            for _ in range(steps):
                session.run(updates)
            return session.run([y, inference, variables])


def test_batch_norm_equals_the_v1_layer_with_fewer_ops():
    def v1_layer(x, training, name):
        return tf.compat.v1.layers.batch_normalization(
            x, momentum=resnet.BN_MOMENTUM, epsilon=resnet.BN_EPSILON, training=training,
            name=name)

    x = np.random.RandomState(0).randn(8, 6, 6, 5).astype(np.float32) * 3 + 1
    gamma_beta = {"net/bn/gamma:0": np.linspace(0.5, 2, 5), "net/bn/beta:0": np.arange(5.0)}
    want = batch_norm_run(v1_layer, x, gamma_beta)
    got = batch_norm_run(resnet._bn, x, gamma_beta)
    assert sorted(got[2]) == sorted(want[2])  # the same variables: checkpoints interchange
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    np.testing.assert_allclose(got[1], want[1], atol=1e-5)  # inference on the moving stats
    for name in want[2]:
        np.testing.assert_allclose(got[2][name], want[2][name], atol=1e-5, err_msg=name)
    assert np.abs(want[2]["net/bn/moving_mean:0"]).max() > 0.1  # the statistics did move

    def ops(bn):
        with tf.Graph().as_default() as graph:
            bn(tf.zeros([2, 4, 4, 3]), True, "bn")
            return len(graph.get_operations())

    assert ops(resnet._bn) < ops(v1_layer)


@pytest.mark.parametrize("depth", [21, 2, 7, 0, "20"])
def test_depth_must_be_6n_plus_2(depth):
    with pytest.raises(UserError, match=r"6n\+2") as info:
        build(PREDICT, depth=depth, labels=False)
    assert repr(depth) in str(info.value)


def test_conv_layers_grow_with_depth():
    def conv_count(depth):
        graph, _ = build(PREDICT, depth=depth, labels=False)
        with graph.as_default():
            return len([v for v in tf.compat.v1.trainable_variables() if v.shape.rank == 4])

    # 6n+1 convs on the main path plus 2 projection shortcuts.
    assert conv_count(8) == 9
    assert conv_count(14) == 15
    assert conv_count(20) == 21


class LossRecorder(tf.compat.v1.train.SessionRunHook):
    """Records the cross-entropy (without weight decay) of every training step."""

    def __init__(self):
        self.losses = []
        self._loss = None

    def begin(self):
        self._loss = tf.add_n(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES))

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._loss)

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def test_small_synthetic_training_run_learns(tmp_path):
    params = dict(CIFAR_HPARAMS, depth=8, batch_size=32, synthetic=True, seed=1, train_steps=30,
                  num_classes=10, data_dir=None)
    config = tf.estimator.RunConfig(tf_random_seed=1, save_summary_steps=1000,
                                    log_step_count_steps=1000)
    est = tf.estimator.Estimator(resnet.cifar_model_fn, model_dir=str(tmp_path / "model"),
                                 params=params, config=config)
    recorder = LossRecorder()
    est.train(lambda input_context=None: cifar.cifar_input(TRAIN, params, input_context),
              steps=30, hooks=[recorder])

    assert len(recorder.losses) == 30
    first, last = np.mean(recorder.losses[:5]), np.mean(recorder.losses[-10:])
    assert last < 0.8 * first, recorder.losses
    assert est.get_variable_value("global_step") == 30
    moving_means = [n for n in est.get_variable_names() if n.endswith("moving_mean")]
    assert len(moving_means) == 9
    for name in moving_means:
        assert np.abs(est.get_variable_value(name)).max() > 1e-6, name
    metrics = est.evaluate(lambda: cifar.cifar_input(EVAL, params))
    # Chance is 0.1; with moving statistics stuck at 0/1 eval collapses far below this.
    assert metrics["accuracy"] > 0.3, metrics


def test_reader_threads_leave_cores_to_the_training_step(tmp_path, monkeypatch):
    from estimator_dist.distribute import devices

    write_cifar_files(tmp_path)
    monkeypatch.setattr(devices, "available_cores", lambda: 8)
    ds = cifar.cifar_input(TRAIN, params_for(tmp_path, batch_size=16))
    threading = ds.options().threading
    assert threading.private_threadpool_size == 4 and threading.max_intra_op_parallelism == 1
    monkeypatch.setattr(devices, "available_cores", lambda: 1)
    assert cifar.cifar_input(TRAIN, params_for(tmp_path, batch_size=16)) \
        .options().threading.private_threadpool_size == 1


def test_training_from_the_binary_files_is_quiet_by_default(tmp_path):
    """No TensorFlow C++ log lines without --verbose (a dynamic-shape crop made grappler's
    cost model log an "Error in PredictCost()" warning that TF_CPP_MIN_LOG_LEVEL misses)."""
    from conftest import run_cli

    write_cifar_files(tmp_path / "data")
    proc = run_cli("train", "--model", "cifar", "--data_dir", str(tmp_path / "data"),
                   "--set", "depth=8", "--batch_size", "8", "--train_steps", "2",
                   "--eval_steps", "1", "--export", "none", "--model_dir", str(tmp_path / "model"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip() == "", proc.stderr[-2000:]
    assert "done: step 2" in proc.stdout


def test_more_pipelines_than_records_still_draw_their_slices(tmp_path):
    write_cifar_files(tmp_path)
    # 100 training records over 200 pipelines: no pipeline is empty, each takes its slice
    # of global batches that span several epochs (training/position.py).
    ctx = tf.distribute.InputContext(num_input_pipelines=200, input_pipeline_id=150)
    (features, labels), = list(cifar.cifar_input(TRAIN, params_for(tmp_path),
                                                 input_context=ctx).take(1))
    assert features["image"].shape == [8, 32, 32, 3] and labels.shape == [8]
