"""Canned Estimators, feature columns and TF1 model code (canned_models.py) through the CLI:
their exports and `predict`, the EVAL graph built before training, a rerun's final export,
predict's CSV hygiene."""
import argparse
import os

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from canned_models import census_rows
from estimator_dist.errors import UserError
from estimator_dist.serving import predict
from support import TESTS, environment, final_export, run_cli

# A canned Estimator's run, then a predict, each start TensorFlow: minutes on a loaded machine.
pytestmark = pytest.mark.timeout(900)
ENV = environment(TESTS)
CENSUS = ["--import", "canned_models", "--batch_size", "16", "--seed", "1",
          "--eval_steps", "2"]


def census_csv(tmp_path, n=96, seed=0, name="adult.data", sep=","):
    path = tmp_path / name
    path.write_text(census_rows(n, seed, sep))
    return path


def train_census(tmp_path, model, *extra, steps=6, data=None):
    model_dir = tmp_path / model
    data = data or census_csv(tmp_path)
    done = run_cli("train", *CENSUS, "--model", model, "--data_path", data, "--model_dir",
                   model_dir, "--train_steps", steps, *extra, env=ENV, timeout=600)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    return model_dir, done


# -- a rerun at --train_steps exports its final step --------------------------------------

def test_a_rerun_at_train_steps_exports_the_final_step_it_left_unexported(tmp_path):
    """`--export none`, then the same run with `--export final`: it evaluated, exited 0 and
    exported nothing."""
    model_dir = tmp_path / "run"
    flags = ["--import", "guard_models", "--model", "guard_mlp", "--model_dir", model_dir,
             "--train_steps", "4"]
    first = run_cli("train", *flags, "--export", "none", env=ENV, timeout=120)
    assert first.returncode == 0 and not final_export(model_dir), first.stderr
    again = run_cli("train", *flags, "--export", "final", env=ENV, timeout=120)
    assert again.returncode == 0, again.stderr
    exports = final_export(model_dir)
    assert len(exports) == 1 and "exported:" in again.stdout, again.stdout
    exported = os.path.dirname(exports[0])
    assert int(tf.train.load_variable(os.path.join(exported, "variables", "variables"),
                                      "global_step")) == 4
    third = run_cli("train", *flags, "--export", "final", env=ENV, timeout=120)
    assert third.returncode == 0 and len(final_export(model_dir)) == 1, third.stderr


# -- the EVAL graph is built before the first step ----------------------------------------

def test_the_official_mnist_eval_bug_is_found_before_training_with_the_fix(tmp_path):
    """The r1 MNIST model_fn's EVAL branch calls tf.losses.sparse_softmax_cross_entropy,
    which Keras 2.15's tf.losses lacks: it trained every step, then failed evaluating."""
    model_dir = tmp_path / "mnist"
    done = run_cli("train", "--import", "canned_models", "--model", "mnist_r1", "--set",
                   "eval_bug=true", "--batch_size", "8", "--train_steps", "5", "--eval_steps",
                   "1", "--model_dir", model_dir, env=ENV, timeout=180)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "could not build its eval graph" in lines[0], lines[0]
    assert "tf.compat.v1.losses.sparse_softmax_cross_entropy" in lines[0], lines[0]
    assert not os.path.exists(model_dir)  # refused before anything was written: no step


