"""Hparam range checks (hparam_checks) and the built-in models that call them: NaN, Inf and
negative weight decay are refused with one line before any graph is built; an explicitly
empty --model_dir, or any other flag whose '' meant "not given", is refused at parsing, for
every command that takes one."""
import math
import os

import pytest
import tensorflow as tf

from conftest import make_config
from estimator_dist.cli import main as cli
from estimator_dist.graph import hparam_checks
from estimator_dist.training import plan as plan_lib
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
    assert plan_lib.default_model_dir(config) == os.path.join("runs", "digits")
    assert cli.build_parser().parse_args(["train", "--model_dir", "d"]).model_dir == "d"


LEAVE_OUT = "or leave the flag out for"
# (command line before the empty flag, prog, flag, what the message asks for)
EMPTY_FLAGS = [
    (["train"], "train", "--input", "give a registered input (see 'estimator-dist list'), "
                                    f"{LEAVE_OUT} the model's own"),
    (["train"], "train", "--data_dir", f"give a directory, {LEAVE_OUT} the input's default"),
    (["train"], "train", "--data_path", f"give a data file, {LEAVE_OUT} the input's default "
                                        "data"),
    (["train"], "train", "--label_column", f"give a column of --data_path, {LEAVE_OUT} the "
                                           "input's default"),
    (["train"], "train", "--summary_json", f"give a file path, {LEAVE_OUT} no summary file"),
    (["train"], "train", "--warm_start_from", f"give a checkpoint or model_dir, {LEAVE_OUT} a "
                                              "cold start"),
    (["train"], "train", "--warm_start_vars", "give a regex such as 'digits_cnn/conv.*', "
                                              f"{LEAVE_OUT} all variables"),
    (["train"], "train", "--early_stop", f"give an eval metric such as loss, {LEAVE_OUT} no "
                                         "early stop"),
    (["train", "--export", "best"], "train", "--best_metric",
     f"give an eval metric such as accuracy, {LEAVE_OUT} loss"),
    (["train"], "train", "--strategy", f"give a strategy such as mirrored, {LEAVE_OUT} none"),
    (["train"], "train", "--export", f"give latest, best, final or none, {LEAVE_OUT} final"),
    (["train"], "train", "--model", "give a registered model (see 'estimator-dist list'), "
                                    f"{LEAVE_OUT} digits"),
    (["train"], "train", "--config", f"give a YAML file, {LEAVE_OUT} none"),
    (["list"], "list", "--import", "give a module name such as my_project.models"),
    # Pass-through: the train flags are parsed (as `train`) before any task starts.
    (["cluster", "--workers", "1"], "train", "--summary_json",
     f"give a file path, {LEAVE_OUT} no summary file"),
    (["tfjob", "--image", "i"], "train", "--data_dir",
     f"give a directory, {LEAVE_OUT} the input's default"),
    (["evaluate", "--model_dir", "m"], "evaluate", "--checkpoint",
     f"give a checkpoint path or model.ckpt-N, {LEAVE_OUT} the latest"),
    (["export", "--model_dir", "m"], "export", "--checkpoint",
     f"give a checkpoint path or model.ckpt-N, {LEAVE_OUT} the latest"),
    (["export", "--model_dir", "m"], "export", "--export_dir",
     f"give a directory, {LEAVE_OUT} MODEL_DIR/export/manual"),
    (["predict", "--input", "x.csv"], "predict", "--saved_model",
     "give a SavedModel directory or a model_dir"),
    (["predict", "--saved_model", "m"], "predict", "--input",
     "give a .csv or .npy file, or image files"),
    (["predict", "--saved_model", "m", "--input", "x.csv"], "predict", "--output",
     f"give a file path, {LEAVE_OUT} stdout"),
    (["tfjob", "--image", "i"], "tfjob", "--output", f"give a file path, {LEAVE_OUT} stdout"),
    (["tfjob", "--image", "i"], "tfjob", "--pvc",
     f"give a PersistentVolumeClaim name, {LEAVE_OUT} no volume"),
    (["tfjob", "--image", "i", "--pvc", "c"], "tfjob", "--mount_path",
     f"give an absolute path, {LEAVE_OUT} /mnt/estimator-dist"),
    (["report", "--model_dir", "m"], "report", "--output_dir",
     f"give a directory, {LEAVE_OUT} MODEL_DIR/report"),
    (["bench", "--quick"], "bench", "--output_dir", f"give a directory, {LEAVE_OUT} runs/bench"),
    (["bench", "--quick"], "bench", "--models", f"give cifar, mlp, imagenet or a list of them, {LEAVE_OUT} cifar,mlp"),
    (["bench", "--quick"], "bench", "--cases",
     f"give comma-separated texts of case names, {LEAVE_OUT} every case"),
]


@pytest.mark.parametrize("equals", [False, True])
@pytest.mark.parametrize("argv,prog,flag,fix", EMPTY_FLAGS)
def test_an_empty_flag_is_refused_not_taken_for_not_given(argv, prog, flag, fix, equals,
                                                          tmp_path, monkeypatch, capsys):
    """`--export_dir ""` exported into the default place, `--output ""` wrote to stdout,
    `bench --output_dir ""` wrote into the current directory, `--summary_json ""` wrote
    none, ...: an explicit empty value is one line, exit 2, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv + ([f"{flag}="] if equals else [flag, ""]))
    out, err = capsys.readouterr()
    assert exit_.value.code == 2
    assert err == (f"estimator-dist {prog}: error: argument {flag}: '' is empty; {fix}; see "
                   f"'estimator-dist {prog} --help'\n")
    assert out == "" and os.listdir(tmp_path) == []


def test_leaving_the_flags_out_keeps_their_defaults():
    parser = cli.build_parser()
    train = parser.parse_args(["train"])
    assert all(getattr(train, name) is None for name in cli.TRAIN_FLAGS)
    assert parser.parse_args(["export", "--model_dir", "m"]).export_dir is None
    assert parser.parse_args(["report", "--model_dir", "m"]).output_dir is None
    assert parser.parse_args(["predict", "--saved_model", "m", "--input", "x"]).output is None
    bench = parser.parse_args(["bench"])
    assert (bench.output_dir, bench.models, bench.cases) == ("runs/bench", None, None)
    tfjob, _ = parser.parse_known_args(["tfjob", "--image", "i"])
    assert (tfjob.pvc, tfjob.mount_path, tfjob.output) == (None, "/mnt/estimator-dist", None)
