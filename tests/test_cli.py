"""CLI: parsing, `list`, and bad input -> one line, exit 2, nothing written."""
import os

import pytest

from conftest import run_cli
from estimator_dist.cli import main as cli


def run_main(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_train_flag_parses():
    args = cli.build_parser().parse_args(
        ["train", "--model", "digits", "--strategy", "mirrored", "--num_devices", "2",
         "--batch_size", "64", "--train_steps", "10", "--eval_steps", "2", "--eval_every", "5",
         "--model_dir", "d", "--data_dir", "x", "--synthetic", "--seed", "3",
         "--save_checkpoints_steps", "5", "--keep_checkpoint_max", "2", "--export", "best",
         "--summary_json", "s.json", "--set", "learning_rate=0.1", "--import", "m",
         "--config", "c.yaml", "--input", "digits", "--data_path", "p", "--label_column", "y",
         "--variable_device", "device0", "--accumulate_steps", "4"])
    assert (args.num_devices, args.synthetic, args.overrides, args.imports) == (2, True, ["learning_rate=0.1"], ["m"])
    assert (args.variable_device, args.accumulate_steps) == ("device0", 4)
    unset = cli.build_parser().parse_args(["train"])
    assert unset.batch_size is None and unset.synthetic is None  # flags only override when given


def test_list(capsys):
    code, out, _ = run_main(["list"], capsys)
    assert code == 0 and "digits" in out and "learning_rate=0.05" in out


BAD = [
    (["--model", "digitz"], "unknown model 'digitz'; registered: "),
    (["--input", "nope"], "unknown input 'nope'"),
    (["--strategy", "horovodd"], "--strategy horovodd: unknown; choose one of"),
    (["--strategy", "mirrored", "--num_devices", "99"], "--num_devices 99: this machine has no GPU"),
    (["--strategy", "mirrored", "--num_devices", "2", "--batch_size", "33"], "--batch_size 33 is not divisible"),
    (["--set", "learning_rat=0.1"], "the key 'learning_rat' does not exist in the hparams of model 'digits'"),
    (["--set", "filters=many"], "--set filters=many: 'filters' takes an int"),
    (["--import", "no_such_module_xyz"], "--import no_such_module_xyz: cannot import it"),
    (["--export", "sometimes"], "--export sometimes: must be one of"),
    (["--strategy", "tower", "--variable_device", "gpu0"], "--variable_device gpu0: must be auto, cpu or device0"),
    (["--accumulate_steps", "0"], "--accumulate_steps 0: must be >= 1 (1 = apply every batch)"),
    (["--strategy", "central_storage", "--num_devices", "2", "--accumulate_steps", "2"],
     "--accumulate_steps 2 does not work with --strategy central_storage; use one of"),
    # Refused while the graph is built (after config.yaml is written): nothing may be left.
    (["--set", "filters=-3"], "filters -3: must be a positive integer; fix it with --set filters=32"),
    (["--set", "dense_units=0"], "dense_units 0: must be a positive integer"),  # was SIGABRT
    (["--set", "dropout=1.5"], "dropout 1.5: must be a number in [0, 1); fix it with --set dropout=0.2"),
    (["--set", "learning_rate=-1"], "learning_rate -1.0: must be a number >= 0"),
    (["--set", "momentum=1.2"], "momentum 1.2: must be a number in [0, 1)"),
    (["--set", "optimizer=adamw"], "optimizer 'adamw' is not one of sgd, momentum, adam, rmsprop"),
    (["--summary_json", "/"], "--summary_json /: is a directory; give a file path"),
    (["--summary_json", "/no/such/dir/s.json"], "--summary_json /no/such/dir/s.json: its directory"),
    # Found only after training (it named the internal '.tmp' file).
    (["--summary_json", "/proc/s.json"], "--summary_json /proc/s.json: cannot create a file in /proc"),
    # Data flags the input does not read were silently ignored.
    # (the inputs named after "--input" are every registered one that reads it)
    (["--data_path", "x.csv"], "--data_path 'x.csv': input 'digits' does not read it (it reads "
                               "only --synthetic); drop it, or use --input "),
    (["--label_column", "y"], "--label_column 'y': input 'digits' does not read it"),
    (["--data_dir", "/data"], "--data_dir '/data': input 'digits' does not read it"),
    # --reader_nice was accepted, and ignored, by inputs that have no reader threads.
    (["--reader_nice", "5"], "--reader_nice 5: input 'digits' does not read it (it reads only "
                             "--synthetic); drop it, or use --input cifar"),
    (["--reader_nice", "0"], "--reader_nice 0: input 'digits' does not read it (it reads only "
                             "--synthetic); drop it, or use --input cifar"),
    (["--model", "tabular", "--reader_nice", "19"],
     "--reader_nice 19: input 'tabular' does not read it (it reads only --data_dir, --data_path, "
     "--label_column, --synthetic); drop it, or use --input cifar"),
    (["--reader_nice", "-1"], "--reader_nice -1: must be 0-19"),  # -1 would read as not given
]


@pytest.mark.parametrize("argv,message", BAD)
def test_bad_input_one_line_exit_2_nothing_written(argv, message, tmp_path, capsys):
    model_dir = tmp_path / "run"
    code, out, err = run_main(["train", "--model_dir", str(model_dir), "--train_steps", "5"] + argv, capsys)
    assert code == 2
    assert err.startswith("estimator-dist: error: " + message), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not model_dir.exists()


def test_unknown_config_key_in_file(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: digits\ntrain:\n  batch_sise: 8\n")
    code, _, err = run_main(["train", "--config", str(cfg), "--model_dir", str(tmp_path / "r")], capsys)
    assert code == 2 and "the key 'batch_sise' does not exist in config file section 'train'" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("text", ["data: {reader_nice: 0}\n", "data: {reader_nice: 7}\n"])
def test_reader_nice_in_a_config_file_is_refused_by_an_input_without_a_reader(text, tmp_path,
                                                                              capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    code, _, err = run_main(["train", "--config", str(cfg), "--model_dir", str(tmp_path / "r")],
                            capsys)
    nice = text.split(": ")[-1].rstrip("}\n")
    assert code == 2
    assert err == (f"estimator-dist: error: --reader_nice {nice}: input 'digits' does not read it "
                   f"(it reads only --synthetic); drop it, or use --input cifar\n")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv", [
    [],  # digits: no reader, --reader_nice not given
    ["--model", "tabular"],
    ["--model", "cifar", "--synthetic"],  # the default 19
    ["--model", "cifar", "--synthetic", "--reader_nice", "0"],  # what bench passes
    ["--model", "cifar", "--reader_nice", "19"],
])
def test_reader_nice_left_out_or_given_to_cifar_is_accepted(argv, tmp_path, capsys):
    """tfjob resolves and checks the whole train config (what every pod would refuse) without
    training: here it must pass."""
    code, out, err = run_main(["tfjob", "--image", "img", "--output", str(tmp_path / "job.yaml"),
                               "--pvc", "runs", "--model_dir", "/mnt/estimator-dist/r"] + argv,
                              capsys)
    assert (code, err) == (0, ""), err
    assert "wrote TFJob" in out


def test_a_config_file_keeps_empty_strings_for_unset_values(tmp_path, capsys):
    """Only the command line refuses an empty value: a run's config.yaml holds '' for what
    it left unset, and the config files written from it do too."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: digits\ndata: {input: '', data_dir: '', data_path: '', "
                   "label_column: '', reader_nice: -1}\ntrain: {summary_json: '', "
                   "warm_start_from: '', early_stop: '', model_dir: ''}\n")
    code, out, err = run_main(["tfjob", "--image", "img", "--workers", "1", "--config", str(cfg),
                               "--output", str(tmp_path / "job.yaml")], capsys)
    assert (code, err) == (0, ""), err


@pytest.mark.parametrize("command", ["evaluate", "export"])
def test_no_checkpoint_refused(command, tmp_path, capsys):
    code, _, err = run_main([command, "--model_dir", str(tmp_path)], capsys)
    assert code == 2 and "has no config.yaml" in err


def test_console_script_exit_code_and_no_traceback(tmp_path):
    """The real entry point, as a user runs it: a new interpreter (not warm.py's fork) in an
    environment without the tests' TF_CPP_MIN_LOG_LEVEL, so nothing TensorFlow prints while
    it is imported reaches the one line either."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = run_cli("train", "--model", "cifra", "--model_dir", str(tmp_path / "r"), timeout=120,
                   env=env, cold=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown model 'cifra'" in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("argv,message", [
    (["train", "--train_steps", "abc"], "estimator-dist train: error: argument --train_steps: "
                                        "invalid int value: 'abc'; see 'estimator-dist train --help'"),
    (["train", "--trian_steps", "5"], "estimator-dist train: error: unrecognized arguments: "
                                      "--trian_steps 5 (did you mean --train_steps for --trian_steps?)"),
    (["trian"], "estimator-dist: error: argument COMMAND: invalid choice: 'trian'"),
    (["predict", "--saved_model", "x"], "estimator-dist predict: error: the following arguments "
                                        "are required: --input"),
    # bench runs its own cases only: an --import would be ignored.
    (["bench", "--import", "my_models"], "estimator-dist bench: error: unrecognized arguments: "
                                         "--import my_models"),
])
def test_usage_errors_are_one_line_with_the_fix(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith(message) and err.count("\n") == 1, err


@pytest.mark.parametrize("source,message", [
    ("def f(:\n    pass\n", "importing it failed: SyntaxError: invalid syntax"),
    ("raise RuntimeError('boom at import')\n", "importing it failed: RuntimeError: boom at import"),
    ("import nonexistent_dep_xyz\n", "it imports 'nonexistent_dep_xyz', which is missing"),
])
def test_a_module_that_fails_to_import_is_one_line(source, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "user_mod_under_test.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_main(["list", "--import", "user_mod_under_test"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"estimator-dist: error: --import user_mod_under_test: {message}"), err


def test_a_model_fn_argument_estimator_cannot_give_is_refused_when_imported(
        tmp_path, monkeypatch, capsys):
    """Estimator refuses a model_fn argument it does not know (its ValueError traceback at the
    first graph build); a model_fn without params is accepted (tests/test_model_code.py)."""
    (tmp_path / "hparams_arg_mod.py").write_text(
        "import estimator_dist as ed\n\n"
        "@ed.register_model('hparams_arg_model')\n"
        "def hparams_arg_model(features, labels, mode, hparams):\n"
        "    raise AssertionError('never built')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_main(["train", "--import", "hparams_arg_mod", "--model",
                             "hparams_arg_model", "--model_dir", str(tmp_path / "r")], capsys)
    assert code == 2 and err == (
        "estimator-dist: error: --import hparams_arg_mod: model 'hparams_arg_model' has arguments "
        "(features, labels, mode, hparams); allowed: (features, labels, mode, params, config), "
        "required: (features); rename or drop hparams\n")
    assert not (tmp_path / "r").exists()


def test_a_model_graph_that_fails_to_build_is_one_line_and_leaves_no_model_dir(tmp_path, capsys):
    """The digits model_fn reads features['image']; the tabular input has no such feature."""
    csv = tmp_path / "t.csv"
    csv.write_text("a,b,y\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n")
    model_dir = tmp_path / "run"
    code, _, err = run_main(["train", "--model", "digits", "--input", "tabular", "--data_path",
                             str(csv), "--label_column", "y", "--model_dir", str(model_dir),
                             "--train_steps", "2", "--batch_size", "3"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    # Built first: the PREDICT graph the final export needs (a model broken in every mode).
    assert err.startswith("estimator-dist: error: model 'digits' could not build its infer graph: "
                          "KeyError: 'image'; check its hparams"), err
    assert not model_dir.exists()


def test_a_model_dir_that_is_a_file_is_refused(tmp_path, capsys):
    path = tmp_path / "afile"
    path.write_text("mine")
    for model_dir in (path, path / "sub"):
        code, _, err = run_main(["train", "--model_dir", str(model_dir), "--train_steps", "2"], capsys)
        assert code == 2 and err == (f"estimator-dist: error: --model_dir {model_dir}: {path} is a "
                                     f"file, not a directory; give a directory path (it is created "
                                     f"if missing)\n")
    assert path.read_text() == "mine"


@pytest.mark.parametrize("command", ["evaluate", "export", "report"])
def test_import_is_honoured_by_the_commands_that_read_a_model_dir(command, tmp_path, capsys):
    code, _, err = run_main([command, "--model_dir", str(tmp_path), "--import",
                             "no_such_module_xyz"], capsys)
    assert code == 2 and err.startswith("estimator-dist: error: --import no_such_module_xyz: "
                                        "cannot import it"), err


def test_a_user_error_raised_inside_a_tf_function_keeps_its_one_line():
    """A model_fn under a strategy runs in a tf.function: autograph would re-raise the error
    with an "in user code:" stack as its message (seen in a parameter_server cluster)."""
    import tensorflow as tf

    from estimator_dist.errors import UserError

    line = "dense_units 0: must be a positive integer; fix it with --set dense_units=128"

    @tf.function
    def build(x):
        raise UserError(line)

    with pytest.raises(UserError) as raised:
        build(tf.constant(1))
    assert str(raised.value) == line


@pytest.mark.parametrize("text, message", [
    ("model: 7\n", "config file: 'model: 7' must be a registered model's name"),
    ("imports: my_models\n", "config file: 'imports: 'my_models'' must be a list of module names"),
])
def test_config_file_values_of_the_wrong_type(text, message, tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    code, _, err = run_main(["train", "--config", str(cfg), "--model_dir", str(tmp_path / "r")], capsys)
    assert code == 2 and err.startswith(f"estimator-dist: error: {message}"), err
    assert not (tmp_path / "r").exists()


USER_MODULE = '''
import sys
import numpy as np
import tensorflow as tf
import estimator_dist as ed

SERVING = {"image": [[8, 8, 1], "float32"]}


def register(name, prepare):
    ed.register_input(name, prepare=prepare)(lambda mode, params: None)


register("prep_none", lambda params: None)
register("prep_raises", lambda params: 1 / 0)
register("prep_bad_dtype", lambda params: {"serving_features": {"image": [[8, 8, 1], "floaty"]}})
register("prep_not_json", lambda params: {"serving_features": SERVING, "x": object()})
register("prep_sets_batch", lambda params: {"serving_features": SERVING, "batch_size": 7})


@ed.register_input("labels_12", prepare=lambda params: {"serving_features": SERVING})
def labels_12(mode, params):
    x, y = np.zeros((64, 8, 8, 1), np.float32), np.full((64,), 12, np.int32)
    return tf.data.Dataset.from_tensor_slices(({"image": x}, y)).repeat().batch(params["batch_size"])


@ed.register_input("no_batches", prepare=lambda params: {"serving_features": SERVING})
def no_batches(mode, params):
    x, y = np.zeros((0, 8, 8, 1), np.float32), np.zeros((0,), np.int32)
    return tf.data.Dataset.from_tensor_slices(({"image": x}, y)).batch(params["batch_size"])


@ed.register_input("two_batches", prepare=lambda params: {"serving_features": SERVING})
def two_batches(mode, params):
    x = np.zeros((2 * params["batch_size"], 8, 8, 1), np.float32)
    y = np.zeros((len(x),), np.int32)
    return tf.data.Dataset.from_tensor_slices(({"image": x}, y)).batch(params["batch_size"])


@ed.register_input("raises_in_input", prepare=lambda params: {"serving_features": SERVING})
def raises_in_input(mode, params):
    raise RuntimeError("boom in input")


@ed.register_input("triples", prepare=lambda params: {"serving_features": SERVING})
def triples(mode, params):
    x, y = np.zeros((64, 8, 8, 1), np.float32), np.zeros((64,), np.int32)
    return tf.data.Dataset.from_tensor_slices(({"image": x}, y, y)).repeat().batch(8)


@ed.register_input("returns_list", prepare=lambda params: {"serving_features": SERVING})
def returns_list(mode, params):
    return [1, 2, 3]


@ed.register_input("eval_tensors", prepare=lambda params: {"serving_features": SERVING})
def eval_tensors(mode, params):
    x, y = np.zeros((8, 8, 8, 1), np.float32), np.zeros((8,), np.int32)
    if mode == tf.estimator.ModeKeys.TRAIN:
        return tf.data.Dataset.from_tensors(({"image": x}, y)).repeat()
    return {"image": tf.constant(x)}, tf.constant(y)


@ed.register_input("fraction_labels", prepare=lambda params: {"serving_features": SERVING})
def fraction_labels(mode, params):
    x, y = np.zeros((64, 8, 8, 1), np.float32), np.full((64,), 1.5, np.float32)
    return tf.data.Dataset.from_tensor_slices(({"image": x}, y)).repeat().batch(8)


@ed.register_model("eval_crash", default_input="digits")
def eval_crash(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(tf.compat.v1.layers.flatten(features["image"]), 10)
    if mode == tf.estimator.ModeKeys.EVAL:
        logits = tf.reshape(logits, [-1, 3])  # fails when it runs, not when it is built
    return ed.classification_spec(logits, labels, mode, params)


@ed.register_model("returns_none")
def returns_none(features, labels, mode, params):
    return None


@ed.register_model("raises_runtime")
def raises_runtime(features, labels, mode, params):
    raise RuntimeError("boom in model_fn")
'''


def import_users_module(tmp_path, monkeypatch):
    """USER_MODULE as `users_module`, importable with --import users_module."""
    (tmp_path / "users_module.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("flags, code, message", [
    (["--input", "prep_none"], 2, "input 'prep_none': its prepare() returned NoneType; it must "
                                  "return a dict with serving_features"),
    (["--input", "prep_raises"], 2, "input 'prep_raises': its prepare() failed: "
                                    "ZeroDivisionError: division by zero"),
    (["--input", "prep_bad_dtype"], 2, "input 'prep_bad_dtype': its prepare() returned "
                                       "serving_features['image'] = [[8, 8, 1], 'floaty']"),
    (["--input", "prep_not_json"], 2, "input 'prep_not_json': its prepare() returned data that "
                                      "is not plain JSON"),
    (["--input", "prep_sets_batch"], 2, "input 'prep_sets_batch': its prepare() returned "
                                        "batch_size, which the run already sets"),
    (["--model", "returns_none", "--input", "digits"], 2,
     "model 'returns_none' returned NoneType from its infer call; a model_fn must return a "
     "tf.estimator.EstimatorSpec"),
    (["--model", "raises_runtime", "--input", "digits"], 2,
     "model 'raises_runtime' could not build its infer graph: RuntimeError: boom in model_fn; "
     "check its hparams"),
    # --eval_steps 1: these inputs repeat in EVAL too, refused with the default 0 (item 6).
    (["--input", "labels_12", "--eval_steps", "1"], 1,
     "training failed at step 1: Received a label value of 12 which is outside the valid "
     "range of [0, 10)."),
    # Trained as class 1 without a word (the cast to int64 dropped the fraction).
    (["--input", "fraction_labels", "--eval_steps", "1"], 1,
     "training failed at step 1: assertion failed: [classification labels must be whole "
     "class ids, but some have a fraction]"),
    # Tracebacks from Estimator before (and for eval_tensors an evaluation that never ended).
    # The EVAL graph is built before the first step: the eval call is the first to fail.
    (["--input", "raises_in_input", "--eval_steps", "1"], 2,
     "input 'raises_in_input' failed in its eval call: RuntimeError: boom in input; fix its "
     "input_fn"),
    (["--input", "triples", "--eval_steps", "1"], 2,
     "input 'triples' returned a tf.data.Dataset of 3-item tuples from its eval call; an "
     "input_fn returns (features, labels) pairs"),
    (["--input", "returns_list", "--eval_steps", "1"], 2,
     "input 'returns_list' returned a list of 3 items from its eval call"),
    (["--input", "eval_tensors"], 2, "input 'eval_tensors' returned tensors, not a tf.data.Dataset, "
                                     "from its eval call: with --eval_steps 0 (the whole eval set) "
                                     "the evaluation would never end"),
    # "done: step 0", exit 0 before.
    (["--input", "no_batches"], 2, "input 'no_batches' gave no training batch: the run ended at "
                                   "step 0 of --train_steps 3; its input_fn must return a "
                                   "non-empty dataset"),
])
def test_what_a_users_module_gets_wrong_is_one_line(flags, code, message, tmp_path,
                                                     monkeypatch, capsys):
    """Each was a traceback (or, for prepare() returning batch_size, a silently changed
    batch); a run refused before training leaves no model_dir."""
    import_users_module(tmp_path, monkeypatch)
    model_dir = tmp_path / "run"
    got, _, err = run_main(["train", "--import", "users_module", "--train_steps", "3",
                            "--model_dir", str(model_dir)] + flags, capsys)
    assert got == code and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"estimator-dist: error: {message}"), err
    assert "no_batches" in flags or "eval_tensors" in flags or code == 1 or \
        not model_dir.exists()


def test_an_input_that_runs_out_before_train_steps_is_said(tmp_path, monkeypatch, capsys):
    """Estimator ends training at its input's end: "done: step 2" was all it said."""
    import_users_module(tmp_path, monkeypatch)
    code, out, err = run_main(["train", "--import", "users_module", "--input", "two_batches",
                               "--train_steps", "5", "--export", "none",
                               "--model_dir", str(tmp_path / "run")], capsys)
    assert code == 0, err
    assert "input 'two_batches' ran out at step 2 of --train_steps 5, which ends training as " \
           "Estimator does; repeat() its dataset to train all 5 steps\ndone: step 2" in out, out
    code, out, err = run_main(["train", "--import", "users_module", "--input", "two_batches",
                               "--train_steps", "2", "--export", "none",
                               "--model_dir", str(tmp_path / "run2")], capsys)
    assert code == 0 and "ran out" not in out and "done: step 2" in out, out + err


def test_evaluate_that_fails_when_it_runs_is_one_line(tmp_path, monkeypatch, capsys):
    """`evaluate` printed two chained TensorFlow tracebacks."""
    import_users_module(tmp_path, monkeypatch)
    model_dir = str(tmp_path / "run")
    code, _, err = run_main(["train", "--import", "users_module", "--model", "eval_crash",
                             "--train_steps", "2", "--model_dir", model_dir], capsys)
    assert code == 1 and "Input to reshape is a tensor with" in err, err
    code, _, err = run_main(["evaluate", "--model_dir", model_dir], capsys)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"estimator-dist: error: evaluating {model_dir}/model.ckpt-2 failed: "
                          f"Input to reshape is a tensor with "), err


def test_tfjob_output_that_is_a_directory_names_it(tmp_path, capsys):
    """It named the internal 'DIR.tmp' file."""
    code, out, err = run_main(["tfjob", "--image", "img:1", "--workers", "2", "--strategy",
                               "multi_worker_mirrored", "--model_dir", "/mnt/estimator-dist/x",
                               "--output", str(tmp_path)], capsys)
    assert code == 2 and err == (f"estimator-dist: error: --output {tmp_path}: is a directory; "
                                 f"give a file path such as {tmp_path / 'tfjob.yaml'}\n"), err
    assert os.listdir(tmp_path) == []


def test_an_import_that_calls_sys_exit_is_one_line(tmp_path, monkeypatch, capsys):
    """It ended the command with exit 0 having run nothing."""
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_main(["list", "--import", "exits_on_import"], capsys)
    assert code == 2 and err.startswith("estimator-dist: error: --import exits_on_import: "
                                        "importing it called sys.exit(0)"), err


def test_a_process_of_its_own_freezes_the_collector_when_its_command_returns(monkeypatch, capsys):
    """main() as the `estimator-dist` entry point calls it (argv None): the collector's pass at
    exit skips what TensorFlow made. A caller's main(argv) leaves its process's collector be."""
    import gc
    import tempfile

    from estimator_dist import process_temp

    # main() claims this process's temporary directory: undone after, for the tests that follow
    monkeypatch.setattr(process_temp, "_CLAIMED", None)
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    gc.unfreeze()
    try:
        assert cli.main(["list"]) == 0 and gc.get_freeze_count() == 0
        assert process_temp._CLAIMED is None
        monkeypatch.setattr("sys.argv", ["estimator-dist", "list"])
        assert cli.main() == 0 and gc.get_freeze_count() > 0
        assert process_temp._CLAIMED and tempfile.tempdir == process_temp._CLAIMED[1]
    finally:
        gc.unfreeze()
        process_temp.remove()
    capsys.readouterr()
