"""Bad input through the real CLI: CSV, YAML, --set, export dirs; and the security rails.

Each is one line on stderr naming the file (and line and column where there is
one), exit code 2, and nothing written.
"""
import ast
import glob
import importlib.util
import inspect
import ipaddress
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import guard_models  # noqa: F401 - registers guard_mlp
from estimator_dist.cli import main as cli
from estimator_dist.launch import layout
from estimator_dist.launch import supervisor as launcher
from estimator_dist.launch import cluster as cluster_launch
from estimator_dist.guards import memory
from estimator_dist.errors import UserError
from estimator_dist.training.registry import INPUTS
from input_fns import batch_limit
from input_fns import cifar
from support import REPO

ROWS = "".join(f"{i},{i % 2},c{i % 3}\n" for i in range(10))  # row i is on line i + 2

BAD_CSVS = [
    # (name, csv text or None for a missing file, label column, fragments after the path)
    ("missing file", None, "y", ["not found"]),
    ("empty file", "", "y", ["is empty"]),
    ("ragged row", "a,y,c\n" + ROWS.replace("3,1,c0\n", "3,1,c0,7\n"), "y",
     ["line 5: 4 fields but the header has 3"]),
    ("text in a numeric column", "a,y,c\n" + ROWS.replace("7,1,c1", "seven,1,c1"), "y",
     ["line 9, column 'a': text 'seven' in a numeric column"]),
    ("missing number", "a,y,c\n" + ROWS.replace("2,0,c2", ",0,c2"), "y",
     ["line 4, column 'a': missing value"]),
    ("unknown label column", "a,y,c\n" + ROWS, "label", ["label column 'label' is not in", "columns: a, y, c"]),
]


