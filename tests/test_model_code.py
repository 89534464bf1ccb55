"""Model code as Estimator accepts it (issue 29): every model_fn and input_fn signature
Estimator takes, plain-tensor features, and train_ops that cannot train refused early.

The user module is the "Estimator + MirroredStrategy" example of TensorFlow's distribution
guide, verbatim but for the compat.v1 spelling, plus the one-line change that makes it
train here (`estimator_dist.minimize(loss)`), imported with --import from a temp dir.
"""
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import estimator_dist as ed
from conftest import make_config
from support import REPO, run_cli
from estimator_dist.training import run as runner
from estimator_dist.errors import UserError
from estimator_dist.training.registry import INPUTS, MODELS

TRAIN, EVAL, PREDICT = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL, \
    tf.estimator.ModeKeys.PREDICT

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

STEP_LINE = ("its train_op did not advance the global step in 3 updates (still 0), so training "
             "would never reach --train_steps; build it with estimator_dist.minimize(loss) or "
             "pass global_step=tf.compat.v1.train.get_or_create_global_step() to the "
             "optimizer's minimize/apply_gradients")


def cli(tmp_path, *args, timeout=240):
    """`python -m estimator_dist ARGS` with tmp_path importable, as a user runs it."""
    return run_cli(*args, env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO])),
                   timeout=timeout)


@pytest.fixture
def tutorial(tmp_path):
    (tmp_path / "tutorial_module.py").write_text(TUTORIAL)
    return tmp_path


def test_the_tutorial_verbatim_is_refused_in_seconds_for_its_step_and_trains_with_minimize(
        tutorial):
    # The input ignores --batch_size (one example a batch); mirrored wants one dividing by 2.
    base = ["train", "--import", "tutorial_module", "--input", "tutorial", "--batch_size", 2,
            "--train_steps", 20]
    for strategy in (["--strategy", "none"], ["--strategy", "mirrored", "--num_devices", 2]):
        done = cli(tutorial, *base, "--model", "tutorial", "--model_dir", tutorial / "verbatim",
                   *strategy)
        # STEP_LINE counts the updates it took (3): refused at its start, not after 20 steps.
        assert done.returncode == 2, done
        assert done.stderr == f"estimator-dist: error: model 'tutorial': {STEP_LINE} (a " \
                              f"tf.keras optimizer never steps it)\n"
        assert not (tutorial / "verbatim").exists()  # only step 0's initial weights were saved
    # Tower splits every batch over its towers: the tutorial's examples are unbatched scalars.
    done = cli(tutorial, *base, "--model", "tutorial", "--model_dir", tutorial / "tower",
               "--strategy", "tower", "--num_devices", 2)
    assert done.returncode == 2, done
    assert done.stderr.startswith("estimator-dist: error: --strategy tower splits each batch "
                                  "along its first dimension, but the input yields a scalar"), done

    model_dir = tutorial / "minimize"
    done = cli(tutorial, *base, "--model", "tutorial_minimize", "--model_dir", model_dir)
    assert done.returncode == 0, done
    assert "features are one tensor, not a dict: SavedModels take it as serving input 'input' " \
           "[1] float32" in done.stdout
    assert "done: step 20  loss 0.0000" in done.stdout, done.stdout  # y = 1 from x = 1, learnt
    np.save(tutorial / "x.npy", np.array([[1.0], [2.0]], np.float32))
    predicted = cli(tutorial, "predict", "--saved_model", model_dir, "--input", tutorial / "x.npy")
    assert predicted.returncode == 0, predicted
    first = float(predicted.stdout.splitlines()[1])
    assert predicted.stdout.splitlines()[0] == "logits_0" and abs(first - 1.0) < 1e-3

    done = cli(tutorial, *base, "--model", "tutorial_minimize", "--model_dir",
               tutorial / "mirrored", "--strategy", "mirrored", "--num_devices", 2)
    assert done.returncode == 0 and "done: step 20  loss 0.0000" in done.stdout, done


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


def keras_optimizer(features, labels, mode):
    """A TF2 habit: a tf.keras optimizer's apply_gradients (it steps no global step)."""
    def train_op(loss):
        variables = tf.compat.v1.trainable_variables()
        return tf.keras.optimizers.SGD(0.1).apply_gradients(
            zip(tf.compat.v1.gradients(loss, variables), variables))
    return _regression(features, labels, mode, train_op)


def keras_optimizer_stepped(features, labels, mode):
    """The same with the global step stepped by hand: it counts, but no weight ever moves."""
    def train_op(loss):
        variables = tf.compat.v1.trainable_variables()
        step = tf.compat.v1.train.get_or_create_global_step()
        return tf.group(tf.keras.optimizers.SGD(0.1).apply_gradients(
            zip(tf.compat.v1.gradients(loss, variables), variables)), step.assign_add(1))
    return _regression(features, labels, mode, train_op)


def learning_rate_zero(features, labels, mode, params):
    return _regression(features, labels, mode, lambda loss: ed.minimize(
        loss, {**params, "learning_rate": 0.0}))


