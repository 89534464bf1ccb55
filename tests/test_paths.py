"""Paths as given on the command line and in config files: `~` and `$VARS` that reached a
command unexpanded (quoted, or --flag=~/x, which bash leaves alone) are expanded and said on
stderr; an unset variable is refused naming it; a storage URL is refused before anything
starts, naming the fix.

`--model_dir '~/x'` and `'$HOME/x'` created directories literally named `~` and `$HOME`;
`--model_dir s3://bucket/x` failed after start-up ("File system scheme 's3' not implemented
... check the input's labels and features", exit 1) and tfjob wrote it into manifests."""
import os
import types

import pytest
import yaml

from estimator_dist import paths
from estimator_dist.cli import commands
from estimator_dist.cli.main import main
from estimator_dist.errors import UserError


@pytest.fixture
def home(tmp_path, monkeypatch):
    """HOME and RUNS point into tmp_path; the commands run in tmp_path/cwd."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("ESTIMATOR_DIST_NOPE", raising=False)
    (tmp_path / "home").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def test_expand_tilde_and_variables(home):
    assert paths.expand("--x", "~/a") == f"{home}/home/a"
    assert paths.expand("--x", "$RUNS/a") == paths.expand("--x", "${RUNS}/a") == f"{home}/runs/a"
    assert paths.expand("--x", "runs/a~b") == "runs/a~b"
    assert paths.expand("--x", "") == "" and paths.expand("--x", None) is None
    with pytest.raises(UserError, match=r"^--x \$ESTIMATOR_DIST_NOPE/a: the environment variable "
                                        r"ESTIMATOR_DIST_NOPE is not set; set it, or give the "
                                        r"path itself$"):
        paths.expand("--x", "$ESTIMATOR_DIST_NOPE/a")
    with pytest.raises(UserError, match=r"^--x ~nosuchuser8d1f/a: no user 'nosuchuser8d1f'"):
        paths.expand("--x", "~nosuchuser8d1f/a")


def test_train_expands_flags_and_config_file_paths_and_says_so(home, capsys):
    """--model_dir=~/run (bash leaves it) and a config file's '$RUNS/...' values."""
    (home / "cwd" / "run.yaml").write_text(
        "model: digits\ntrain: {summary_json: '$RUNS/summary.json', train_steps: 1, "
        "export: none, eval_steps: 1}\n")
    (home / "runs").mkdir()
    code = main(["train", "--config", "run.yaml", "--model_dir=~/run", "--batch_size", "8"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err.splitlines() == [
        f"estimator-dist: --model_dir ~/run is {home}/home/run (~ and $VARS expanded)",
        f"estimator-dist: config file run.yaml: --summary_json $RUNS/summary.json is "
        f"{home}/runs/summary.json (~ and $VARS expanded)"]
    assert f"model_dir {home}/home/run" in out.splitlines()[0]
    assert (home / "home" / "run" / "checkpoint").exists()
    assert (home / "runs" / "summary.json").exists()
    assert os.listdir(home / "cwd") == ["run.yaml"]  # no directory named '~' or '$RUNS'
    saved = yaml.safe_load((home / "home" / "run" / "config.yaml").read_text())
    assert saved["train"]["model_dir"] == f"{home}/home/run"


@pytest.mark.parametrize("argv, message", [
    (["train", "--model_dir", "$ESTIMATOR_DIST_NOPE/run"],
     "--model_dir $ESTIMATOR_DIST_NOPE/run: the environment variable ESTIMATOR_DIST_NOPE is not "
     "set; set it, or give the path itself"),
    (["train", "--model_dir", "s3://bucket/run"],
     "--model_dir s3://bucket/run: a storage URL (TensorFlow 2.15 has no s3:// file system); "
     "estimator-dist keeps a run's files and checks (its lock, config.yaml, checkpoint and "
     "disk-full guards) on file system paths only; mount the bucket (mountpoint-s3 or s3fs, or "
     "a Kubernetes volume) and give the mounted path"),
    (["evaluate", "--model_dir", "gs://bucket/run"],
     "--model_dir gs://bucket/run: a storage URL; estimator-dist keeps a run's files and checks "
     "(its lock, config.yaml, checkpoint and disk-full guards) on file system paths only; give "
     "/gcs/bucket/run (Vertex AI mounts buckets there with Cloud Storage FUSE), or mount the "
     "bucket elsewhere (gcsfuse (Cloud Storage FUSE), or a Kubernetes volume) and give that "
     "path"),
    (["tfjob", "--image", "img:1", "--workers", "2", "--model_dir", "s3://bucket/run"],
     "--model_dir s3://bucket/run: a storage URL (TensorFlow 2.15 has no s3:// file system)"),
    (["cluster", "--workers", "2", "--data_dir", "$ESTIMATOR_DIST_NOPE"],
     "--data_dir $ESTIMATOR_DIST_NOPE: the environment variable ESTIMATOR_DIST_NOPE is not set"),
    (["predict", "--saved_model", "~nosuchuser8d1f/m", "--input", "x.csv"],
     "--saved_model ~nosuchuser8d1f/m: no user 'nosuchuser8d1f' to expand ~nosuchuser8d1f for"),
])
def test_refused_before_anything_starts_in_one_line(argv, message, home, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.startswith(f"estimator-dist: error: {message}") and err.count("\n") == 1, err
    assert os.listdir(home / "cwd") == [] and os.listdir(home / "home") == []


def test_sagemakers_own_model_dir_is_refused_naming_sagemakers_fix(home, monkeypatch, capsys):
    """SageMaker's TensorFlow estimator appends `--model_dir s3://OUTPUT/JOB/model` to the
    entry point's arguments (the last --model_dir wins); a mount is no fix there, its
    estimator's model_dir=False and the synced /opt/ml/checkpoints are."""
    monkeypatch.setenv("SM_TRAINING_ENV", "{}")
    code = main(["train", "--model_dir", "/opt/ml/checkpoints/run",
                 "--model_dir", "s3://sagemaker-us-east-1-1/job-1/model"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.endswith(
        "on SageMaker create the TensorFlow estimator with model_dir=False and "
        "checkpoint_s3_uri=s3://..., and give --model_dir under /opt/ml/checkpoints "
        "(SageMaker syncs it to that URI and restores it on a restart)\n"), err
    assert os.listdir(home / "cwd") == []


def test_predict_says_expansions_on_stderr_and_keeps_stdout_csv(trained_digits, home, capsys,
                                                                 monkeypatch):
    import numpy as np

    model_dir, _ = trained_digits
    monkeypatch.setenv("MODEL", str(model_dir))
    np.save(home / "home" / "digits.npy", np.zeros((2, 8, 8, 1), np.float32))
    code = main(["predict", "--saved_model", "$MODEL", "--input=~/digits.npy"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err.splitlines() == [
        f"estimator-dist: --saved_model $MODEL is {model_dir} (~ and $VARS expanded)",
        f"estimator-dist: --input ~/digits.npy is {home}/home/digits.npy (~ and $VARS expanded)"]
    assert out.splitlines()[0].startswith("class_ids,probabilities_0") and len(out.splitlines()) == 3


def test_tfjob_leaves_the_pods_paths_as_given(home, capsys):
    """They are the pods' paths: their own train expands them."""
    code = main(["tfjob", "--image", "img:1", "--workers", "1", "--model_dir", "$HOME/run",
                 "--summary_json", "~/s.json", "--output", "~/job.yaml"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == f"estimator-dist: --output ~/job.yaml is {home}/home/job.yaml (~ and $VARS expanded)\n"
    job = yaml.safe_load((home / "home" / "job.yaml").read_text())
    command = job["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--model_dir") + 1] == "$HOME/run"
    assert command[command.index("--summary_json") + 1] == "~/s.json"


def test_cluster_expands_once_and_hands_its_tasks_the_result(home, capsys):
    """The launcher says each expansion once; its tasks get the expanded paths (flags that
    override the config file's), so none of them says it again."""
    (home / "cwd" / "run.yaml").write_text("model: digits\ntrain: {model_dir: '$RUNS/from-file'}\n")
    args = types.SimpleNamespace(command="cluster", launcher=None, ps=0, workers=2,
                                 train_args=["--config=run.yaml", "--summary_json", "~/s.json",
                                             "--batch_size", "8"])
    train_args, config = commands.train_flags(args)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"estimator-dist: config file run.yaml: --model_dir $RUNS/from-file is "
        f"{home}/runs/from-file (~ and $VARS expanded)",
        f"estimator-dist: --summary_json ~/s.json is {home}/home/s.json (~ and $VARS expanded)"]
    assert config.train.model_dir == f"{home}/runs/from-file"
    assert train_args == ["--batch_size", "8", "--strategy", "multi_worker_mirrored",
                          "--config", "run.yaml", "--model_dir", f"{home}/runs/from-file",
                          "--summary_json", f"{home}/home/s.json"]
    again, _ = commands.train_flags(types.SimpleNamespace(**{**vars(args),
                                                             "train_args": train_args}))
    assert capsys.readouterr().err == "" and again == train_args  # what each task sees
