"""Your own code and data, and exports a serving stack can use as they are (issue 25).

A TF1 user's module (no prepare(), an input that repeats in every mode) run with the
console script from its own folder; exports with class strings and the tf.Example
classification/regression signatures TF Serving's :classify and :regress need.
"""
import csv
import io
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from conftest import REPO, run_cli, run_on_a_terminal
from estimator_dist.training import progress
from estimator_dist.serving import report

BIN = os.path.dirname(sys.executable)
SAVED_MODEL_CLI = os.path.join(BIN, "saved_model_cli")
CONSOLE = os.path.join(BIN, "estimator-dist")

TF1_MODULE = textwrap.dedent('''
    """A TF1 user's model and input: no prepare(), the input repeats in every mode."""
    import numpy as np
    import tensorflow as tf
    import estimator_dist as ed

    X = np.random.RandomState(0).randn(256, 4).astype(np.float32)
    Y = (X[:, 0] + X[:, 1] > 0).astype(np.int32)


    @ed.register_input("tf1_rows")
    def tf1_rows(mode, params):
        ds = tf.data.Dataset.from_tensor_slices(({"x": X, "count": np.arange(256)}, Y))
        return ds.repeat().batch(params["batch_size"])


    @ed.register_model("tf1_mlp", hparams={"learning_rate": 0.3}, default_input="tf1_rows")
    def tf1_mlp(features, labels, mode, params):
        hidden = tf.compat.v1.layers.dense(features["x"], 16, tf.nn.relu)
        return ed.classification_spec(tf.compat.v1.layers.dense(hidden, 2), labels, mode, params)
''')


def example(features):
    """One serialized tf.Example from {name: flat list of values}."""
    def feature(values):
        values = np.asarray(values).ravel()
        if values.dtype.kind == "f":
            return tf.train.Feature(float_list=tf.train.FloatList(value=values))
        if values.dtype.kind in "iub":
            return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[str(v).encode() for v in values]))
    return tf.train.Example(features=tf.train.Features(
        feature={k: feature(v) for k, v in features.items()})).SerializeToString()