def test_the_official_mnist_model_without_the_bug_trains_and_evaluates(tmp_path):
    done = run_cli("train", "--import", "canned_models", "--model", "mnist_r1", "--batch_size",
                   "8", "--train_steps", "5", "--eval_steps", "1", "--export", "none",
                   "--model_dir", tmp_path / "mnist", env=ENV, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "accuracy" in done.stdout


# -- canned Estimators registered by their model_fn: export and predict --------------------

CENSUS_HEADER = "age,workclass,education,education_num,occupation,hours_per_week,income_bracket"


def with_header(tmp_path, rows, name="rows.csv"):
    path = tmp_path / name
    path.write_text(CENSUS_HEADER + "\n" + rows)
    return path


def signatures(export):
    return tf.saved_model.load(export).signatures


def predict_cli(saved_model, input_path, *extra):
    return run_cli("predict", "--saved_model", saved_model, "--input", input_path, *extra,
                   env=ENV, timeout=120)


def frame_of(done):
    assert done.returncode == 0, done.stderr
    from io import StringIO
    return pd.read_csv(StringIO(done.stdout), dtype=str)


@pytest.mark.parametrize("model, head", [
    ("census_linear", "classification"), ("census_dnn", "classification"),
    ("census_wide_deep", "classification"), ("census_hours_linear", "regression")])
def test_a_canned_estimator_exports_its_signatures_and_predicts(tmp_path, model, head):
    """TensorFlow dropped serving_default and classification/regression of a canned head over
    raw features (they need one serialized tf.Example input); predict then refused."""
    model_dir, done = train_census(tmp_path, model, "--export", "final")
    assert "exported:" in done.stdout
    (export,) = [os.path.dirname(p) for p in final_export(model_dir)]
    found = signatures(export)
    assert {"serving_default", head, "predict", "predict_raw"} <= set(found), list(found)
    for name in ("serving_default", head, "predict"):
        assert len(found[name].structured_input_signature[1]) == 1  # serialized tf.Examples
    assert "age" in found["predict_raw"].structured_input_signature[1]
    rows = with_header(tmp_path, census_rows(5, seed=3))
    default = predict.predict_file(export, str(rows))
    assert len(default) == 5
    # The same rows as serialized tf.Examples through the canned export's own signatures.
    examples = predict.predict_file(export, str(rows), signature_name="predict")
    assert list(examples.columns) == list(default.columns)
    key = "probabilities_1" if head == "classification" else "predictions_0"
    np.testing.assert_allclose(examples[key], default[key], rtol=1e-5)
    served = predict.predict_file(export, str(rows), signature_name=head)
    assert len(served) == 5
    served_key = "scores_1" if head == "classification" else \
        next(c for c in served.columns if c.startswith("outputs"))
    np.testing.assert_allclose(served[served_key], default[key], rtol=1e-5)


def test_predict_runs_a_canned_export_through_the_cli(tmp_path, census_export):
    done = predict_cli(census_export, with_header(tmp_path, census_rows(3)), "--signature",
                       "serving_default")
    frame = frame_of(done)
    assert len(frame) == 3 and {"classes_0", "scores_1"} <= set(frame.columns), frame


def test_predict_names_a_missing_signature_and_the_fix(tmp_path, census_export):
    done = predict_cli(census_export, with_header(tmp_path, census_rows(2)), "--signature",
                       "classify")
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "--signature classify" in line and "predict_raw" in line and \
        "serving_default" in line, line


# -- predict's CSV hygiene ------------------------------------------------------------------

@pytest.fixture(scope="module")
def census_export(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("census")
    model_dir, _ = train_census(tmp_path, "census_wide_deep", "--export", "final")
    (export,) = [os.path.dirname(p) for p in final_export(model_dir)]
    return export


def test_predict_writes_two_dimensional_string_outputs_as_text(tmp_path, census_export):
    """A canned classifier's classes/all_classes ([N, 1], [N, 2] strings) were b'0'."""
    frame = frame_of(predict_cli(census_export, with_header(tmp_path, census_rows(4))))
    assert set(frame["all_classes_0"]) == {"0"} and set(frame["all_classes_1"]) == {"1"}
    assert set(frame["classes_0"]) <= {"0", "1"}


def test_predict_strips_string_cells_as_it_strips_numbers(tmp_path, census_export):
    """Raw UCI rows ("47, Private, ...") went silently out of vocabulary: other predictions."""
    clean = with_header(tmp_path, census_rows(6, seed=4), "clean.csv")
    spaced = with_header(tmp_path, census_rows(6, seed=4, sep=", "), "spaced.csv")
    assert " Private" in spaced.read_text() or " State-gov" in spaced.read_text() or \
        " Federal-gov" in spaced.read_text()
    a = frame_of(predict_cli(census_export, clean))
    b_done = predict_cli(census_export, spaced)
    b = frame_of(b_done)
    np.testing.assert_allclose(a["probabilities_1"].astype(float),
                               b["probabilities_1"].astype(float), rtol=1e-6)
    assert "vocabulary" not in b_done.stderr, b_done.stderr


def test_predict_says_when_a_value_is_outside_the_exports_vocabulary(tmp_path, census_export):
    rows = census_rows(3, seed=5).replace("Private", "Privat").replace(
        "Federal-gov", "Privat").replace("State-gov", "Privat").replace(
        "Self-emp-not-inc", "Privat")
    done = predict_cli(census_export, with_header(tmp_path, rows))
    assert done.returncode == 0, done.stderr
    assert "feature 'workclass': 3 of 3 values are outside the vocabulary the export knows " \
           "(first 'Privat'" in done.stderr, done.stderr
    assert "education" not in done.stderr  # its values are all known


def test_predict_reads_a_csv_without_a_header_by_its_columns(tmp_path, census_export):
    """The official census files have no header line: its first row was read as one."""
    bare = census_csv(tmp_path, n=5, seed=6, name="adult.test")
    named = frame_of(predict_cli(census_export, bare, "--no_header", "--columns",
                                 CENSUS_HEADER))
    assert len(named) == 5
    headed = predict.predict_file(census_export, str(with_header(tmp_path, bare.read_text())))
    np.testing.assert_allclose(named["probabilities_1"].astype(float),
                               headed["probabilities_1"], rtol=1e-6)
    unnamed = tmp_path / "bare.csv"
    unnamed.write_text(bare.read_text())
    with pytest.raises(UserError, match="--no_header --columns"):
        predict.predict_file(census_export, str(unnamed))


def test_no_header_and_columns_go_together():
    for flags in ({"no_header": True, "columns": None}, {"no_header": False, "columns": "a,b"}):
        with pytest.raises(UserError, match="--columns"):
            predict.csv_columns(argparse.Namespace(**flags))
    assert predict.csv_columns(argparse.Namespace(no_header=True, columns="a, b")) == ["a", "b"]


# -- a model or input names its serving input -----------------------------------------------

@pytest.mark.parametrize("named_by", [
    ["--model", "mnist_r1_served"],  # serving_input={"image": [[28, 28], "float32"]}
    ["--model", "mnist_r1", "--input", "mnist_flat_served"]])  # a receiver fn
def test_a_model_or_input_names_its_serving_input(tmp_path, named_by):
    """The official MNIST export takes image [28, 28]; the one read off its [784] training
    images took [N, 784], and predict refused a [5, 28, 28] array."""
    model_dir = tmp_path / "mnist"
    done = run_cli("train", "--import", "canned_models", *named_by, "--batch_size", "8",
                   "--train_steps", "3", "--eval_steps", "1", "--model_dir", model_dir,
                   env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "serving input named by" in done.stdout and "image [28, 28] float32" in done.stdout
    (export,) = [os.path.dirname(p) for p in final_export(model_dir)]
    (spec,) = signatures(export)["serving_default"].structured_input_signature[1].values()
    assert spec.shape.as_list() == [None, 28, 28]
    images = tmp_path / "five.npy"
    np.save(images, np.random.RandomState(1).rand(5, 28, 28).astype(np.float32))
    frame = predict.predict_file(export, str(images))
    assert len(frame) == 5 and "classes" in frame.columns
