"""Model code as Estimator accepts it (issue 29): every model_fn and input_fn signature
Estimator takes, plain-tensor features, and train_ops that cannot train refused early.

The user module is the "Estimator + MirroredStrategy" example of TensorFlow's distribution
guide, verbatim but for the compat.v1 spelling, plus the one-line change that makes it
train here (`estimator_dist.minimize(loss)`), imported with --import from a temp dir.
"""
import glob
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import estimator_dist as ed
from conftest import REPO, make_config
from estimator_dist import runner
from estimator_dist.errors import UserError
from estimator_dist.registry import INPUTS, MODELS

TRAIN, EVAL, PREDICT = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL, \
    tf.estimator.ModeKeys.PREDICT
REFUSED_WITHIN_S = 30

TUTORIAL = '''
import tensorflow as tf
import estimator_dist as ed


def model_fn(features, labels, mode):
  layer = tf.compat.v1.layers.Dense(1)
  logits = layer(features)

  if mode == tf.estimator.ModeKeys.PREDICT:
    predictions = {"logits": logits}
    return tf.estimator.EstimatorSpec(mode, predictions=predictions)

  loss = tf.compat.v1.losses.mean_squared_error(
      labels=labels, predictions=tf.reshape(logits, []))

  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(mode, loss=loss)

  if mode == tf.estimator.ModeKeys.TRAIN:
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.2).minimize(loss)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn():
  features = tf.data.Dataset.from_tensors([[1.]]).repeat(100)
  labels = tf.data.Dataset.from_tensors(1.).repeat(100)
  return tf.data.Dataset.zip((features, labels))


ed.register_model("tutorial")(model_fn)
ed.register_input("tutorial")(input_fn)


@ed.register_model("tutorial_minimize")
def model_fn_minimize(features, labels, mode):
  """The tutorial with its train op from estimator_dist.minimize(loss): no params needed."""
  logits = tf.compat.v1.layers.Dense(1)(features)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
  loss = tf.compat.v1.losses.mean_squared_error(
      labels=labels, predictions=tf.reshape(logits, []))
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(mode, loss=loss)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=ed.minimize(loss))
'''

def cli(tmp_path, *args, timeout=240):
    """`python -m estimator_dist ARGS` with tmp_path importable, as a user runs it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "estimator_dist", *map(str, args)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)
    done.seconds = time.monotonic() - started
    return done


@pytest.fixture
def tutorial(tmp_path):
    (tmp_path / "tutorial_module.py").write_text(TUTORIAL)
    return tmp_path


# Estimator's signatures, each a linear regression y = x . [1, -2] + 0.5 on plain-tensor
# features: (model_fn, input_fn) pairs, trained under every strategy family below.
W_TRUE = np.array([[1.0], [-2.0]], np.float32)
X = np.random.RandomState(0).randn(64, 2).astype(np.float32)
Y = X @ W_TRUE + 0.5


def _regression(features, labels, mode, minimize=ed.minimize):
    prediction = tf.compat.v1.layers.dense(features, 1, name="linear")
    if mode == PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"y": prediction})
    loss = tf.compat.v1.losses.mean_squared_error(labels, prediction)
    if mode == EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=minimize(loss))


def model_features_labels_mode(features, labels, mode):
    return _regression(features, labels, mode)


def model_with_config(mode, config, labels, features):
    assert isinstance(config, tf.estimator.RunConfig)
    return _regression(features, labels, mode)


def model_with_params(features, labels, mode, params):
    return _regression(features, labels, mode, lambda loss: ed.minimize(loss, params))


def _dataset(batch):
    return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(batch)


def input_without_arguments():
    return _dataset(8)


def input_params(params):
    return _dataset(params["batch_size"])


def input_mode_config(mode, config):
    assert isinstance(config, tf.estimator.RunConfig) and mode in (TRAIN, EVAL)
    return _dataset(8)


def input_context_first(input_context, params, unused=None):
    ds = _dataset(params["batch_size"])
    if input_context is not None and input_context.num_input_pipelines > 1:
        return ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds


SIGNATURES = {
    "none": (model_features_labels_mode, input_without_arguments, {}),
    "mirrored": (model_with_config, input_mode_config, {"strategy": "mirrored",
                                                        "num_devices": 2}),
    "tower": (model_features_labels_mode, input_params, {"strategy": "tower", "num_devices": 2}),
    "accumulation": (model_with_config, input_context_first, {"accumulate_steps": 2}),
    "horovod": (model_with_params, input_context_first, {"strategy": "horovod"}),
}


@pytest.fixture
def registered():
    names = []

    def register(model_fn, input_fn):
        name = f"sig_{model_fn.__name__}_{input_fn.__name__}"
        for registry, fn in ((MODELS, model_fn), (INPUTS, input_fn)):
            registry.unregister(name)
            registry.register(name)(fn)
        names.append(name)
        return name

    yield register
    for name in names:
        MODELS.unregister(name)
        INPUTS.unregister(name)


@pytest.mark.parametrize("kind", list(SIGNATURES))
def test_every_estimator_signature_trains_under_each_strategy(kind, registered, tmp_path):
    if kind == "horovod":
        pytest.importorskip("horovod")
    model_fn, input_fn, flags = SIGNATURES[kind]
    name = registered(model_fn, input_fn)
    lines = []
    config = make_config(name, input=name, train_steps=30, batch_size=8, eval_steps=2,
                         model_dir=str(tmp_path / kind), save_checkpoints_steps=30, seed=1,
                         **flags)
    summary = runner.train(config, out=lines.append)
    assert summary["global_step"] == 30 and summary["metrics"]["loss"] < 0.1, lines
    if kind == "none":  # the plain-tensor SavedModel takes 'input' and computes the model
        serve = tf.saved_model.load(summary["exports"][-1]).signatures["serving_default"]
        assert list(serve.structured_input_signature[1]) == ["input"]
        predicted = serve(input=tf.constant(X[:4]))["y"].numpy()
        np.testing.assert_allclose(predicted, Y[:4], atol=0.3)


@pytest.mark.parametrize("args", ["", "params", "mode, config", "input_context",
                                  "config, params, mode, input_context", "params, repeat=2"])
def test_every_estimator_input_signature_registers(args):
    name = "input_sig_" + str(abs(hash(args)))
    try:
        INPUTS.register(name)(eval(f"lambda {args}: None"))  # noqa: S307
    finally:
        INPUTS.unregister(name)


def test_an_input_argument_estimator_cannot_give_is_refused():
    with pytest.raises(UserError) as e:
        INPUTS.register("input_sig_bad")(lambda params, batch: None)
    assert str(e.value) == (
        "input 'input_sig_bad' has arguments (params, batch); allowed: (mode, params, config, "
        "input_context), others only with a default, required: (none); rename or drop batch")


def test_minimize_without_params_outside_a_run_says_what_to_pass():
    with tf.Graph().as_default(), pytest.raises(UserError, match=r"pass the model_fn's params: "
                                                                 r"minimize\(loss, params\)$"):
        ed.minimize(tf.constant(1.0))