def stop_gradient_output(features, labels, mode):
    prediction = tf.stop_gradient(tf.compat.v1.layers.dense(features, 1, name="linear"))
    if mode == PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"y": prediction})
    loss = tf.compat.v1.losses.mean_squared_error(labels, prediction)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=ed.minimize(loss))


WEIGHTS_LINE = "no trainable variable changed in the first 3 updates while the loss is "
OPT_OUT = "; --weights_check_steps 0 turns this check off for deliberate freezing"


@pytest.mark.parametrize("model_fn, strategy, message", [
    (keras_optimizer, {}, STEP_LINE),
    (keras_optimizer, {"strategy": "mirrored", "num_devices": 2}, STEP_LINE),
    (keras_optimizer_stepped, {}, WEIGHTS_LINE),
    (learning_rate_zero, {}, WEIGHTS_LINE),
    (learning_rate_zero, {"strategy": "tower", "num_devices": 2}, WEIGHTS_LINE),
    (learning_rate_zero, {"accumulate_steps": 2}, WEIGHTS_LINE),
    (stop_gradient_output, {}, "the loss has no gradient to any trainable variable "
                               "(linear/kernel, linear/bias): a tf.stop_gradient"),
    (stop_gradient_output, {"strategy": "mirrored", "num_devices": 2},
     "the loss has no gradient to any trainable variable (linear/kernel, linear/bias)"),
])
def test_a_train_op_that_cannot_train_is_refused_in_seconds(model_fn, strategy, message,
                                                            registered, tmp_path):
    name = registered(model_fn, input_params)
    config = make_config(name, input=name, train_steps=1000000, batch_size=8, eval_steps=1,
                         model_dir=str(tmp_path / "run"), seed=1, **strategy)
    with pytest.raises(UserError) as e:  # of 1,000,000 steps: never ends unless refused
        runner.train(config, out=lambda *_: None)
    assert message in str(e.value), str(e.value)  # it counts the updates it took: 3
    assert not (tmp_path / "run").exists()  # nothing trained: the run's dir is removed


def test_weights_that_never_move_name_the_likely_cause(registered, tmp_path):
    causes = {
        keras_optimizer_stepped: "likely a tf.keras optimizer (in graph mode its apply_gradients "
                                 "changes nothing: use estimator_dist.minimize(loss)) or a "
                                 "learning rate of 0" + OPT_OUT,
        learning_rate_zero: "the learning rate is 0 (--set learning_rate=...)" + OPT_OUT,
    }
    for model_fn, cause in causes.items():
        name = registered(model_fn, input_params)
        hparams = {"learning_rate": 0.0} if model_fn is learning_rate_zero else {}
        MODELS.unregister(name)
        MODELS.register(name, hparams=hparams)(model_fn)
        config = make_config(name, input=name, train_steps=50, batch_size=8, eval_steps=1,
                             model_dir=str(tmp_path / name))
        with pytest.raises(UserError) as e:
            runner.train(config, out=lambda *_: None)
        assert str(e.value).startswith(f"model '{name}': {WEIGHTS_LINE}")
        assert str(e.value).endswith(cause), str(e.value)


def test_deliberate_freezing_trains_with_the_opt_out(registered, tmp_path):
    name = registered(learning_rate_zero, input_params)
    config = make_config(name, input=name, train_steps=6, batch_size=8, eval_steps=1,
                         model_dir=str(tmp_path / "frozen"), weights_check_steps=0)
    assert runner.train(config, out=lambda *_: None)["global_step"] == 6


def test_weights_check_steps_must_not_be_negative(tmp_path):
    with pytest.raises(UserError, match=r"^--weights_check_steps -1: must be >= 0 \(0 turns the "
                                        r"check off\)$"):
        runner.train(make_config("digits", weights_check_steps=-1,
                                 model_dir=str(tmp_path / "r")))


HOROVOD_MODULE = '''
import numpy as np
import tensorflow as tf
import estimator_dist as ed

X = np.random.RandomState(0).randn(64, 2).astype(np.float32)
Y = X @ np.array([[1.0], [-2.0]], np.float32) + 0.5


@ed.register_input("plain_pairs")
def input_fn(input_context, params):
    ds = tf.data.Dataset.from_tensor_slices((X, Y))
    if input_context is not None:  # None where no strategy gives one
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.repeat().batch(params["batch_size"])


@ed.register_model("no_params")
def model_fn(features, labels, mode):
    prediction = tf.compat.v1.layers.dense(features, 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"y": prediction})
    loss = tf.compat.v1.losses.mean_squared_error(labels, prediction)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=ed.minimize(loss))
'''


def test_two_horovod_ranks_train_a_model_fn_without_params(tmp_path):
    pytest.importorskip("horovod")
    (tmp_path / "no_params_module.py").write_text(HOROVOD_MODULE)
    done = cli(tmp_path, "cluster", "--launcher", "horovod", "--workers", 2, "--import",
               "no_params_module", "--model", "no_params", "--input", "plain_pairs",
               "--batch_size", 8, "--train_steps", 30, "--eval_steps", 2, "--model_dir",
               tmp_path / "hvd", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "strategy horovod on rank 0 of 2" in done.stdout
    loss = float(re.search(r"\[rank:0\] done: step 30  loss (\S+)", done.stdout).group(1))
    assert loss < 0.1, done.stdout
