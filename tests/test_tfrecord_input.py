"""The generic `tfrecord` input: its feature spec, reading records the tfrecords command
wrote, features.yaml, and a run whose export signature comes from the spec."""
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import make_config
from estimator_dist.errors import UserError
from estimator_dist.records import image_folder, layout
from estimator_dist.training import run as runner
from estimator_dist.training.registry import INPUTS
from input_fns.tfrecord_spec import Feature, parse_spec
from test_imagenet import Context, write_image_folder

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL
SPEC = ("image=image/encoded:jpeg:24x24x3,label=image/class/label:int64,"
        "xmin=image/object/bbox/xmin:float32:var,file=image/filename:string")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfrecord")
    images = write_image_folder(str(root / "images"))
    image_folder.write_records(images, str(root / "records"), shards=2,
                               validation_fraction=1 / 3)
    return str(root / "records")


def test_text_and_mapping_spellings_are_one_spec():
    text = parse_spec("image=image/encoded:jpeg:8x8,label:int64,tags:int64:var,xy:float32:2x3")
    mapping = parse_spec({"image": {"key": "image/encoded", "dtype": "jpeg", "shape": [8, 8]},
                          "label": "int64", "tags": {"dtype": "int64", "shape": "var"},
                          "xy": {"dtype": "float32", "shape": [2, 3]}})
    assert text == mapping == {
        "image": Feature("image", "image/encoded", "jpeg", (8, 8, 3)),
        "label": Feature("label", "label", "int64", ()),
        "tags": Feature("tags", "tags", "int64", None),
        "xy": Feature("xy", "xy", "float32", (2, 3))}


@pytest.mark.parametrize("spec,message", [
    ("image/encoded:jpeg:8x8", "feature name 'image/encoded' is not an identifier"),
    ("x:int32", "feature 'x' has dtype 'int32', not one of int64, float32, string, jpeg"),
    ("x:float32:0x2", "feature 'x' has shape '0x2'; give positive dimensions"),
    ("img:jpeg", "jpeg feature 'img' needs its image shape HxWx3"),
    ("x", "'x' is not name[=key]:dtype[:shape]"),
    ("x:int64,x:float32", "names a feature twice"),
    ({"x": {"dtype": "int64", "size": 3}}, "unknown field(s) size"),
])
def test_a_bad_spec_is_one_line_with_an_example(spec, message):
    with pytest.raises(UserError) as info:
        parse_spec(spec)
    assert message in str(info.value) and "e.g. --set record_features=" in str(info.value)


def params_for(data_dir, **extra):
    return {"data_dir": data_dir, "batch_size": 3, "seed": 2, "record_features": SPEC, **extra}


def test_prepare_gives_the_serving_signature_of_the_spec(data_dir):
    meta = INPUTS.get("tfrecord").prepare(params_for(data_dir))
    assert meta == {"serving_features": {"image": [[24, 24, 3], "float32"],
                                         "xmin": [[None], "float32"], "file": [[], "string"]},
                    "num_classes": 4, "label_vocabulary": ["(none)", "china", "flower", "noise"],
                    "image_files": {"feature": "image", "preparation": "resize",
                                    "shape": [24, 24, 3]}}


def test_records_are_read_by_the_spec(data_dir):
    fn = INPUTS.get("tfrecord").fn
    features, labels = next(iter(fn(TRAIN, params_for(data_dir))))
    assert features["image"].shape == (3, 24, 24, 3) and features["image"].dtype == tf.float32
    assert features["xmin"].shape == (3, 0)  # no boxes in these records: padded to 0
    assert features["file"].dtype == tf.string and labels.dtype == tf.int64
    evaluated = [(f["file"].numpy(), l.numpy()) for f, l in fn(EVAL, params_for(data_dir))]
    assert sum(len(l) for _, l in evaluated) == 6
    expected = [e.features.feature[layout.FILENAME].bytes_list.value[0] for e in (
        tf.train.Example.FromString(r.numpy()) for r in
        tf.data.TFRecordDataset(layout.shard_files(data_dir, "validation")))]
    assert [name for names, _ in evaluated for name in names] == expected


