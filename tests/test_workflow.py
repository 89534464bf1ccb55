"""Training workflow: early stopping, warm start, best export across restarts, eval by
seconds, progress output, report, seeded determinism; predict's CSV reading."""
import json
import os
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from conftest import make_config, quick_train, run_on_a_terminal
from estimator_dist.training import early_stopping
from estimator_dist.serving import export as export_lib
from estimator_dist.serving import predict
from estimator_dist.serving import report
from estimator_dist.training import plan as plan_lib
from estimator_dist.training import run as runner
from estimator_dist.errors import UserError
from support import TESTS, environment, run_cli



def train(model_dir, lines=None, **flags):
    flags = {"model_dir": str(model_dir), "batch_size": 32, "seed": 1, **flags}
    return runner.train(make_config(**flags), out=(lines.append if lines is not None else
                                                  (lambda *_: None)))


def eval_results(model_dir):
    from estimator_dist.compat import internals

    return internals.read_eval_metrics(os.path.join(str(model_dir), "eval"))


def test_patience_counting():
    assert early_stopping.evaluations_without_improvement([3, 2, 2, 2], False, 0.0) == 2
    assert early_stopping.evaluations_without_improvement([3, 2, 1.95], False, 0.1) == 1
    assert early_stopping.evaluations_without_improvement([0.5, 0.7], True, 0.0) == 0


def test_early_stop_on_plateau_stops_before_target_and_evaluates_at_end(tmp_path):
    lines = []
    summary = train(tmp_path, lines, train_steps=400, eval_every=10, export="none",
                    early_stop="loss", patience=2, overrides=("learning_rate=0.0",),
                    weights_check_steps=0)  # frozen on purpose: the plateau
    assert summary["global_step"] < 100, summary["global_step"]
    assert any(line.startswith("early stop at step") for line in lines), lines
    assert not any("ran out" in line for line in lines), lines  # an early stop, not the input
    assert max(eval_results(tmp_path)) == summary["global_step"]  # evaluated at the end


