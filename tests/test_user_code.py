"""A TF1 user's own model_fn and input_fn, through the real CLI: the mistakes such code
commonly holds are refused before training, one line each, exit 2, nothing written.

Each test writes the user's module (as a TF1 user writes it: numpy data, tf.data,
tf.compat.v1.layers, an EstimatorSpec per mode) into a temp dir and imports it with
`--import`.
"""
import os
import re
import textwrap

from conftest import run_cli
from estimator_dist.errors import EXIT_USER

MODULE = '''
import numpy as np
import tensorflow as tf
import estimator_dist as ed

TRAIN, EVAL, PREDICT = (tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL,
                        tf.estimator.ModeKeys.PREDICT)
X = np.random.RandomState(0).randn(64, 4).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int32)


def prepare(params):
    return {{"serving_features": {{"x": [[4], "float32"]}}}}


@ed.register_input("user_xy", prepare=prepare)
def input_fn(mode, params):
{input_body}


@ed.register_model("user_mlp", hparams={{"learning_rate": 0.1, "optimizer": "sgd"}},
                   default_input="user_xy")
def model_fn(features, labels, mode, params):
{model_body}
'''

INPUT = '''
    ds = tf.data.Dataset.from_tensor_slices(({"x": X}, Y))
    if mode == TRAIN:
        ds = ds.shuffle(64).repeat()
    return ds.batch(params["batch_size"])
'''

MODEL = '''
    logits = tf.compat.v1.layers.dense(features["x"], 2)
    return ed.classification_spec(logits, labels, mode, params)
'''


def run_user_code(tmp_path, monkeypatch, *flags, input_body=INPUT, model_body=MODEL, run="run"):
    """`train --import user_code --model user_mlp FLAGS` on the module written into tmp_path,
    into tmp_path/run."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "user_code.py").write_text(MODULE.format(
        input_body=textwrap.indent(textwrap.dedent(input_body).strip(), "    "),
        model_body=textwrap.indent(textwrap.dedent(model_body).strip(), "    ")))
    monkeypatch.setenv("PYTHONPATH", str(code))
    model_dir = tmp_path / run
    done = run_cli("train", "--import", "user_code", "--model", "user_mlp", "--model_dir",
                   str(model_dir), "--batch_size", "16", *flags, timeout=120)
    return done, model_dir


def assert_refused(done, model_dir, *fragments):
    assert done.returncode == EXIT_USER, done.stderr
    assert done.stderr.startswith("estimator-dist: error: ") and \
        done.stderr.count("\n") == 1, done.stderr
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr
    assert not os.path.exists(model_dir), os.listdir(model_dir)


def test_an_eval_input_that_repeats_forever_with_eval_steps_0_is_refused(tmp_path, monkeypatch):
    """repeat() in every mode (common TF1 code) with --eval_steps 0 hung after training."""
    repeats = '''
        ds = tf.data.Dataset.from_tensor_slices(({"x": X}, Y))
        return ds.shuffle(64).repeat().batch(params["batch_size"])
    '''
    done, model_dir = run_user_code(tmp_path, monkeypatch, "--train_steps", "2",
                                    "--eval_steps", "0", input_body=repeats)
    assert_refused(done, model_dir,
                   "input 'user_xy' repeats forever in its eval call (its dataset's cardinality "
                   "is infinite): with --eval_steps 0 (the whole eval set) the evaluation would "
                   "never end; give --eval_steps N, or repeat() only in TRAIN mode")
    bounded, _ = run_user_code(tmp_path, monkeypatch, "--train_steps", "2", "--eval_steps", "2",
                               input_body=repeats, run="bounded")
    assert bounded.returncode == 0 and "done: step 2" in bounded.stdout, bounded.stderr


def test_an_input_without_labels_is_told_to_give_features_and_labels(tmp_path, monkeypatch):
    """It got advice about hparams ('check its hparams (--set, ...)')."""
    features_only = '''
        ds = tf.data.Dataset.from_tensor_slices({"x": X})
        return (ds.repeat() if mode == TRAIN else ds).batch(params["batch_size"])
    '''
    done, model_dir = run_user_code(tmp_path, monkeypatch, "--train_steps", "2",
                                    input_body=features_only)
    # The EVAL graph is built before the first step: its call may be the first to fail.
    assert re.search(r"model 'user_mlp' could not build its (train|eval) graph: ", done.stderr)
    assert_refused(done, model_dir,
                   "; it was given labels=None: input 'user_xy' gives features without labels; "
                   "an input_fn returns a tf.data.Dataset of (features, labels), e.g. "
                   "tf.data.Dataset.from_tensor_slices((features, labels)); --verbose shows the "
                   "traceback")
    assert "hparams" not in done.stderr


def test_an_input_returning_numpy_arrays_is_told_to_return_a_dataset(tmp_path, monkeypatch):
    """It got "AttributeError: 'numpy.dtypes.Float32DType' object has no attribute
    'base_dtype'" and the hparams advice."""
    done, model_dir = run_user_code(tmp_path, monkeypatch, "--train_steps", "2",
                                    input_body='return {"x": X}, Y')  # checked first: eval
    assert_refused(done, model_dir)
    assert done.stderr == (
        "estimator-dist: error: input 'user_xy' returned numpy arrays, not tensors, from its "
        "eval call; an input_fn returns a tf.data.Dataset of (features, labels), e.g. "
        "tf.data.Dataset.from_tensor_slices((features, labels)).batch(params['batch_size'])\n")


def test_a_model_fn_that_cannot_build_its_predict_graph_is_refused_before_training(
        tmp_path, monkeypatch):
    """It computed its loss from labels in every mode: the run trained to the end, wrote its
    checkpoints, then failed at the final export."""
    loss_first = '''
        logits = tf.compat.v1.layers.dense(features["x"], 2)
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        classes = tf.argmax(logits, axis=1)
        if mode == PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"classes": classes},
                export_outputs={"serving": tf.estimator.export.PredictOutput({"classes": classes})})
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
    '''
    done, model_dir = run_user_code(tmp_path, monkeypatch, "--train_steps", "2",
                                    "--export", "final", model_body=loss_first)
    assert_refused(done, model_dir,
                   "model 'user_mlp' could not build its infer graph: ValueError: ",
                   "; PREDICT mode (the export, serving) passes labels=None and only the serving "
                   "features: return the PREDICT EstimatorSpec (predictions, export_outputs) "
                   "before using labels; --verbose shows the traceback")
    unexported, _ = run_user_code(tmp_path, monkeypatch, "--train_steps", "2", "--export",
                                  "none", model_body=loss_first, run="unexported")
    assert unexported.returncode == 0, unexported.stderr  # never builds PREDICT: not refused