def test_variable_length_features_are_padded_per_batch(tmp_path):
    for split in layout.SPLITS:
        with tf.io.TFRecordWriter(str(tmp_path / layout.shard_name(split, 0, 1))) as writer:
            for k in range(4):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "tags": tf.train.Feature(int64_list=tf.train.Int64List(value=range(1, k + 1))),
                    "label": tf.train.Feature(float_list=tf.train.FloatList(value=[k / 2]))}))
                writer.write(example.SerializeToString())
    params = {"data_dir": str(tmp_path), "batch_size": 4, "record_features": "tags:int64:var,"
              "label:float32"}
    features, labels = next(iter(INPUTS.get("tfrecord").fn(EVAL, params)))
    np.testing.assert_array_equal(features["tags"], [[0, 0, 0], [1, 0, 0], [1, 2, 0], [1, 2, 3]])
    np.testing.assert_allclose(labels, [0, 0.5, 1, 1.5])


def test_features_yaml_and_label_column(data_dir, tmp_path):
    directory = tmp_path / "copy"
    directory.mkdir()
    for name in os.listdir(data_dir):
        os.symlink(os.path.join(data_dir, name), directory / name)
    (directory / "features.yaml").write_text(
        "features:\n  pixels: {key: image/encoded, dtype: jpeg, shape: [16, 16]}\n"
        "  y: {key: image/class/label, dtype: int64}\nlabel: y\nnum_classes: 3\n")
    params = {"data_dir": str(directory), "batch_size": 2, "seed": 1}
    meta = INPUTS.get("tfrecord").prepare(params)
    assert meta == {"serving_features": {"pixels": [[16, 16, 3], "float32"]}, "num_classes": 3,
                    "image_files": {"feature": "pixels", "preparation": "resize",
                                    "shape": [16, 16, 3]}}  # 3 classes: not labels.txt's 1..3
    with pytest.raises(UserError, match="label 'file' is not in the feature spec"):
        INPUTS.get("tfrecord").prepare(dict(params, label_column="file"))


def test_without_a_spec_the_fix_is_named(data_dir):
    with pytest.raises(UserError, match="no feature spec; give the model's hparam record_features"):
        INPUTS.get("tfrecord").prepare({"data_dir": data_dir})


def test_pipelines_share_the_files(data_dir):
    fn = INPUTS.get("tfrecord").fn
    seen = [{(f["file"].numpy()[0], int(y[0])) for f, y in fn(
        TRAIN, params_for(data_dir, batch_size=1, shuffle_buffer=1), Context(2, i)).take(20)}
        for i in range(2)]  # (file name, class): names repeat across class folders
    assert len(seen[0]) + len(seen[1]) == 12 and not seen[0] & seen[1]


def test_resnet_on_own_records_trains_and_serves_the_spec(data_dir, tmp_path):
    config = make_config("resnet50", ["depth=18", f"record_features={SPEC}"], input="tfrecord",
                         data_dir=data_dir, strategy="none", num_devices=1, batch_size=3,
                         train_steps=2, eval_steps=1, model_dir=str(tmp_path / "run"),
                         export="final", seed=1, save_checkpoints_steps=2)
    assert runner.train(config, out=lambda *_: None)["global_step"] == 2
    export = tmp_path / "run" / "export" / "final"
    [version] = os.listdir(export)
    signature = tf.saved_model.load(str(export / version)).signatures["serving_default"]
    inputs = signature.structured_input_signature[1]
    assert {k: (v.shape.as_list(), v.dtype.name) for k, v in inputs.items()} == {
        "image": ([None, 24, 24, 3], "float32"), "xmin": ([None, None], "float32"),
        "file": ([None], "string")}
    # labels.txt names the classes (labels 1..3): predictions give them, as imagenet's do.
    outputs = signature(image=tf.zeros([1, 24, 24, 3]), xmin=tf.zeros([1, 0]),
                        file=tf.constant([""]))
    assert outputs["classes"].numpy()[0].decode() in ("(none)", "china", "flower", "noise")
