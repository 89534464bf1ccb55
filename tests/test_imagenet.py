"""ImageNet-layout records: the tfrecords writer, the imagenet input's reader and
augmentation, and the resnet50 model, on real JPEGs (scikit-learn's sample images)."""
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import input_fns.imagenet as imagenet
import input_fns.imagenet_preprocessing as preprocessing
import model_fns.resnet50 as resnet50
from conftest import make_config
from support import REPO, run_cli
from estimator_dist.cli import main as cli
from estimator_dist.errors import UserError
from estimator_dist.records import image_folder, layout
from estimator_dist.training import run as runner
from estimator_dist.training.registry import INPUTS, MODELS

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL
PREDICT = tf.estimator.ModeKeys.PREDICT
CROPS_PER_CLASS = 6


def sample_images():
    from sklearn.datasets import load_sample_images

    return load_sample_images().images  # china.jpg, flower.jpg: 427 x 640 RGB


def write_image_folder(root):
    """Class folders 'china' and 'flower' of JPEG crops of the sample photos, and a generated
    class 'noise' of PNGs (grey and RGBA too, which the writer converts)."""
    rng = np.random.RandomState(0)
    for name, photo in zip(("china", "flower"), sample_images()):
        os.makedirs(os.path.join(root, name))
        for k in range(CROPS_PER_CLASS):
            crop = photo[k * 20:400 - k * 10, k * 30:600 - k * 15]
            Image.fromarray(crop).save(os.path.join(root, name, f"{k}.jpg"), quality=90)
    os.makedirs(os.path.join(root, "noise"))
    for k in range(CROPS_PER_CLASS):
        pixels = rng.randint(0, 256, (40 + k, 50, 4)).astype(np.uint8)
        image = Image.fromarray(pixels, "RGBA")
        (image.convert("L") if k % 2 else image).save(os.path.join(root, "noise", f"{k}.png"))
    return root


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """(image folder, records directory) written by the writer: 3 train and 1 validation shard."""
    root = tmp_path_factory.mktemp("imagenet")
    images = write_image_folder(str(root / "images"))
    image_folder.write_records(images, str(root / "records"), shards=3,
                               validation_fraction=1 / 3)
    return images, str(root / "records")


def read_examples(path):
    out = []
    for raw in tf.data.TFRecordDataset(path):
        out.append(tf.train.Example.FromString(raw.numpy()).features.feature)
    return out


def test_writer_writes_the_imagenet_layout(records):
    _, data_dir = records
    assert sorted(os.listdir(data_dir)) == [
        "labels.txt", "train-00000-of-00003", "train-00001-of-00003", "train-00002-of-00003",
        "validation-00000-of-00001"]
    assert layout.read_labels(data_dir) == ["china", "flower", "noise"]
    train = [e for p in layout.shard_files(data_dir, "train") for e in read_examples(p)]
    validation = read_examples(layout.shard_files(data_dir, "validation")[0])
    assert (len(train), len(validation)) == (12, 6)  # 2 of each class's 6 for validation
    for feature in train + validation:
        jpeg = feature[layout.ENCODED].bytes_list.value[0]
        decoded = tf.io.decode_jpeg(jpeg).numpy()
        assert decoded.shape == (feature[layout.HEIGHT].int64_list.value[0],
                                 feature[layout.WIDTH].int64_list.value[0], 3)
        label = feature[layout.LABEL].int64_list.value[0]
        assert 1 <= label <= 3  # 1-based, as ImageNet's
        assert feature[layout.TEXT].bytes_list.value[0].decode() == \
            ["china", "flower", "noise"][label - 1]
        assert list(feature[layout.BBOX_KEYS[0]].float_list.value) == []
    # every shard holds several classes (shuffled across shards)
    first = read_examples(layout.shard_files(data_dir, "train")[0])
    assert len({f[layout.LABEL].int64_list.value[0] for f in first}) > 1


def test_a_jpeg_is_stored_as_it_is(records):
    images, data_dir = records
    with open(os.path.join(images, "china", "0.jpg"), "rb") as f:
        original = f.read()
    stored = [f[layout.ENCODED].bytes_list.value[0] for p in
              layout.shard_files(data_dir, "train") + layout.shard_files(data_dir, "validation")
              for f in read_examples(p)]
    assert original in stored


