"""Every command that writes, on a file system with no byte free: exit 5, one line naming the
file, nothing half-written.

The file system is real: a tmpfs mounted in a private mount namespace (as the read-only
mount of test_guards_process.py), filled with one file to its last byte, holding a copy of
what the command reads. evaluate printed the events writer's traceback (exit 1) and left a
0-byte events file; train said "writing a file failed" naming no file; tfrecords and bench
printed tracebacks; report left the report/ folder it created.
"""
import os
import subprocess
import sys

import pytest

from estimator_dist.errors import EXIT_STORAGE
from support import REPO

TIMEOUT = 300


def on_a_full_disk(tmp_path, argv, copy=None, free="0"):
    """Run `estimator-dist ARGV` with tmp_path/full a tmpfs of 32 MB holding `copy` as run/
    and `free` bytes free (truncate's size syntax); returns (the process, what the file
    system holds afterwards: {relative path: size})."""
    full = tmp_path / "full"
    full.mkdir()
    script = (f"mount -t tmpfs -o size=32m tmpfs '{full}' || exit 99; "
              + (f"cp -a '{copy}' '{full}/run' || exit 98; " if copy else "")
              + f"dd if=/dev/zero of='{full}/filler' bs=64k 2>/dev/null; "
              + f"truncate -s -{free} '{full}/filler'; "
              + f"cd '{tmp_path}' && \"$@\"; code=$?; "
              + f"cd '{full}' && find . -mindepth 1 ! -name filler -printf '%P %s\\n' > "
              + f"'{tmp_path}/left.txt'; exit $code")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m",
                           "estimator_dist", *argv], env=dict(os.environ, PYTHONPATH=REPO),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode not in (98, 99), proc.stderr
    left = dict(line.rsplit(" ", 1) for line in (tmp_path / "left.txt").read_text().splitlines())
    return proc, {path: int(size) for path, size in left.items()}


def one_line(proc) -> str:
    assert proc.returncode == EXIT_STORAGE, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("estimator-dist: error: ")
    return proc.stderr.strip()


def files_of(directory) -> dict:
    return {os.path.relpath(os.path.join(root, n), directory):
            os.path.getsize(os.path.join(root, n))
            for root, _, names in os.walk(directory) for n in names}


def test_evaluate_on_a_full_disk_names_its_events_file_and_leaves_none(trained_digits,
                                                                       tmp_path):
    model_dir, _ = trained_digits
    proc, left = on_a_full_disk(tmp_path, ["evaluate", "--model_dir", "full/run"], model_dir)
    err = one_line(proc)
    assert err.startswith("estimator-dist: error: evaluating full/run/model.ckpt-60 (writing its "
                          "metrics) failed: the disk is full (No space left on device: "
                          "full/run/eval_cli/events.out.tfevents."), err
    assert err.endswith("the checkpoints are unchanged; no partial events file was left; free "
                        "space and rerun")
    for path, size in files_of(model_dir).items():  # the checkpoints and the rest unchanged
        assert left[f"run/{path}"] == size, path
    assert not [k for k in left if "eval_cli" in k]


@pytest.mark.parametrize("free, named", [
    ("0", "--model_dir full/new: creating its lock file failed: the disk is full (No space "
          "left on device: full/new/.estimator-dist.lock); nothing was written"),
    ("300k", "writing into full/new failed: the disk is full (No space left on device: "
             "full/new/graph.pbtxt.tmp"),
])
def test_train_on_a_full_disk_names_the_file_and_leaves_no_model_dir(free, named, tmp_path):
    proc, left = on_a_full_disk(tmp_path, ["train", "--model", "digits", "--model_dir",
                                           "full/new", "--train_steps", "5"], free=free)
    assert one_line(proc).startswith(f"estimator-dist: error: {named}"), proc.stderr
    assert left == {}  # no model_dir: no config.yaml, no cut-off events file, no lock


def test_tfrecords_on_a_full_disk_names_the_shard_and_leaves_nothing(tmp_path):
    from test_imagenet import write_image_folder

    photos = write_image_folder(str(tmp_path / "photos"))
    proc, left = on_a_full_disk(tmp_path, ["tfrecords", "--images", photos, "--output",
                                           "full/records"])
    assert one_line(proc).startswith(
        "estimator-dist: error: writing records into full/records failed: the disk is full "
        "(No space left on device: full/records/.tmp-train-00000-of-00004); the partial "
        "shards were removed, nothing was written; free space and rerun"), proc.stderr
    assert left == {}


def test_report_on_a_full_disk_leaves_no_report_folder(trained_digits, tmp_path):
    model_dir, _ = trained_digits
    proc, left = on_a_full_disk(tmp_path, ["report", "--model_dir", "full/run"], model_dir)
    assert one_line(proc).startswith(f"estimator-dist: error: writing {tmp_path}/full/run/report/"
                                     f"report.csv failed: the disk is full"), proc.stderr
    assert not [k for k in left if k.startswith("run/report")]


def test_bench_on_a_full_disk_names_the_file_and_leaves_nothing(tmp_path):
    proc, left = on_a_full_disk(tmp_path, ["bench", "--quick", "--cases", "project none N=1",
                                           "--output_dir", "full/bench"])
    assert one_line(proc).startswith(
        f"estimator-dist: error: writing {tmp_path}/full/bench/work/cifar10/data_batch_1.bin "
        f"failed: the disk is full"), proc.stderr
    assert left == {}
