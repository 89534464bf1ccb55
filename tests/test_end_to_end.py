"""Small real runs per strategy: files on disk, loss falls, resume, checkpoint interchange, export."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from conftest import make_config, quick_train
from estimator_dist.training import plan as plan_lib
from estimator_dist.training import estimator as estimator_lib
from estimator_dist.training import run as runner
from estimator_dist.cli.main import main
from input_fns.digits import load_arrays

STRATEGIES = [("none", 1), ("mirrored", 2), ("central_storage", 2)]


def event_losses(model_dir):
    losses = []
    for path in sorted(glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "loss":
                    losses.append((event.step, value.simple_value))
    return [loss for _, loss in sorted(losses)]


@pytest.mark.parametrize("strategy,n", STRATEGIES)
def test_train_files_loss_resume(strategy, n, tmp_path):
    summary = quick_train(tmp_path, steps=40, strategy=strategy, num_devices=n,
                          summary_json=str(tmp_path / "summary.json"))
    assert summary["global_step"] == 40 and summary["num_devices"] == n
    assert os.path.exists(tmp_path / "model.ckpt-40.index")
    assert os.path.exists(tmp_path / "config.yaml")
    losses = event_losses(tmp_path)
    assert len(losses) >= 2 and np.mean(losses[-2:]) < losses[0], losses
    (export,) = summary["exports"]
    assert os.path.exists(os.path.join(export, "saved_model.pb"))
    written = json.load(open(tmp_path / "summary.json"))
    assert written["global_step"] == 40 and written["examples_per_sec"] > 0
    assert 0 <= written["metrics"]["accuracy"] <= 1

    lines = []
    resumed = runner.train(make_config(train_steps=60, strategy=strategy, num_devices=n,
                                       model_dir=str(tmp_path), batch_size=32,
                                       save_checkpoints_steps=20, export="none"),
                           out=lines.append)
    assert resumed["start_step"] == 40 and resumed["global_step"] == 60
    assert any("resuming from the checkpoint at step 40" in line for line in lines)


@pytest.mark.parametrize("first,second", [(("mirrored", 2), ("none", 1)),
                                          (("none", 1), ("mirrored", 2))])
def test_checkpoint_interchange(first, second, tmp_path):
    quick_train(tmp_path, steps=20, strategy=first[0], num_devices=first[1], export="none")
    before = tf.train.load_checkpoint(str(tmp_path)).get_tensor("digits_cnn/fc/kernel")
    summary = quick_train(tmp_path, steps=30, strategy=second[0], num_devices=second[1],
                          export="none", save_checkpoints_steps=10)
    assert summary["start_step"] == 20 and summary["global_step"] == 30
    after = tf.train.load_checkpoint(str(tmp_path)).get_tensor("digits_cnn/fc/kernel")
    # Training continued from the restored weights, not from a fresh init.
    assert np.abs(after - before).max() < np.abs(before).max()


def test_export_matches_estimator_predict(trained_digits, tmp_path):
    model_dir, summary = trained_digits
    _, _, eval_x, _ = load_arrays(False)
    images = eval_x[:16]
    config, _ = __import__("estimator_dist.cli.commands", fromlist=["x"]).saved_config(str(model_dir))
    p = plan_lib.plan(config)
    est = estimator_lib.single_device_estimator(p)
    expected = list(est.predict(tf.compat.v1.estimator.inputs.numpy_input_fn(
        {"image": images}, shuffle=False, batch_size=8)))
    signature = tf.saved_model.load(summary["exports"][0]).signatures["serving_default"]
    got = signature(image=tf.constant(images))
    np.testing.assert_allclose(got["probabilities"].numpy(),
                               np.stack([e["probabilities"] for e in expected]), atol=1e-5)
    assert list(got["class_ids"].numpy()) == [e["class_ids"] for e in expected]


def test_saved_model_cli_show_and_run(trained_digits, tmp_path):
    _, summary = trained_digits
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    export = summary["exports"][0]
    show = subprocess.run([cli, "show", "--dir", export, "--tag_set", "serve",
                           "--signature_def", "serving_default"],
                          capture_output=True, text=True, timeout=120)
    assert show.returncode == 0, show.stderr
    assert "inputs['image']" in show.stdout and "outputs['class_ids']" in show.stdout
    np.save(tmp_path / "x.npy", load_arrays(False)[2][:3])
    run = subprocess.run([cli, "run", "--dir", export, "--tag_set", "serve", "--signature_def",
                          "serving_default", "--inputs", f"image={tmp_path / 'x.npy'}"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "probabilities" in run.stdout


def test_cli_export_and_predict_csv(trained_digits, tmp_path, capsys):
    model_dir, summary = trained_digits
    export_base = tmp_path / "exports"
    assert main(["export", "--model_dir", str(model_dir), "--export_dir", str(export_base)]) == 0
    (exported,) = glob.glob(str(export_base / "*" / "saved_model.pb"))
    _, _, eval_x, _ = load_arrays(False)
    pd.DataFrame(eval_x[:20].reshape(20, -1)).to_csv(tmp_path / "x.csv", index=False)
    out = tmp_path / "pred.csv"
    assert main(["predict", "--saved_model", os.path.dirname(exported), "--input",
                 str(tmp_path / "x.csv"), "--output", str(out), "--batch_size", "7"]) == 0
    frame = pd.read_csv(out)
    assert len(frame) == 20 and list(frame.columns[:2]) == ["class_ids", "probabilities_0"]
    signature = tf.saved_model.load(summary["exports"][0]).signatures["serving_default"]
    direct = signature(image=tf.constant(eval_x[:20]))["class_ids"].numpy()
    assert list(frame["class_ids"]) == list(direct)  # same rows, input order kept


def test_cli_predict_refuses_an_array_of_the_wrong_shape_or_dtype(trained_digits, tmp_path, capsys):
    """4 examples of 8x8x3 used to be reshaped silently into 12 of 8x8x1."""
    model_dir, _ = trained_digits
    cases = {"rgb.npy": (np.zeros((4, 8, 8, 3), np.float32), "array of shape [4, 8, 8, 3] does "
                         "not fit feature 'image' of shape [N, 8, 8, 1]"),
             "text.npy": (np.array([["a"] * 64] * 2), "array of dtype <U1; feature 'image' takes "
                          "float32 numbers")}
    for name, (array, message) in cases.items():
        np.save(tmp_path / name, array)
        assert main(["predict", "--saved_model", str(model_dir), "--input", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"estimator-dist: error: --input {tmp_path / name}: {message}"), err
    np.save(tmp_path / "flat.npy", np.zeros((3, 64), np.float32))  # one flattened example per row
    assert main(["predict", "--saved_model", str(model_dir), "--input", str(tmp_path / "flat.npy")]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 1 + 3


def test_cli_evaluate_named_checkpoint(trained_digits, capsys):
    model_dir, _ = trained_digits
    assert main(["evaluate", "--model_dir", str(model_dir), "--checkpoint", "model.ckpt-60"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "global_step 60" in out
    assert main(["evaluate", "--model_dir", str(model_dir), "--checkpoint", "model.ckpt-7"]) == 2
    assert main(["evaluate", "--model_dir", str(model_dir), "--checkpoint", str(model_dir)]) == 2
    assert capsys.readouterr().err.endswith(f"--checkpoint {model_dir}: is a directory; name one "
                                            f"checkpoint, e.g. {model_dir / 'model.ckpt-60'}\n")
    # It read the one file as a whole checkpoint: "the model has ... that the checkpoint lacks".
    for suffix in (".index", ".data-00000-of-00001"):
        named = str(model_dir / f"model.ckpt-60{suffix}")
        assert main(["evaluate", "--model_dir", str(model_dir), "--checkpoint", named]) == 2
        assert capsys.readouterr().err == (f"estimator-dist: error: --checkpoint {named}: names one "
                                           f"file of a checkpoint; give its prefix, "
                                           f"{model_dir / 'model.ckpt-60'}\n")


SERVING_FIX = "make the input's prepare() serving_features match what its input_fn yields"
SERVING_MISMATCH = ("estimator-dist: error: feature 'x': input 'serving_xy' yields "
                    "[[6], 'float32'] in training, its serving_features say {} (shape without "
                    "batch, dtype); a SavedModel exported from this run would not serve; "
                    + SERVING_FIX)


def train_serving(model_dir, serving, strategy="none", n=1):
    """cli.main train of tests/serving_models.py: (exit code) with serving_features `serving`."""
    return main(["train", "--import", "serving_models", "--model", "serving_mlp",
                 "--set", f"serving={serving}", "--strategy", strategy, "--num_devices", str(n),
                 "--batch_size", "16", "--model_dir", str(model_dir)])


@pytest.mark.parametrize("serving,strategy,n,message", [
    ("shape", "none", 1, SERVING_MISMATCH.format("[[5], 'float32']")),
    ("dtype", "mirrored", 2, SERVING_MISMATCH.format("[[6], 'int32']")),
    ("rank", "tower", 2, SERVING_MISMATCH.format("[[6, 1], 'float32']")),
    ("name", "none", 1, "estimator-dist: error: serving feature 'z' [[6], 'float32']: input "
                        "'serving_xy' does not yield it in training (it yields 'weight', 'x'); a "
                        "SavedModel exported from this run would not serve; " + SERVING_FIX),
])
def test_serving_features_that_disagree_with_the_input_are_refused_before_training(
        serving, strategy, n, message, tmp_path, capsys):
    """Checked on the TRAIN graph's features (a replica's, a tower's slice). It trained and
    exported a SavedModel that failed in predict ([5]), or failed at the export after
    training (int32, 'z'), leaving checkpoints."""
    assert train_serving(tmp_path / "run", serving, strategy, n) == 2
    assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("serving", ["ok", "unknown"])
def test_training_only_features_and_unknown_serving_dims_pass_the_check(serving, tmp_path):
    """'weight' is yielded but not served (a model may read it only in training); a None dim
    in serving_features matches the input's 6."""
    assert train_serving(tmp_path / "run", serving) == 0
    assert tf.train.latest_checkpoint(str(tmp_path / "run")).endswith("model.ckpt-2")