def test_an_unreadable_image_is_named_and_nothing_is_written(tmp_path, capsys):
    images = write_image_folder(str(tmp_path / "images"))
    with open(os.path.join(images, "flower", "broken.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 not really a jpeg")
    output = tmp_path / "out" / "records"
    code = cli.main(["tfrecords", "--images", images, "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "flower/broken.jpg: not a readable image" in err
    assert not (tmp_path / "out").exists()


def test_a_truncated_jpeg_is_refused(tmp_path):
    images = write_image_folder(str(tmp_path / "images"))
    path = os.path.join(images, "china", "1.jpg")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])
    with pytest.raises(UserError, match="china/1.jpg: not a readable image"):
        image_folder.write_records(images, str(tmp_path / "records"))
    assert os.listdir(tmp_path / "records") == [] if (tmp_path / "records").exists() else True


def test_an_output_that_holds_records_is_refused(records, capsys):
    images, data_dir = records
    code = cli.main(["tfrecords", "--images", images, "--output", data_dir])
    assert code == 2 and "already holds records" in capsys.readouterr().err


def test_a_folder_without_class_folders_is_refused(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"")
    with pytest.raises(UserError, match="no class subfolders"):
        image_folder.write_records(str(tmp_path), str(tmp_path / "out"))


def params_for(data_dir, **extra):
    return {"data_dir": data_dir, "batch_size": 4, "image_size": 32, "seed": 3, **extra}


def test_prepare_counts_classes_from_the_labels_file(records):
    _, data_dir = records
    meta = imagenet.prepare(params_for(data_dir))
    assert meta["num_classes"] == 4  # 3 classes + the unused 0
    assert meta["serving_features"] == {"image": [[32, 32, 3], "float32"]}
    assert imagenet.prepare(params_for(data_dir, zero_based_labels=True))["num_classes"] == 3


def test_prepare_without_shards_says_how_to_write_them(tmp_path):
    with pytest.raises(UserError, match="no train-\\* TFRecord shards; write them with "
                                        "estimator-dist tfrecords"):
        imagenet.prepare(params_for(str(tmp_path)))


def test_training_batches_are_augmented_images_and_labels(records):
    _, data_dir = records
    ds = INPUTS.get("imagenet").fn(TRAIN, params_for(data_dir))
    batches = list(ds.take(8))  # 32 examples: past the 12 training records, it repeats
    for features, labels in batches:
        assert features["image"].shape == (4, 32, 32, 3)
        assert features["image"].dtype == tf.float32
        assert labels.dtype == tf.int32
        pixels = features["image"].numpy()
        assert 0.0 <= pixels.min() and pixels.max() <= 255.0
    labels = np.concatenate([l.numpy() for _, l in batches])
    assert set(labels) == {1, 2, 3}
    zero = INPUTS.get("imagenet").fn(TRAIN, params_for(data_dir, zero_based_labels=True))
    assert set(np.concatenate([l.numpy() for _, l in zero.take(8)])) == {0, 1, 2}


def test_eval_reads_the_validation_split_once_in_order(records):
    _, data_dir = records
    fn = INPUTS.get("imagenet").fn
    first = [(f["image"].numpy(), l.numpy()) for f, l in fn(EVAL, params_for(data_dir))]
    again = [(f["image"].numpy(), l.numpy()) for f, l in fn(EVAL, params_for(data_dir))]
    assert sum(len(l) for _, l in first) == 6  # the last, partial batch kept
    for (a, la), (b, lb) in zip(first, again):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


def test_eval_image_is_the_central_crop_resized(records):
    images, _ = records
    with open(os.path.join(images, "china", "2.jpg"), "rb") as f:
        jpeg = f.read()
    decoded = tf.io.decode_jpeg(jpeg).numpy()
    height, width = decoded.shape[:2]
    size = int(0.875 * min(height, width))
    top, left = (height - size + 1) // 2, (width - size + 1) // 2
    expected = tf.compat.v1.image.resize(decoded[top:top + size, left:left + size], [32, 32])
    got = preprocessing.eval_image(tf.constant(jpeg), 32)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-3)


@pytest.mark.parametrize("shape", [(2, 5, 7, 3), (5, 7, 3)])
def test_normalize_gives_the_per_channel_formula_to_the_last_bit(shape):
    """The cheaper form (both vectors broadcast to an image first) keeps float32's values:
    x * (1 / std) + (-mean / std), each product and sum rounded as numpy rounds them."""
    pixels = np.random.RandomState(0).uniform(0, 255, shape).astype(np.float32)
    scale = np.array([1.0 / s for s in preprocessing.STDDEV_RGB], np.float32)
    offset = np.array([-m / s for m, s in zip(preprocessing.MEAN_RGB, preprocessing.STDDEV_RGB)],
                      np.float32)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        normalized = session.run(preprocessing.normalize(tf.constant(pixels)))
    np.testing.assert_array_equal(normalized, pixels * scale + offset)