def console(cwd, *args):
    """The console script, run from `cwd` as a user runs it (no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([CONSOLE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def saved_model_cli_run(export_dir, signature, inputs_flag, value):
    result = subprocess.run([SAVED_MODEL_CLI, "run", "--dir", export_dir, "--tag_set", "serve",
                             "--signature_def", signature, inputs_flag, value],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_console_script_imports_from_the_working_directory_and_infers_the_signature(tmp_path):
    """`estimator-dist train --import my_module` from the module's own folder (no PYTHONPATH),
    an input without prepare(): the serving signature is read off its training data."""
    (tmp_path / "tf1_user.py").write_text(TF1_MODULE)
    result = console(tmp_path, "train", "--import", "tf1_user", "--model", "tf1_mlp",
                     "--train_steps", "20", "--eval_steps", "2", "--model_dir", "run")
    assert result.returncode == 0, result.stderr
    assert "serving input read off input 'tf1_rows''s training data: x [4] float32, " \
           "count [] int64" in result.stdout
    export_dir = result.stdout.split("exported: ")[1].split()[0]
    signature = tf.saved_model.load(str(tmp_path / export_dir)).signatures["serving_default"]
    assert {k: (v.shape.as_list(), v.dtype) for k, v in
            signature.structured_input_signature[1].items()} == {
        "x": ([None, 4], tf.float32), "count": ([None], tf.int64)}


def test_a_feature_whose_shape_cannot_be_inferred_is_one_line(tmp_path):
    module = TF1_MODULE.replace('{"x": X, "count": np.arange(256)}, Y))',
                                '{"x": X, "count": np.arange(256)}, Y)).map('
                                'lambda f, y: ({**f, "ids": tf.sparse.from_dense([f["count"]])}, y))')
    (tmp_path / "tf1_sparse.py").write_text(module)
    result = console(tmp_path, "train", "--import", "tf1_sparse", "--model", "tf1_mlp",
                     "--train_steps", "2", "--model_dir", "run")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "estimator-dist: error: input 'tf1_rows': feature 'ids' is a SparseTensorSpec, so its serving input "
        "cannot be inferred; return serving_features {'ids': [shape without batch, dtype]} "
        "from a prepare()")
    assert not (tmp_path / "run").exists()


def test_digits_export_serves_predict_and_classification_alike(trained_digits, tmp_path):
    model_dir, summary = trained_digits
    export_dir = summary["exports"][0]
    loaded = tf.saved_model.load(export_dir)
    assert set(loaded.signatures) == {"serving_default", "classification"}
    images = np.random.RandomState(1).rand(3, 8, 8, 1).astype(np.float32)
    predicted = loaded.signatures["serving_default"](image=tf.constant(images))
    classified = loaded.signatures["classification"](
        inputs=tf.constant([example({"image": image}) for image in images]))
    np.testing.assert_allclose(classified["scores"].numpy(), predicted["probabilities"].numpy(),
                               atol=1e-6)
    assert classified["classes"].numpy()[0].tolist() == [str(i).encode() for i in range(10)]
    out = saved_model_cli_run(export_dir, "classification", "--input_examples",
                              f"inputs=[{{'image':{images[0].ravel().tolist()}}}]")
    assert "Result for output key scores" in out
    np.save(tmp_path / "x.npy", images)
    saved_model_cli_run(export_dir, "serving_default", "--inputs", f"image={tmp_path / 'x.npy'}")


TABULAR = "size,color,label\n" + "".join(
    f"{(i * 7) % 13 / 3:.2f},{'red' if i % 3 else 'blue'},{'yes' if (i * 7) % 13 > 6 else 'no'}\n"
    for i in range(120))


@pytest.fixture(scope="module")
def tabular_run(tmp_path_factory):
    """tabular on yes/no labels, trained through the CLI."""
    root = tmp_path_factory.mktemp("tabular_strings")
    (root / "data.csv").write_text(TABULAR)
    result = run_cli("train", "--model", "tabular", "--data_path", str(root / "data.csv"),
                     "--label_column", "label", "--train_steps", "60", "--batch_size", "16",
                     "--model_dir", str(root / "run"))
    assert result.returncode == 0, result.stderr
    return root, result.stdout.split("exported: ")[1].split()[0]


def test_tabular_string_labels_export_their_classes(tabular_run):
    root, export_dir = tabular_run
    loaded = tf.saved_model.load(export_dir)
    assert set(loaded.signatures) == {"serving_default", "classification"}
    rows = pd.read_csv(root / "data.csv").head(5)
    predicted = loaded.signatures["serving_default"](
        size=tf.constant(rows["size"].values, tf.float32), color=tf.constant(rows["color"].values))
    classes = [c.decode() for c in predicted["classes"].numpy()]
    assert set(classes) <= {"no", "yes"}
    ids = predicted["class_ids"].numpy()
    assert classes == [["no", "yes"][i] for i in ids]
    classified = loaded.signatures["classification"](inputs=tf.constant(
        [example({"size": [r.size], "color": [r.color]}) for r in rows.itertuples()]))
    assert classified["classes"].numpy()[0].tolist() == [b"no", b"yes"]
    np.testing.assert_allclose(classified["scores"].numpy(), predicted["probabilities"].numpy(),
                               atol=1e-6)
    out = saved_model_cli_run(export_dir, "classification", "--input_examples",
                              "inputs=[{'size':[1.5],'color':['red']}]")
    assert "b'no' b'yes'" in out


def test_predict_prints_class_strings_in_input_order_with_an_id_column(tabular_run, tmp_path):
    root, export_dir = tabular_run
    rows = list(csv.reader(TABULAR.splitlines()))
    header = ["id"] + rows[0]
    body = [[f"r{i}"] + row for i, row in enumerate(rows[1:])]
    shuffled = [body[i] for i in np.random.RandomState(3).permutation(len(body))[:20]]
    path = tmp_path / "in.csv"
    path.write_text("\n".join(",".join(r) for r in [header] + shuffled) + "\n")
    out = tmp_path / "out.csv"
    result = run_cli("predict", "--saved_model", export_dir, "--input", str(path), "--output",
                     str(out), "--id_column", "id")
    assert result.returncode == 0, result.stderr
    frame = pd.read_csv(out)
    assert list(frame.columns)[0] == "id"
    assert frame["id"].tolist() == [r[0] for r in shuffled]
    assert set(frame["classes"]) <= {"no", "yes"}
    assert frame["classes"].tolist() == [["no", "yes"][i] for i in frame["class_ids"]]
    bad = run_cli("predict", "--saved_model", export_dir, "--input", str(path), "--id_column",
                  "key")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (f"estimator-dist: error: --id_column key: no such column in --input {path}; "
                                  f"it has id, size, color, label")


def test_regression_export_serves_the_regress_signature(tmp_path):
    data = tmp_path / "reg.csv"
    rng = np.random.RandomState(0)
    data.write_text("a,b,y\n" + "".join(f"{a:.3f},{b:.3f},{2 * a - b:.3f}\n"
                                        for a, b in rng.randn(80, 2)))
    result = run_cli("train", "--model", "tabular", "--data_path", str(data), "--label_column",
                     "y", "--set", "task=regression", "--train_steps", "20", "--batch_size", "16",
                     "--model_dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    export_dir = result.stdout.split("exported: ")[1].split()[0]
    loaded = tf.saved_model.load(export_dir)
    assert set(loaded.signatures) == {"serving_default", "regression"}
    predicted = loaded.signatures["serving_default"](a=tf.constant([0.5]), b=tf.constant([1.0]))
    regressed = loaded.signatures["regression"](inputs=tf.constant([example({"a": [0.5],
                                                                             "b": [1.0]})]))
    np.testing.assert_allclose(regressed["outputs"].numpy().ravel(),
                               predicted["predictions"].numpy(), atol=1e-6)
    out = saved_model_cli_run(export_dir, "regression", "--input_examples",
                              "inputs=[{'a':[0.5],'b':[1.0]}]")
    assert "Result for output key outputs" in out


def test_cifar_export_serves_every_signature(tmp_path):
    result = run_cli("train", "--model", "cifar", "--synthetic", "--set", "depth=8",
                     "--train_steps", "2", "--batch_size", "4", "--eval_steps", "1",
                     "--model_dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    export_dir = result.stdout.split("exported: ")[1].split()[0]
    image = np.random.RandomState(0).rand(32, 32, 3).astype(np.float32)
    out = saved_model_cli_run(export_dir, "classification", "--input_examples",
                              f"inputs=[{{'image':{image.ravel().round(3).tolist()}}}]")
    assert "Result for output key classes" in out
    np.save(tmp_path / "x.npy", image[None])
    saved_model_cli_run(export_dir, "serving_default", "--inputs", f"image={tmp_path / 'x.npy'}")


def test_progress_bar_on_an_80_column_terminal_redraws_one_line(tmp_path):
    """A real pty 80 columns wide: no redraw reaches the last column (it would wrap)."""
    code, text = run_on_a_terminal(["train", "--train_steps", "40", "--export", "none",
                                    "--model_dir", str(tmp_path)], columns=80)
    assert code == 0
    redraws = [part for line in text.split("\n") for part in line.split("\r")
               if part.startswith("[")]
    assert redraws and all(len(part) < 80 for part in redraws), redraws
    assert "] 40/40" in redraws[-1]


def test_progress_bar_fits_an_80_column_terminal():
    for step, total in ((1, 1500), (750, 1500), (1500, 1500), (99999, 100000)):
        text = (f" {step}/{total}  loss 123.4567  1,234,567 examples/sec  ETA 12:34:56 ")
        line = progress.fit_bar(text, step / total, 80)
        assert len(line) < 80 and line.startswith("[") and line.endswith(text)
    assert len(progress.fit_bar(" " + "x" * 100, 0.5, 80)) < 80


def test_report_plots_a_positive_loss_on_a_log_scale():
    frame = pd.DataFrame({"loss": [2300.0, 1.2, 0.5, 0.3], "eval_accuracy": [None, 0.5, 0.8, 0.9]},
                         index=pd.Index([0, 10, 20, 30], name="step"))
    assert report.figure(frame).axes[0].get_yscale() == "log"
    frame["loss"] = [1.0, 0.5, -0.1, 0.2]  # a loss that can be negative stays linear
    assert report.figure(frame).axes[0].get_yscale() == "linear"


def readme_blocks(section: str):
    """The ```python and ```sh blocks of a README section, as written."""
    text = open(os.path.join(REPO, "README.md")).read()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = body.split("```")[1::2]
    return ([b.split("\n", 1)[1] for b in blocks if b.startswith("python")],
            [b.split("\n", 1)[1] for b in blocks if b.startswith("sh")])


def test_readme_bring_your_own_model_runs_as_written(tmp_path):
    """my_models.py and the three commands of README's section, run in a fresh folder."""
    (python,), (commands,) = readme_blocks("Bring your own model")
    assert python.startswith("# my_models.py\n")
    (tmp_path / "my_models.py").write_text(python)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    accuracy = float(result.stdout.split("accuracy ")[1].split()[0])
    assert accuracy >= 0.9, result.stdout
    predictions = pd.read_csv(io.StringIO(result.stdout.split("exported: ")[1].split("\n", 1)[1]))
    assert predictions["classes"].tolist() == ["setosa", "virginica"]
