"""`predict --input` on JPEG and PNG files and folders: each image prepared as the model's input
prepared its eval images, predictions named by the classes of labels.txt.

predict took .csv and .npy only: a user with a model trained on `tfrecords` of a JPEG folder
resized and cropped by hand, guessing the eval preprocessing (resize + 87.5% central crop)."""
import io
import os

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from estimator_dist.cli.main import main
from estimator_dist.errors import UserError
from estimator_dist.records import image_folder, layout
from estimator_dist.serving import image_input
from input_fns import imagenet
from input_fns import tfrecord
from support import REPO, environment, run_cli
from test_imagenet import write_image_folder

CLASSES = ["(none)", "china", "flower", "noise"]  # labels.txt of write_image_folder, 1-based


def cli(cwd, *args):
    return run_cli(*args, cwd=cwd, env=environment(REPO), timeout=600)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """A folder of JPEGs and PNGs, its records, and ResNet trained on them briefly with the
    imagenet input, all through the CLI as docs/imagenet.md has it."""
    cwd = tmp_path_factory.mktemp("photos_run")
    write_image_folder(str(cwd / "photos"))
    made = cli(cwd, "tfrecords", "--images", "photos", "--output", "records", "--shards", "2")
    assert made.returncode == 0, made.stderr
    trained = cli(cwd, "train", "--model", "resnet50", "--input", "imagenet", "--data_dir",
                  "records", "--set", "image_size=32", "--set", "depth=18", "--set",
                  "learning_rate=0.0001", "--batch_size", "4", "--train_steps", "2",
                  "--eval_steps", "1", "--seed", "1", "--model_dir", "runs/photos")
    assert trained.returncode == 0, trained.stderr
    return cwd


def validation_images(data_dir):
    """[(photos/CLASS/FILE, JPEG bytes as stored)] of the validation records."""
    found = []
    for raw in tf.data.TFRecordDataset(layout.shard_files(data_dir, "validation")):
        feature = tf.train.Example.FromString(raw.numpy()).features.feature
        name = feature[layout.FILENAME].bytes_list.value[0].decode()
        text = feature[layout.TEXT].bytes_list.value[0].decode()
        found.append((os.path.join("photos", text, name), raw))
    return found


def folder_predictions(user_dir):
    """`predict --input photos/ --output predictions.csv` (once per module), read back."""
    if not (user_dir / "predictions.csv").exists():
        folder = cli(user_dir, "predict", "--saved_model", "runs/photos", "--input", "photos/",
                     "--output", "predictions.csv")
        assert (folder.returncode, folder.stderr) == (0, ""), folder.stderr
        assert folder.stdout == "wrote 18 predictions to predictions.csv\n"
    return pd.read_csv(user_dir / "predictions.csv")


