"""digits model_fn per mode, Keras batch-norm updates, and the quality bar of `make train`."""
import numpy as np
import pytest
import tensorflow as tf

from conftest import make_config, quick_train
from estimator_dist.training import run as runner
from estimator_dist.serving.heads import classification_spec
from estimator_dist.training.registry import MODELS, register_model
from model_fns.digits import build_network

MODES = tf.estimator.ModeKeys


def build_spec(mode, batch=5):
    entry = MODELS.get("digits")
    params = {**entry.hparams, "num_classes": 10, "train_steps": 10}
    with tf.Graph().as_default():
        features = {"image": tf.compat.v1.placeholder(tf.float32, [batch, 8, 8, 1])}
        labels = tf.compat.v1.placeholder(tf.int32, [batch])
        return entry.fn(features, labels, mode, params)


def test_predict_mode_shapes_and_dtypes():
    spec = build_spec(MODES.PREDICT)
    assert spec.predictions["class_ids"].dtype == tf.int64
    assert spec.predictions["class_ids"].shape.as_list() == [5]
    assert spec.predictions["probabilities"].shape.as_list() == [5, 10]
    assert set(spec.export_outputs) == {"serving_default", "classification"}
    assert spec.loss is None and spec.train_op is None


def test_eval_mode():
    spec = build_spec(MODES.EVAL)
    assert spec.loss.shape.as_list() == [] and spec.loss.dtype == tf.float32
    assert set(spec.eval_metric_ops) == {"accuracy"} and spec.train_op is None


def test_train_mode_steps_global_step_and_runs_bn_updates():
    spec = build_spec(MODES.TRAIN)
    assert spec.train_op is not None
    deps = [op for op in spec.train_op.graph.get_operations() if "AssignMovingAvg" in op.name]
    assert deps, "Keras BatchNormalization created no moving-average updates"


@register_model("digits_without_updates", hparams=MODELS.get("digits").hparams,
                default_input="digits")
def digits_without_updates(features, labels, mode, params):
    """The digits CNN, but forgetting net.updates (the silent TF failure)."""
    net = build_network(params["filters"], params["dense_units"], params["dropout"], 10)
    logits = net(features["image"], training=mode == MODES.TRAIN)
    return classification_spec(logits, labels, mode, params)


def moving_mean(model_dir):
    return tf.train.load_checkpoint(str(model_dir)).get_tensor("digits_cnn/bn1/moving_mean")


def test_keras_batch_norm_statistics_really_update(tmp_path):
    quick_train(tmp_path / "with", steps=20, export="none")
    quick_train(tmp_path / "without", steps=20, export="none", model="digits_without_updates")
    assert np.abs(moving_mean(tmp_path / "with")).max() > 1e-3
    # The control: without net.updates the statistics silently stay at their initial zeros.
    assert np.abs(moving_mean(tmp_path / "without")).max() == 0.0


def test_make_train_default_reaches_97_percent(tmp_path):
    """The embedded default of `make train`: its own run_defaults, one device."""
    summary = runner.train(make_config(model_dir=str(tmp_path), export="none"), out=lambda *_: None)
    assert summary["global_step"] == MODELS.get("digits").run_defaults["train_steps"]
    assert summary["metrics"]["accuracy"] >= 0.97, summary["metrics"]


def test_digits_are_read_as_scikit_learn_gives_them_without_importing_it(monkeypatch):
    """Every process that reads digits (most of the suite's) paid about 2 CPU-seconds to
    import scikit-learn for one 1797-row file; the file read directly is the same data."""
    from sklearn.datasets import load_digits

    from input_fns import digits

    assert digits.digits_csv().endswith("digits.csv.gz")
    images, labels = digits.real_digits()
    expected = load_digits()
    assert np.array_equal(images, expected.images) and np.array_equal(labels, expected.target)
    digits.real_digits.cache_clear()
    monkeypatch.setattr(digits, "digits_csv", lambda: "")  # moved: scikit-learn's own loader
    try:
        fallback_images, fallback_labels = digits.real_digits()
    finally:
        digits.real_digits.cache_clear()
    assert np.array_equal(fallback_images, images) and np.array_equal(fallback_labels, labels)