def test_training_crop_keeps_part_of_an_object_box():
    """With one small box, every sampled crop covers at least 10% of it (min_object_covered)."""
    photo = sample_images()[0]
    jpeg = tf.io.encode_jpeg(photo)
    box = tf.constant([[[0.6, 0.7, 0.9, 0.95]]])  # ymin, xmin, ymax, xmax
    h, w = photo.shape[:2]
    box_area = (0.3 * h) * (0.25 * w)
    for seed in range(20):
        y, x, ch, cw = preprocessing.distorted_crop_window(jpeg, box, seed=seed).numpy()
        overlap_h = max(0, min(y + ch, 0.9 * h) - max(y, 0.6 * h))
        overlap_w = max(0, min(x + cw, 0.95 * w) - max(x, 0.7 * w))
        assert overlap_h * overlap_w >= 0.1 * box_area - 2 * (h + w)
        assert 0.05 * h * w * 0.9 <= ch * cw
        assert 0.75 * 0.9 <= cw / ch <= 4 / 3 * 1.1


def test_records_with_boxes_are_read(tmp_path):
    photo = sample_images()[1]
    jpeg = tf.io.encode_jpeg(photo).numpy()
    data_dir = tmp_path / "boxes"
    data_dir.mkdir()
    for split in layout.SPLITS:
        with tf.io.TFRecordWriter(str(data_dir / layout.shard_name(split, 0, 1))) as writer:
            for k in range(4):
                boxes = [[0.1, 0.1, 0.5, 0.6], [0.4, 0.3, 0.9, 0.8]][:k % 3]
                writer.write(image_folder.example_bytes(jpeg, 1 + k % 2, *photo.shape[:2],
                                                        boxes=boxes))
    params = params_for(str(data_dir))
    assert imagenet.prepare(params)["num_classes"] == 1001  # no labels.txt: ImageNet's own
    features, labels = next(iter(INPUTS.get("imagenet").fn(TRAIN, params)))
    assert features["image"].shape == (4, 32, 32, 3)


class Context:
    def __init__(self, count, index):
        self.num_input_pipelines, self.input_pipeline_id = count, index


def test_pipelines_read_disjoint_files(records):
    """Pipeline i of 3 reads exactly train shard i (file i % 3), shuffled and repeated."""
    from input_fns import record_files

    _, data_dir = records
    files = layout.shard_files(data_dir, "train")
    for index in range(3):
        ds = record_files.records(files, True, {"seed": 1, "shuffle_buffer": 4},
                                  Context(3, index))
        seen = {raw.numpy() for raw in ds.take(30)}
        expected = {raw.numpy() for raw in tf.data.TFRecordDataset(files[index])}
        assert seen == expected


@pytest.mark.parametrize("training", [False, True])
def test_more_pipelines_than_files_split_the_records(records, training):
    """One validation shard, two pipelines: each keeps every other record, none twice."""
    from input_fns import record_files

    _, data_dir = records
    files = layout.shard_files(data_dir, "validation")
    expected = [raw.numpy() for raw in tf.data.TFRecordDataset(files)]
    shares = []
    for index in range(2):
        ds = record_files.records(files, training, {"seed": 1, "shuffle_buffer": 2},
                                  Context(2, index))
        shares.append({raw.numpy() for raw in ds.take(12)})
    assert shares == [set(expected[0::2]), set(expected[1::2])]


@pytest.mark.parametrize("depth,convs", [(18, 17 + 3), (34, 33 + 3), (50, 49 + 4), (101, 100 + 4)])
def test_resnet_depths(depth, convs):
    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3])
        logits = resnet50.resnet_logits(images, depth, 10, training=False)
        assert logits.shape.as_list() == [None, 10]
        kernels = [v for v in tf.compat.v1.global_variables()
                   if v.name.endswith("kernel:0") and "logits" not in v.name]
        assert len(kernels) == convs  # depth - 1 convolutions + the projection shortcuts


