"""Hparam range checks (hparam_checks) and the built-in models that call them: NaN, Inf and
negative weight decay are refused with one line before any graph is built; an explicitly
empty --model_dir is refused at parsing, for every command that takes one."""
import math
import os

import pytest
import tensorflow as tf

from conftest import make_config
from estimator_dist import cli
from estimator_dist import hparam_checks
from estimator_dist import runner
from estimator_dist.errors import UserError
from model_fns import digits, resnet

TRAIN = tf.estimator.ModeKeys.TRAIN


@pytest.mark.parametrize("check,value,message", [
    (hparam_checks.non_negative_number, math.inf,
     "learning_rate inf: must be a finite number >= 0; fix it with --set learning_rate=0.1"),
    (hparam_checks.non_negative_number, math.nan,
     "learning_rate nan: must be a finite number >= 0; fix it with --set learning_rate=0.1"),
    (hparam_checks.non_negative_number, -1.0,
     "learning_rate -1.0: must be a number >= 0; fix it with --set learning_rate=0.1"),
    (hparam_checks.fraction, math.nan,
     "learning_rate nan: must be a finite number in [0, 1); fix it with --set learning_rate=0.1"),
    (hparam_checks.fraction, -math.inf,
     "learning_rate -inf: must be a finite number in [0, 1); fix it with --set learning_rate=0.1"),
])
def test_float_hparams_must_be_finite(check, value, message):
    with pytest.raises(UserError) as e:
        check({"learning_rate": value}, "learning_rate", 0.1)
    assert str(e.value) == message


def test_finite_values_pass():
    assert hparam_checks.non_negative_number({"lr": 0}, "lr", 0.1) == 0.0
    assert hparam_checks.fraction({"m": 0.9}, "m", 0.9) == 0.9
    assert hparam_checks.non_negative_number({}, "lr", 0.1, default=0.5) == 0.5


def _build(model_fn, image_shape, params):
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        features = {"image": tf.zeros([2, *image_shape])}
        return model_fn(features, tf.zeros([2], tf.int32), TRAIN, params)


@pytest.mark.parametrize("value,message", [
    (math.nan, "weight_decay nan: must be a finite number >= 0; fix it with --set weight_decay="),
    (math.inf, "weight_decay inf: must be a finite number >= 0"),
    (-1.0, "weight_decay -1.0: must be a number >= 0; fix it with --set weight_decay="),
])
@pytest.mark.parametrize("model", ["digits", "cifar"])
def test_weight_decay_is_range_checked(model, value, message):
    if model == "digits":
        fn, shape = digits.digits_model, (8, 8, 1)
        params = {"filters": 2, "dense_units": 4, "dropout": 0.0, "learning_rate": 0.1}
    else:
        fn, shape = resnet.cifar_model_fn, (32, 32, 3)
        params = {"depth": 8, "learning_rate": 0.1}
    with pytest.raises(UserError) as e:
        _build(fn, shape, {**params, "weight_decay": value})
    assert str(e.value).startswith(message)


EMPTY_TRAIN_DIR = ("argument --model_dir: '' is empty; give a directory, or leave the flag out "
                   "for the default runs/MODEL")
EMPTY_READ_DIR = ("argument --model_dir: '' is empty; give the model_dir a train run wrote "
                  "(e.g. runs/digits)")


@pytest.mark.parametrize("form", [["--model_dir", ""], ["--model_dir="]])
@pytest.mark.parametrize("argv,prog,message", [
    (["train", "--train_steps", "2"], "train", EMPTY_TRAIN_DIR),
    (["evaluate"], "evaluate", EMPTY_READ_DIR),
    (["export"], "export", EMPTY_READ_DIR),
    (["report"], "report", EMPTY_READ_DIR),
    # Pass-through: the train flags are parsed (as `train`) before any task starts.
    (["cluster", "--workers", "1", "--train_steps", "2"], "train", EMPTY_TRAIN_DIR),
    (["tfjob", "--image", "i", "--train_steps", "2"], "train", EMPTY_TRAIN_DIR),
])
def test_an_empty_model_dir_is_refused_not_taken_for_the_default(argv, prog, message, form,
                                                                 tmp_path, monkeypatch, capsys):
    """`--model_dir ""` trained into runs/MODEL (and evaluate/export/report read the current
    directory): an explicit empty value is one line, exit 2, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv + form)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err == (f"estimator-dist {prog}: error: {message}; see 'estimator-dist {prog} "
                   f"--help'\n")
    assert os.listdir(tmp_path) == []


def test_leaving_model_dir_out_keeps_the_default():
    args = cli.build_parser().parse_args(["train"])
    assert args.model_dir is None
    config = make_config(model="digits", model_dir=args.model_dir)
    assert runner.default_model_dir(config) == os.path.join("runs", "digits")
    assert cli.build_parser().parse_args(["train", "--model_dir", "d"]).model_dir == "d"