def test_an_early_stop_exports_the_stopped_step_as_the_final_export(tmp_path):
    """--early_stop with the default --export final ended exit 0 with "exports": []."""
    summary_json = tmp_path / "summary.json"
    model_dir = tmp_path / "run"
    # No evaluation after the first improves by more than 100: a stop after 2 evaluations.
    done = run_cli("train", "--import", "guard_models", "--model", "guard_mlp", "--model_dir",
                   model_dir, "--train_steps", "100", "--eval_every", "2", "--early_stop", "loss",
                   "--patience", "1", "--min_delta", "100", "--export", "final", "--summary_json",
                   summary_json, env=environment(TESTS), timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(summary_json.read_text())
    step = summary["global_step"]
    assert step < 100 and len(summary["exports"]) == 1, summary
    export = summary["exports"][0]
    assert os.path.dirname(export) == str(model_dir / "export" / "final")
    assert f"exported: {export}" in done.stdout
    exported = tf.train.load_variable(os.path.join(export, "variables", "variables"),
                                      "hidden/kernel")
    stopped = tf.train.load_variable(str(model_dir / f"model.ckpt-{step}"), "hidden/kernel")
    np.testing.assert_array_equal(exported, stopped)  # the stopped step's weights
    earlier = tf.train.load_variable(str(model_dir / "model.ckpt-2"), "hidden/kernel")
    assert not np.array_equal(exported, earlier)


@pytest.mark.parametrize("flags, message", [
    (dict(eval_every=10, export="none", early_stop="acuracy"), "--early_stop acuracy"),
    (dict(export="none", early_stop="acuracy"), "--early_stop acuracy"),  # one evaluation only
    (dict(export="best", best_metric="acuracy"), "--best_metric acuracy"),
])
def test_an_unknown_eval_metric_is_refused_before_anything_is_written(flags, message, tmp_path):
    """Checked on a scratch EVAL graph: it was found only at the first evaluation (after
    checkpoints were written), or not at all when there was one evaluation."""
    with pytest.raises(UserError, match=f"^{message}: not an eval metric of this model; "
                                        "it reports accuracy, loss$"):
        train(tmp_path / "run", train_steps=40, **flags)
    assert not (tmp_path / "run").exists()


def test_warm_start_changes_starting_loss_and_respects_regex(tmp_path):
    quick_train(tmp_path / "source", steps=100, export="none")
    source = tf.train.load_checkpoint(str(tmp_path / "source"))
    train(tmp_path / "fresh", train_steps=1, export="none")
    train(tmp_path / "warm", train_steps=1, export="none",
          warm_start_from=str(tmp_path / "source"))
    losses = {name: report.load(str(tmp_path / name))["loss"].dropna().iloc[0]
              for name in ("fresh", "warm")}
    assert losses["warm"] < 0.5 * losses["fresh"], losses

    train(tmp_path / "body", train_steps=1, export="none", warm_start_from=str(tmp_path / "source"),
          warm_start_vars="digits_cnn/conv.*")
    start = tf.train.load_checkpoint(str(tmp_path / "body") + "/model.ckpt-0")
    np.testing.assert_array_equal(start.get_tensor("digits_cnn/conv1/kernel"),
                                  source.get_tensor("digits_cnn/conv1/kernel"))
    assert not np.allclose(start.get_tensor("digits_cnn/logits/kernel"),
                           source.get_tensor("digits_cnn/logits/kernel"))

    # A regex that matches nothing would silently start from scratch.
    with pytest.raises(UserError, match=r"^--warm_start_vars 'digits_cnn/kernel.\*' matches none of "
                                        r"the \d+ variables of .*model.ckpt-100 \(e.g. "):
        train(tmp_path / "none", train_steps=1, export="none",
              warm_start_from=str(tmp_path / "source"), warm_start_vars="digits_cnn/kernel.*")
    assert not (tmp_path / "none").exists()
    # Variables the regex picks that do not fit: refused up front (was Estimator's traceback).
    with pytest.raises(UserError, match=r"'digits_cnn/conv1/kernel' is \[3, 3, 1, 32\] in the "
                                        r"checkpoint but \[3, 3, 1, 16\] in the model; .*narrow "
                                        r"--warm_start_vars \(now '\.\*'\)"):
        train(tmp_path / "misfit", train_steps=1, export="none", overrides=("filters=16",),
              warm_start_from=str(tmp_path / "source"))
    assert not (tmp_path / "misfit").exists()


def new_bests(values):
    best, count = None, 0
    for value in values:
        if best is None or value > best:
            best, count = value, count + 1
    return count


def test_best_export_by_accuracy_survives_a_restart(tmp_path):
    """tabular has no batch norm: with learning rate 0 the restart evaluates the same model."""
    flags = dict(model="tabular", eval_every=20, export="best", best_metric="accuracy")
    train(tmp_path, train_steps=60, **flags)
    first_exports = export_lib.export_paths(str(tmp_path))
    history = [eval_results(tmp_path)[s]["accuracy"] for s in sorted(eval_results(tmp_path))]
    assert len(first_exports) == new_bests(history) >= 1
    # A BestExporter that forgot the first run's evaluations would export the
    # restart's first evaluation, which is no better than the best so far.
    train(tmp_path, train_steps=100, overrides=("learning_rate=0.0", "optimizer=sgd"), **flags)
    later = [m["accuracy"] for s, m in eval_results(tmp_path).items() if s > 60]
    assert len(later) == 2 and max(later) <= max(history)
    assert export_lib.export_paths(str(tmp_path)) == first_exports


def test_eval_every_secs(tmp_path):
    summary = train(tmp_path, train_steps=30, eval_every_secs=1, export="none")
    assert summary["global_step"] == 30 and max(eval_results(tmp_path)) == 30


def test_eval_by_steps_and_seconds_conflict(tmp_path):
    with pytest.raises(UserError, match="give steps or seconds, not both"):
        plan_lib.plan(make_config(eval_every=10, eval_every_secs=5, model_dir=str(tmp_path)))


def test_plain_progress_lines_when_not_a_terminal(tmp_path):
    lines = []
    train(tmp_path, lines, train_steps=40, export="none")
    progress = [line for line in lines if line.startswith("step ")]
    assert progress[-1].startswith("step 40/40") and "examples/sec  ETA 0:00:00" in progress[-1]
    assert all("\r" not in line for line in lines)


def test_progress_bar_on_a_terminal(tmp_path):
    code, text = run_on_a_terminal(["train", "--train_steps", "60", "--export", "none",
                                    "--model_dir", str(tmp_path)])
    assert code == 0
    assert "\r[" in text and "] 60/60" in text and "ETA" in text
    assert "\nstep " not in text  # the bar replaces the periodic lines


def test_report_csv_last_step_equals_checkpoint_and_png(tmp_path, capsys):
    from estimator_dist.cli.main import main

    summary = train(tmp_path / "run", train_steps=40, eval_every=20, export="none")
    assert main(["report", "--model_dir", str(tmp_path / "run"), "--output_dir",
                 str(tmp_path / "out")]) == 0
    frame = pd.read_csv(tmp_path / "out" / "report.csv", index_col="step")
    assert int(frame.index.max()) == summary["global_step"] == 40
    assert {"loss", "eval_loss", "eval_accuracy"} <= set(frame.columns)
    png = (tmp_path / "out" / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    import matplotlib.image

    assert matplotlib.image.imread(str(tmp_path / "out" / "report.png")).shape[0] > 100
    assert "final eval: accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("model", ["digits", "tabular"])
def test_two_seeded_runs_match(model, tmp_path):
    weights = []
    for i in range(2):
        quick_train(tmp_path / str(i), steps=20, model=model, export="none", seed=7)
        reader = tf.train.load_checkpoint(str(tmp_path / str(i)))
        weights.append({k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()})
    for name in weights[0]:
        np.testing.assert_array_equal(weights[0][name], weights[1][name], err_msg=name)


FEATURES = {"age": tf.TensorSpec([None], tf.float32), "city": tf.TensorSpec([None], tf.string)}
IMAGE = {"image": tf.TensorSpec([None, 2, 2], tf.float32)}  # a wide CSV: 4 value columns


def write_csv(tmp_path, text, name="x.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refused(path, specs, message):
    """predict.read_csv raises exactly '--input PATH<message>'."""
    with pytest.raises(UserError, match=f"^{re.escape(f'--input {path}{message}')}$"):
        predict.read_csv(path, specs)


def test_predict_csv_keeps_string_cells_as_training_reads_them(tmp_path):
    """An empty cell of a string feature became 'nan' and '007' became '7.0' (pandas typed the
    column); training keeps every categorical cell as the raw string."""
    path = write_csv(tmp_path, "age,city\n1,\n2,007\n3,NA\n")
    features = predict.read_csv(path, FEATURES)
    assert list(features["city"]) == ["", "007", "NA"]
    np.testing.assert_array_equal(features["age"], [1, 2, 3])


@pytest.mark.parametrize("row, message", [
    ("2,b", "2 fields but the header has 3; fix that row (ragged rows are not padded or dropped)"),
    ("2,b,c,d", "4 fields but the header has 3; fix that row (ragged rows are not padded or "
                "dropped)"),
], ids=["short", "long"])
def test_predict_csv_refuses_a_row_with_another_field_count(tmp_path, row, message):
    """A short row was padded with NaN (a string feature read 'nan'); a long one was pandas'
    tokenizing error. The blank line counts: the row is on line 4."""
    path = write_csv(tmp_path, f"age,city,note\n1,a,x\n\n{row}\n")
    refused(path, FEATURES, f" line 4: {message}")


@pytest.mark.parametrize("cell", ["", "NA", " null ", "None", "n/a", "nan"])
def test_predict_csv_names_a_missing_number_as_missing(tmp_path, cell):
    """It said "nan is not a number" (or "' null ' is not a number")."""
    path = write_csv(tmp_path, f"age,city\n1,a\n{cell},b\n")
    refused(path, FEATURES, f" line 3 column 'age': missing value {cell!r} (every numeric feature "
                            f"needs a number; missing values are not imputed)")
    wide = write_csv(tmp_path, f"p0,p1,p2,p3\n1,2,3,4\n5,{cell},7,8\n", "wide.csv")
    refused(wide, IMAGE, f" line 3 column 'p1': missing value {cell!r} (every numeric feature "
                         f"needs a number; missing values are not imputed)")


@pytest.mark.parametrize("cell, problem", [
    ("abc", "'abc' is not a number"),
    ("inf", "'inf' is not a finite number; fix the value"),
    ("-Infinity", "'-Infinity' is not a finite number; fix the value"),
    ("1e400", "'1e400' is not a finite number; fix the value"),
    ("1e300", "'1e300' is beyond the range of float32, the model's feature type; fix the value"),
])
def test_predict_csv_refuses_text_and_infinity_on_the_right_line(tmp_path, cell, problem):
    """inf was fed to the model; a blank line or a quoted newline put the line number off
    (it was the row index + 2)."""
    path = write_csv(tmp_path, f'age,city\n\n1,"two\nlines"\n{cell},b\n')
    refused(path, FEATURES, f" line 5 column 'age': {problem}")


def test_predict_csv_numbers_may_have_spaces(tmp_path):
    path = write_csv(tmp_path, "age,city\n 1 ,a\n\t2.5 , b \n")
    features = predict.read_csv(path, FEATURES)
    np.testing.assert_array_equal(features["age"], np.array([1, 2.5], np.float32))
    assert list(features["city"]) == ["a", "b"]  # string cells stripped, as training strips them
    wide = write_csv(tmp_path, "p0,p1,p2,p3\n1, 2 ,3,4\n\n5,6,7, 8\n", "wide.csv")
    np.testing.assert_array_equal(predict.read_csv(wide, IMAGE)["image"],
                                  np.arange(1, 9, dtype=np.float32).reshape(2, 2, 2))


DIGITS = {"image": tf.TensorSpec([None, 8, 8, 1], tf.float32)}


def test_predict_csv_refuses_one_column_for_a_feature_of_many_values(tmp_path):
    """A column named 'image' gave the [8, 8, 1] feature one value per row: TensorFlow aborted
    the process (a failed Check in tensor_format.h, exit -6)."""
    path = write_csv(tmp_path, "image\n0.5\n")
    refused(path, DIGITS, ": column 'image' gives one value per row, but feature 'image' has "
                          "shape [8, 8, 1] (64 values per example); give a wide CSV with one "
                          "column per value (64 columns, none named 'image') or a .npy array of "
                          "shape [N, 8, 8, 1]")


def test_predict_csv_column_of_a_one_value_feature_gets_the_feature_shape(tmp_path):
    """A feature of shape [1] read from its column reached the model as [N], not [N, 1]."""
    specs = {"age": tf.TensorSpec([None, 1], tf.float32), "city": tf.TensorSpec([None, 1], tf.string)}
    features = predict.read_inputs(write_csv(tmp_path, "age,city\n1,a\n2,b\n"), specs)
    assert features["age"].shape == (2, 1) and features["city"].shape == (2, 1)


@pytest.mark.parametrize("array, problem", [
    (np.full([2, 64], np.nan), "value nan at index (0, 0) is not a finite number; fix or drop that "
                               "example (values are not imputed)"),
    (np.concatenate([np.zeros([1, 8, 8, 1]), np.full([1, 8, 8, 1], -np.inf)]),
     "value -inf at index (1, 0, 0, 0) is not a finite number; fix or drop that example (values "
     "are not imputed)"),
    (np.full([1, 64], 1e300), "value 1e+300 at index (0, 0) is beyond the range of float32, the "
                              "model's feature type; fix the value"),
    (np.zeros([0, 8, 8, 1], np.float32), None),
], ids=["nan", "inf", "1e300", "no_rows"])
def test_predict_npy_refuses_what_the_csv_path_refuses(tmp_path, array, problem):
    """NaN and Inf reached the model (exit 0); 1e300 became inf with a numpy RuntimeWarning; a
    0-row array wrote an empty CSV with exit 0."""
    path = str(tmp_path / "x.npy")
    np.save(path, array)
    message = (f"--input {path}: feature 'image': {problem}" if problem else
               f"--input {path}: array of shape [0, 8, 8, 1] holds no examples; give at least one")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
            predict.read_inputs(path, DIGITS)


def test_predict_npy_refuses_a_fraction_or_overflow_for_an_integer_feature(tmp_path):
    path = str(tmp_path / "x.npy")
    specs = {"ids": tf.TensorSpec([None], tf.int32)}
    for array, value in ((np.array([1.0, 2.5]), "2.5 at index (1,)"),
                         (np.array([1, 2 ** 40]), f"{2 ** 40} at index (1,)")):
        np.save(path, array)
        with pytest.raises(UserError, match=re.escape(f"--input {path}: feature 'ids': value {value} "
                                                      f"is not a int32 (the model's feature type")):
            predict.read_inputs(path, specs)
    np.save(path, np.array([1.0, 3.0]))
    np.testing.assert_array_equal(predict.read_inputs(path, specs)["ids"], [1, 3])


def test_predict_input_directory_is_named_a_directory(tmp_path):
    """It said "no such file"."""
    with pytest.raises(UserError, match=f"^{re.escape(f'--input {tmp_path}: is a directory; give the .csv or .npy file itself')}$"):
        predict.read_inputs(str(tmp_path), DIGITS)


def test_check_output_path_refuses_before_the_model_runs(tmp_path):
    """A missing directory was a pandas traceback after the model ran; a directory or /proc
    named the internal 'x.csv.tmp' file."""
    missing = str(tmp_path / "nodir" / "x.csv")
    cases = [
        (missing, f"--output {missing}: its directory {tmp_path / 'nodir'} does not exist; create "
                  f"it or give another path"),
        (str(tmp_path), f"--output {tmp_path}: is a directory; give a file path such as "
                        f"{tmp_path / 'predictions.csv'}"),
        ("/proc/x.csv", "--output /proc/x.csv: cannot create a file in /proc (No such file or "
                        "directory); give a path in a directory you can write to"),
    ]
    for path, message in cases:
        with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
            predict.check_output_path(path)
    predict.check_output_path(str(tmp_path / "ok.csv"))
    assert os.listdir(tmp_path) == []
    data = tmp_path / "x.csv"  # it was replaced by its predictions
    data.write_text("x\n1\n")
    with pytest.raises(UserError, match=f"^--output {re.escape(str(tmp_path))}/./x.csv: is the "
                                        f"--input file, which it would replace; give another path$"):
        predict.check_output_path(os.path.join(str(tmp_path), ".", "x.csv"), str(data))
    predict.check_output_path(str(tmp_path / "y.csv"), str(data))


def test_predict_file_reports_a_failing_signature_in_one_line(tmp_path):
    """A SavedModel whose graph disagrees with its variables ("Matrix size-incompatible")
    printed a 339-line InvalidArgumentError traceback. Here: a signature whose reshape fails at
    run time in the same way, exported under a model_dir."""

    class Broken(tf.Module):
        def __init__(self):
            super().__init__()
            self.kernel = tf.Variable(tf.ones([5, 3]))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x):
            rows = tf.reshape(x, tf.stack([-1, tf.shape(self.kernel)[0]]))
            return {"logits": tf.matmul(rows, self.kernel)}

    module = Broken()
    saved = tmp_path / "md" / "export" / "final" / "123"
    tf.saved_model.save(module, str(saved), signatures={"serving_default": module.serve})
    path = str(tmp_path / "x.npy")
    np.save(path, np.ones([2, 4], np.float32))
    message = (f"SavedModel {saved} failed on --input {path}: Input to reshape is a tensor with 8 "
               f"values, but the requested shape requires a multiple of 5; if its graph does not "
               f"match its variables, re-export it with estimator-dist export --model_dir "
               f"{tmp_path / 'md'}")
    with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
        predict.predict_file(str(saved), path)


def test_export_to_a_directory_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path):
    """--export_dir /proc/xyz was a 34-line NotFoundError traceback (a TensorFlow error, which
    the CLI's OSError guard misses)."""
    model_dir = str(tmp_path / "md")
    with tf.Graph().as_default():
        tf.compat.v1.train.create_global_step()
        tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            checkpoint = tf.compat.v1.train.Saver().save(sess, os.path.join(model_dir, "model.ckpt"))

    def model_fn(features, labels, mode):
        w = tf.compat.v1.get_variable("w", [2])
        output = tf.reduce_sum(features["x"] * w, axis=1)
        return tf.estimator.EstimatorSpec(mode, predictions=output, export_outputs={
            "serving_default": tf.estimator.export.PredictOutput({"y": output})})

    estimator = tf.estimator.Estimator(model_fn, model_dir)
    (tmp_path / "afile").write_text("x")
    for base, reason in (("/proc/estimator-dist-test/x", "/proc/estimator-dist-test; No such "
                                                         "file or directory"),
                         (str(tmp_path / "afile" / "sub"), f"{tmp_path / 'afile'} is not a "
                                                           f"directory")):
        message = (f"cannot write an export into {base} ({reason}); nothing was exported; give "
                   f"an --export_dir that can be created and written to")
        with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
            export_lib.export_saved_model(estimator, {"x": [[2], "float32"]}, base, checkpoint)
    assert sorted(os.listdir(tmp_path)) == ["afile", "md"]


def cut(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def test_report_names_an_unreadable_event_file_instead_of_train_first(tmp_path, capsys):
    """Event files cut off (a full disk, an interrupted copy) said "train first". Measured in
    TF 2.15: a file cut anywhere gives its records before the cut, and cut inside its first
    record reads as empty (no error); halved, the training file ends inside its graph, before
    any scalar."""
    from estimator_dist.cli.main import main

    model_dir = tmp_path / "run"
    train(model_dir, train_steps=2, export="none")
    argv = ["report", "--model_dir", str(model_dir), "--output_dir", str(tmp_path / "out")]
    events = sorted(model_dir.glob("events.out.tfevents.*"))
    evals = sorted((model_dir / "eval").glob("events.out.tfevents.*"))
    assert len(events) == len(evals) == 1
    fix = ("; they were cut off or damaged (a full disk, an interrupted copy): copy them again "
           "from the run's original model_dir if there is one, else their scalars are lost "
           "(training on from the latest checkpoint writes new ones)\n")

    # One file cut: the report keeps the rest and the complete records, and says so.
    half = evals[0].stat().st_size // 2
    cut(evals[0], half)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "train loss" in out and "final eval" not in out
    assert re.search(rf"\nnote: scalars may be missing: {re.escape(str(evals[0]))} is cut off or "
                     rf"corrupt at byte \d+ of {half}, after \d+ complete record\(s\)\n", out), out

    # Every file cut: nothing to report, and the message says why.
    size = events[0].stat().st_size // 2
    cut(events[0], size)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"estimator-dist: error: {re.escape(str(model_dir))} has event files, "
                        rf"but no scalar in them can be read: {re.escape(str(events[0]))} is cut "
                        rf"off or corrupt at byte \d+ of {size}, after \d+ complete record\(s\) "
                        rf"\(and 1 more file\(s\)\){re.escape(fix)}", err), err
    for path in events + evals:
        cut(path, 10)  # inside the first record's 12-byte header: read as empty
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"estimator-dist: error: {model_dir} has event files, but no scalar in them can be read: "
        f"{events[0]} holds no complete record (10 bytes) (and 1 more file(s)){fix}")

    # No event files at all: train first, as before.
    for path in events + evals:
        path.unlink()
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"estimator-dist: error: {model_dir} has no TensorBoard "
                                       f"event files with scalars; train first\n")