def test_v1_5_strides_on_the_3x3():
    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, [2, 64, 64, 3])
        resnet50.resnet_logits(images, 50, 10, training=True)
        graph = tf.compat.v1.get_default_graph()
        block = "resnet/stage2/block1/"
        strides = {name: graph.get_operation_by_name(f"{block}{name}/Conv2D").get_attr("strides")
                   for name in ("conv1", "conv2", "conv3", "shortcut_conv")}
    assert strides == {"conv1": [1, 1, 1, 1], "conv2": [1, 2, 2, 1], "conv3": [1, 1, 1, 1],
                       "shortcut_conv": [1, 2, 2, 1]}


def test_an_unknown_depth_is_refused():
    with pytest.raises(UserError, match="depth 20 is not an ImageNet ResNet depth; allowed: "
                                        "18, 34, 50, 101, 152"):
        resnet50.layout_of(20)


def test_label_smoothing_and_warmup():
    from estimator_dist.graph import train_op
    from estimator_dist.serving import heads

    with tf.Graph().as_default():
        logits = tf.constant([[2.0, 0.0, 0.0]])
        labels = tf.constant([0], tf.int64)
        plain = heads.classification_loss(labels, logits, {})
        smooth = heads.classification_loss(labels, logits, {"label_smoothing": 0.3})
        step = tf.compat.v1.placeholder(tf.int64, [])
        lr = train_op.learning_rate({"learning_rate": 1.0, "lr_schedule": "cosine",
                                     "warmup_steps": 4, "train_steps": 14}, step)
        with tf.compat.v1.Session() as sess:
            p, s = sess.run([plain, smooth])
            rates = [sess.run(lr, {step: i}) for i in (0, 3, 4, 9, 14)]
    log_softmax = np.log(np.exp([2.0, 0.0, 0.0]) / np.exp([2.0, 0.0, 0.0]).sum())
    targets = np.array([0.8, 0.1, 0.1])
    assert p == pytest.approx(-log_softmax[0], rel=1e-5)
    assert s == pytest.approx(-(targets * log_softmax).sum(), rel=1e-5)
    np.testing.assert_allclose(rates, [0.25, 1.0, 1.0, 0.5, 0.0], atol=1e-6)


def test_resnet50_defaults_to_the_imagenet_input():
    entry = MODELS.get("resnet50")
    assert entry.default_input == "imagenet" and entry.hparams["depth"] == 50


@pytest.mark.parametrize("strategy,num_devices", [("none", 1), ("mirrored", 2), ("tower", 2)])
def test_resnet50_trains_and_exports(records, strategy, num_devices, tmp_path):
    """The resnet50 model_fn at depth 18: the strategies' code does not depend on the depth,
    and depth 50 (bottleneck blocks) trains and exports in the documented commands' test and
    `bench --quick` (the three here: 88 s at depth 50 alone on a quiet machine)."""
    _, data_dir = records
    config = make_config("resnet50", ["image_size=32", "depth=18"], input="imagenet",
                         data_dir=data_dir, strategy=strategy, num_devices=num_devices,
                         batch_size=4, train_steps=3, eval_steps=1, model_dir=str(tmp_path / "run"),
                         export="final", seed=1, save_checkpoints_steps=3)
    summary = runner.train(config, out=lambda *_: None)
    assert summary["global_step"] == 3
    export = tmp_path / "run" / "export" / "final"
    [version] = os.listdir(export)
    assert (export / version / "saved_model.pb").exists()
    loaded = tf.saved_model.load(str(export / version))
    pixels = tf.constant(np.full((2, 32, 32, 3), 128.0, np.float32))
    out = loaded.signatures["serving_default"](image=pixels)
    assert out["probabilities"].shape == (2, 4)


def test_the_documented_commands_in_a_fresh_directory(tmp_path):
    """docs/imagenet.md's two commands, as a user types them, in an empty directory."""
    write_image_folder(str(tmp_path / "photos"))
    env = dict(os.environ, PYTHONPATH=REPO)

    def run(*args):
        return run_cli(*args, cwd=tmp_path, env=env, timeout=600)

    made = run("tfrecords", "--images", "photos", "--output", "records", "--shards", "2")
    assert made.returncode == 0, made.stderr
    assert "wrote 12 training and 6 validation images of 3 classes" in made.stdout or \
        "of 3 classes" in made.stdout
    trained = run("train", "--model", "resnet50", "--input", "imagenet", "--data_dir", "records",
                  "--set", "image_size=32", "--batch_size", "4", "--train_steps", "3",
                  "--eval_steps", "1", "--model_dir", "runs/resnet50")
    assert trained.returncode == 0, trained.stderr
    assert "exported:" in trained.stdout
    assert os.path.isdir(tmp_path / "runs" / "resnet50" / "export")