def run_main(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *fragments):
    assert code == 2, err
    assert err.startswith("estimator-dist: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize("name,text,label,fragments", BAD_CSVS, ids=[c[0] for c in BAD_CSVS])
def test_bad_csv_names_file_line_and_column(name, text, label, fragments, tmp_path, capsys):
    path = tmp_path / "data.csv"
    if text is not None:
        path.write_text(text)
    model_dir = tmp_path / "run"
    code, _, err = run_main(["train", "--model", "tabular", "--data_path", str(path),
                             "--label_column", label, "--model_dir", str(model_dir)], capsys)
    assert_one_line_error(code, err, str(path), *fragments)
    assert not model_dir.exists()


TOO_BIG = 100_000_000
# (name, train flags, training examples of the input's data, batch per replica)
BIG_BATCH_RUNS = [
    ("digits", ["--model", "digits"], 1438, TOO_BIG),
    ("digits synthetic", ["--model", "digits", "--synthetic"], 410, TOO_BIG),
    ("digits mirrored", ["--model", "digits", "--strategy", "mirrored", "--num_devices", "2"],
     1438, TOO_BIG // 2),
    ("tabular", ["--model", "tabular"], 455, TOO_BIG),
    ("tabular synthetic", ["--model", "tabular", "--synthetic"], 320, TOO_BIG),
    ("cifar synthetic", ["--model", "cifar", "--synthetic"], cifar.SYNTHETIC_TRAIN_EXAMPLES, TOO_BIG),
    ("cifar files", ["--model", "cifar", "--data_dir", "CIFAR_DIR"], 5 * 20, TOO_BIG),
]


def write_cifar_records(directory, records=20):
    """The six CIFAR-10 binary files, `records` all-zero records (label 0) each."""
    directory.mkdir()
    for name in cifar.ALL_FILES:
        (directory / name).write_bytes(bytes(records * cifar.RECORD_BYTES))
    return str(directory)


@pytest.mark.parametrize("name,flags,examples,batch", BIG_BATCH_RUNS,
                         ids=[c[0] for c in BIG_BATCH_RUNS])
def test_a_training_batch_larger_than_the_data_is_refused_before_training(
        name, flags, examples, batch, tmp_path, capsys):
    """A repeated dataset batched past its length hung building the first batch."""
    flags = [write_cifar_records(tmp_path / "cifar") if f == "CIFAR_DIR" else f for f in flags]
    model_dir = tmp_path / "run"
    code, _, err = run_main(["train", *flags, "--batch_size", str(TOO_BIG),
                             "--model_dir", str(model_dir)], capsys)
    replicas = TOO_BIG // batch
    given = str(TOO_BIG) if replicas == 1 else f"{TOO_BIG} ({batch} per replica)"
    assert_one_line_error(code, err, f"--batch_size {given}: larger than the {examples:,} "
                                     f"training examples of input '{flags[1]}'; "
                                     f"use at most {examples * replicas}")
    assert not model_dir.exists()


def test_a_training_batch_of_all_the_data_is_accepted(tmp_path, capsys):
    """The limit itself trains (and its eval batch, larger than the eval split, is kept)."""
    flags = ["train", "--model", "digits", "--train_steps", "1", "--eval_steps", "1",
             "--export", "none"]
    code, _, err = run_main(flags + ["--batch_size", "1439", "--model_dir", str(tmp_path / "no")],
                            capsys)
    assert_one_line_error(code, err, "--batch_size 1439: larger than the 1,438 training "
                                     "examples of input 'digits'; use at most 1438")
    assert not (tmp_path / "no").exists()
    code, out, err = run_main(flags + ["--batch_size", "1438", "--model_dir", str(tmp_path / "run")],
                              capsys)
    assert code == 0, err
    assert "global batch 1438" in out and "done: step 1" in out


HUGE = 10 ** 12  # 28 TB of guard_xy examples (6 floats and an int32 label each)


@pytest.mark.parametrize("flags, batch", [
    ([], HUGE), (["--strategy", "mirrored", "--num_devices", "2"], HUGE // 2),
    pytest.param(["--strategy", "horovod"], HUGE, marks=pytest.mark.skipif(  # one rank
        importlib.util.find_spec("horovod") is None, reason="Horovod is not built (make horovod)"))])
def test_a_batch_that_cannot_fit_in_memory_is_refused_for_a_users_input(
        flags, batch, tmp_path, capsys):
    """guard_xy (a user's input: its size unknown, its dataset repeated) grew memory for
    minutes without a first step; `--batch_size 100000000` of 260-byte examples was
    killed after 45 s (measured)."""
    model_dir = tmp_path / "run"
    code, _, err = run_main(["train", "--model", "guard_mlp", "--batch_size", str(HUGE),
                             *flags, "--model_dir", str(model_dir)], capsys)
    given = str(HUGE) if batch == HUGE else f"{HUGE} ({batch} per replica)"
    assert_one_line_error(code, err, f"--batch_size {given}: one training batch of input "
                                     f"'guard_xy' needs ", "(28 bytes an example), more than ",
                          "; use at most ")
    assert not model_dir.exists()


def test_batch_memory_check_counts_each_example_and_skips_what_it_cannot_size():
    limit = (1000, "a 1000-byte limit")
    images = tf.data.Dataset.from_tensors(
        ({"x": tf.zeros([1, 4, 5]), "name": tf.constant(["a"])}, tf.zeros([1], tf.int64))
    ).repeat().unbatch().batch(10)  # [None, 4, 5] float32, [None] string, [None] int64
    memory.check_batch_fits(images, {"batch_size": 11}, "images", limit)  # 88 * 11 = 968
    with pytest.raises(UserError, match=r"^--batch_size 24 \(12 per replica\): one training "
                                        r"batch of input 'images' needs 1.0 KiB \(88 bytes an "
                                        r"example\), more than a 1000-byte limit, 1000 B; use "
                                        r"at most 22$"):
        memory.check_batch_fits(images, {"batch_size": 12, "global_batch_size": 24}, "images",
                                limit)
    fixed = tf.data.Dataset.from_tensors(tf.zeros([10, 100]))  # batched by 10, not by 12
    memory.check_batch_fits(fixed, {"batch_size": 12}, "fixed", limit)
    with pytest.raises(UserError, match="needs 3.9 KiB"):
        memory.check_batch_fits(fixed, {"batch_size": 10}, "fixed", limit)
    memory.check_batch_fits((tf.zeros([12, 100]), None), {"batch_size": 12}, "tensors", limit)


@pytest.mark.parametrize("examples,pipelines", [(10, 3), (1438, 3), (5, 8), (7, 1)])
def test_pipeline_share_counts_as_dataset_shard_does(examples, pipelines):
    for index in range(pipelines):
        context = tf.distribute.InputContext(pipelines, index, pipelines)
        shard = tf.data.Dataset.range(examples).shard(pipelines, index)
        assert batch_limit.pipeline_share(examples, context) == len(list(shard))


@pytest.mark.parametrize("input_name", ["digits", "tabular", "cifar"])
def test_the_limit_is_this_pipelines_share_of_the_training_data(input_name):
    """Sharded over 3 workers, pipeline 2 reads 1 in 3 training examples; its batch must fit."""
    entry = INPUTS.get(input_name)
    params = {"batch_size": 1, "synthetic": True, "seed": 1, "data_dir": None, "data_path": "",
              "label_column": "", "reader_nice": 0}
    params.update(entry.prepare(params))
    total = params.get("train_examples", cifar.SYNTHETIC_TRAIN_EXAMPLES)
    context = tf.distribute.InputContext(3, 2, 3)
    share = len(range(2, total, 3))
    too_big = dict(params, batch_size=share + 1, global_batch_size=3 * (share + 1))
    with pytest.raises(UserError) as error:
        entry.fn(tf.estimator.ModeKeys.TRAIN, too_big, context)
    assert str(error.value) == (
        f"--batch_size {3 * (share + 1)} ({share + 1} per replica): larger than the {share} "
        f"training examples of input '{input_name}' (this pipeline's share: 1 in 3 of "
        f"{total:,}); use at most {3 * share}")
    fits = dict(params, batch_size=share, global_batch_size=3 * share)
    assert isinstance(entry.fn(tf.estimator.ModeKeys.TRAIN, fits, context), tf.data.Dataset)
    # Evaluation keeps a last batch smaller than the batch size: any size is fine there.
    assert isinstance(entry.fn(tf.estimator.ModeKeys.EVAL, too_big, context), tf.data.Dataset)


def test_predict_csv_with_text_in_a_numeric_feature(tmp_path, capsys):
    model_dir = tmp_path / "run"
    assert cli.main(["train", "--model", "guard_mlp", "--model_dir", str(model_dir),
                     "--train_steps", "2", "--export", "final"]) == 0
    capsys.readouterr()
    bad = tmp_path / "x.csv"
    bad.write_text("x_0,x_1,x_2,x_3,x_4,x_5\n1,2,3,4,5,6\n1,2,three,4,5,6\n")
    code, out, err = run_main(["predict", "--saved_model", str(model_dir), "--input", str(bad)], capsys)
    assert_one_line_error(code, err, f"--input {bad} line 3 column 'x_2': 'three' is not a number")
    # nothing is unpickled from a user path: an object array is refused, not loaded
    pickled = tmp_path / "x.npy"
    np.save(pickled, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    code, _, err = run_main(["predict", "--saved_model", str(model_dir), "--input", str(pickled)], capsys)
    assert_one_line_error(code, err, f"--input {pickled}: not a readable .npy array")


def test_bad_yaml_and_wrong_types_exit_2(tmp_path, capsys):
    model_dir = tmp_path / "run"
    cases = [
        ("model: digits\ntrain:\n  batch_size: [1, 2\n", "line 4: not valid YAML"),
        ("train:\n  batch_size: '64'\n", "'batch_size' must be int, got '64' (str)"),
        ("hparams:\n  learning_rate: fast\n", "'learning_rate' must be float, got 'fast'"),
        ("- a list\n", "must hold a mapping"),
    ]
    for i, (text, fragment) in enumerate(cases):
        path = tmp_path / f"run{i}.yaml"
        path.write_text(text)
        code, _, err = run_main(["train", "--config", str(path), "--model_dir", str(model_dir)], capsys)
        assert_one_line_error(code, err, fragment)
    for bad, fragment in [("learning_rate=fast", "--set learning_rate=fast: 'learning_rate' takes a float"),
                          ("filters=1.5", "--set filters=1.5: 'filters' takes an int"),
                          ("learning_rate", "--set 'learning_rate' is not key=value")]:
        code, _, err = run_main(["train", "--set", bad, "--model_dir", str(model_dir)], capsys)
        assert_one_line_error(code, err, fragment)
    assert not model_dir.exists()


def test_export_into_a_non_empty_directory_is_refused(tmp_path, capsys):
    model_dir = tmp_path / "run"
    assert cli.main(["train", "--model", "guard_mlp", "--model_dir", str(model_dir),
                     "--train_steps", "2"]) == 0
    base = tmp_path / "exports"
    assert cli.main(["export", "--model_dir", str(model_dir), "--export_dir", str(base)]) == 0
    (first,) = os.listdir(base)
    saved = (base / first / "saved_model.pb").read_bytes()
    # an earlier export is no obstacle: a new <timestamp> dir, the old one untouched
    assert cli.main(["export", "--model_dir", str(model_dir), "--export_dir", str(base)]) == 0
    assert len(os.listdir(base)) == 2 and (base / first / "saved_model.pb").read_bytes() == saved
    capsys.readouterr()
    for target, holds in [(base / first, "saved_model.pb"), (tmp_path / "mixed", "notes.txt")]:
        if not target.exists():
            target.mkdir()
            (target / "notes.txt").write_text("mine")
        before = sorted(os.listdir(target))
        code, _, err = run_main(["export", "--model_dir", str(model_dir), "--export_dir", str(target)],
                                capsys)
        assert_one_line_error(code, err, f"--export_dir {target}: not empty (holds ", holds)
        assert sorted(os.listdir(target)) == before
    (tmp_path / "file").write_text("x")
    code, _, err = run_main(["export", "--model_dir", str(model_dir), "--export_dir",
                             str(tmp_path / "file")], capsys)
    assert_one_line_error(code, err, "exists and is not a directory")


def assert_loopback(tf_config):
    for addresses in json.loads(tf_config)["cluster"].values():
        for address in addresses:
            host, port = address.rsplit(":", 1)
            assert ipaddress.ip_address(host).is_loopback and int(port) > 0, address


def test_local_launcher_uses_loopback_addresses_only(capsys):
    names = layout.task_names(3, 2, True)
    for tf_config in layout.make_tf_configs(names, launcher.free_ports(len(names))).values():
        assert_loopback(tf_config)
    tasks = cluster_launch.build_tasks(["--strategy", "parameter_server"], 2, 1, True)
    assert len(tasks) == 4
    for task in tasks:
        assert_loopback(task.tf_config)
    # No way to ask for another host: no such parameter, and a --host flag is refused (exit 2).
    for fn in (cluster_launch.launch, cluster_launch.build_tasks, layout.make_tf_configs):
        assert not {"host", "hosts", "address", "bind"} & set(inspect.signature(fn).parameters)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["cluster", "--workers", "2", "--host", "10.1.2.3", "--train_steps", "1"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --host 10.1.2.3" in capsys.readouterr().err


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield ast.unparse(node.func), node


def test_nothing_unpickled_and_environment_never_logged():
    """Static: no pickle, no unsafe YAML, np.load only with allow_pickle=False, no env dumps."""
    sources = glob.glob(os.path.join(REPO, "estimator_dist", "*.py"))
    sources += glob.glob(os.path.join(REPO, "model_fns", "*.py"))
    sources += glob.glob(os.path.join(REPO, "input_fns", "*.py"))
    for path in sources:
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "cPickle", "dill", "joblib", "shelve"} & set(names), path
        for func, call in _calls(tree):
            keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
            if func.endswith("np.load") or func == "numpy.load":
                assert keywords.get("allow_pickle") == "False", f"{path}: {ast.unparse(call)}"
            assert func not in ("yaml.load", "yaml.unsafe_load", "pickle.load", "pickle.loads"), path
            if func in ("print", "say", "emit", "self.emit", "self.say", "out"):
                text = ast.unparse(call)
                assert "os.environ" not in text and "environ)" not in text, f"{path}: {text}"