def test_predict_on_a_folder_and_a_file_gives_class_names(user_dir, monkeypatch, capsys):
    frame = folder_predictions(user_dir)
    assert list(frame.columns) == ["file", "class_ids", "classes"] + [
        f"probabilities_{i}" for i in range(4)]
    assert list(frame["file"]) == [f"photos/{c}/{k}.{'png' if c == 'noise' else 'jpg'}"
                                   for c in CLASSES[1:] for k in range(6)]
    assert list(frame["classes"]) == [CLASSES[i] for i in frame["class_ids"]]
    monkeypatch.chdir(user_dir)  # one file: in this process (a second CLI start costs ~20 s)
    assert main(["predict", "--saved_model", "runs/photos", "--input", "photos/noise/1.png"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    alone = pd.read_csv(io.StringIO(out))
    row = frame[frame["file"] == "photos/noise/1.png"].reset_index(drop=True)
    pd.testing.assert_frame_equal(alone, row)


def test_predictions_are_the_models_on_its_own_eval_images(user_dir):
    """The CLI's probabilities for a validation image equal the SavedModel's on the image the
    imagenet input's EVAL pipeline made from its record."""
    frame = folder_predictions(user_dir)
    export = user_dir / "runs" / "photos" / "export" / "final"
    [version] = os.listdir(export)
    signature = tf.saved_model.load(str(export / version)).signatures["serving_default"]
    parse = imagenet.parser(False, 32, False)
    checked = 0
    for path, raw in validation_images(str(user_dir / "records")):
        pixels = parse(raw)[0]["image"]
        expected = signature(image=pixels[None])["probabilities"].numpy()[0]
        got = frame[frame["file"] == path][[f"probabilities_{i}" for i in range(4)]]
        np.testing.assert_allclose(got.to_numpy()[0], expected, rtol=1e-5, atol=1e-6)
        checked += 1
    assert checked == 3
    assert frame[[f"probabilities_{i}" for i in range(4)]].drop_duplicates().shape[0] > 1


@pytest.mark.parametrize("prep, reference", [
    ({"feature": "image", "preparation": "imagenet_eval", "shape": [32, 32, 3]},
     lambda raw, _: imagenet.parser(False, 32, False)(raw)[0]["image"]),
    ({"feature": "pixels", "preparation": "resize", "shape": [20, 28, 3]},
     lambda raw, data_dir: tfrecord.parser(*tfrecord.resolve({
         "record_features": "pixels=image/encoded:jpeg:20x28x3,label=image/class/label:int64",
         "data_dir": data_dir})[:2])(raw)[0]["pixels"]),
])
def test_an_image_file_becomes_the_pixels_its_record_gives(prep, reference, tmp_path):
    """JPEGs, a grey PNG and an RGBA PNG: the same pixels as the input's EVAL pipeline makes
    of the record `tfrecords` wrote for that file."""
    photos = write_image_folder(str(tmp_path / "photos"))
    image_folder.write_records(photos, str(tmp_path / "records"), shards=1,
                               validation_fraction=0.5)
    pairs = validation_images(str(tmp_path / "records"))
    assert {os.path.splitext(p)[1] for p, _ in pairs} == {".jpg", ".png"}
    for path, raw in pairs:
        got = image_input.model_pixels(image_folder.jpeg_of(str(tmp_path / path))[0], prep)
        np.testing.assert_array_equal(got, reference(raw, str(tmp_path / "records")).numpy())


def test_a_model_whose_input_reads_no_images_refuses_them(trained_digits, tmp_path):
    model_dir, _ = trained_digits
    photos = write_image_folder(str(tmp_path / "photos"))
    [version] = os.listdir(model_dir / "export" / "final")
    signature = tf.saved_model.load(str(model_dir / "export" / "final" / version)).signatures[
        "serving_default"]
    specs = dict(signature.structured_input_signature[1])
    with pytest.raises(UserError, match=r"^input 'digits' of .* does not read image files \(its "
                                        r"metadata has no image_files\); give --input a \.csv or "
                                        r"\.npy of its features \(image\)$"):
        image_input.image_batches(str(model_dir), str(model_dir), specs, photos, 8)


def test_a_savedmodel_outside_its_model_dir_says_where_the_preparation_is(tmp_path):
    specs = {"image": tf.TensorSpec([None, 32, 32, 3], tf.float32)}
    with pytest.raises(UserError, match=r"config\.yaml does not exist; give --saved_model "
                                        r"MODEL_DIR"):
        image_input.preparation(str(tmp_path), str(tmp_path / "copied"), specs)


def test_a_folder_without_images_and_a_missing_file_are_named(tmp_path):
    (tmp_path / "notes.txt").write_text("no image here")
    with pytest.raises(UserError, match=r"a folder with no \.jpg, \.jpeg, \.png file in it"):
        image_input.image_paths(str(tmp_path))
    with pytest.raises(UserError, match=r"^--input .*/gone\.jpg: no such file$"):
        image_input.image_paths(str(tmp_path / "gone.jpg"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.PNG").write_bytes(b"")
    (tmp_path / "a.jpeg").write_bytes(b"")
    (tmp_path / ".hidden.jpg").write_bytes(b"")
    assert image_input.image_paths(str(tmp_path)) == [str(tmp_path / "a.jpeg"),
                                                      str(tmp_path / "sub" / "b.PNG")]


def test_an_unreadable_image_is_named_in_one_line(user_dir, monkeypatch, capsys):
    (user_dir / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    monkeypatch.chdir(user_dir)
    code = main(["predict", "--saved_model", "runs/photos", "--input", "broken.jpg"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == ("estimator-dist: error: broken.jpg: not a readable image (not a format PIL "
                   "reads); remove or replace it (nothing was written)\n")
