"""Each local cluster task's GPUs and each TFJob pod's GPU limit (no GPU here: the GPU ids
are handed in)."""
import os
import re
import sys

import pytest
import yaml

import support
from conftest import REPO, run_cli
from estimator_dist.launch import supervisor as launcher
from estimator_dist.launch import cluster as cluster_launch
from estimator_dist.launch import task_gpus
from estimator_dist.errors import UserError

NAMES = ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]
EIGHT = [str(i) for i in range(8)]


def test_training_tasks_get_disjoint_shares_ps_and_evaluator_none():
    assert task_gpus.assign(NAMES, EIGHT, num_devices=0) == {
        "chief:0": "0,1", "worker:0": "2,3", "worker:1": "4,5", "ps:0": "", "evaluator:0": ""}
    assert task_gpus.assign(NAMES, EIGHT, num_devices=1, evaluator_gpus=1) == {
        "chief:0": "0", "worker:0": "1", "worker:1": "2", "ps:0": "", "evaluator:0": "3"}
    assert task_gpus.assign(NAMES, EIGHT, num_devices=0, evaluator_gpus=2) == {
        "chief:0": "0,1", "worker:0": "2,3", "worker:1": "4,5", "ps:0": "", "evaluator:0": "6,7"}
    assert task_gpus.assign(NAMES, [], num_devices=0) == {}  # no GPU: nothing to divide


@pytest.mark.parametrize("gpus,num_devices,evaluator_gpus,message", [
    (["0", "1"], 0, 0, "3 training task(s) x an even share of GPU(s) each need more than this "
                       "machine's 2 GPU(s) (0,1); ask for fewer workers or --num_devices"),
    (EIGHT, 3, 0, "3 training task(s) x 3 GPU(s) each need more than"),
    (EIGHT, 2, 3, "3 training task(s) x 2 GPU(s) each + 3 for the evaluator need more than"),
    ([], 0, 1, "--evaluator_gpus 1: this machine has no GPU; leave it out"),
])
def test_a_split_that_cannot_work_is_one_line(gpus, num_devices, evaluator_gpus, message):
    with pytest.raises(UserError, match=re.escape(message)):
        task_gpus.assign(NAMES, gpus, num_devices, evaluator_gpus)


def test_visible_gpus_come_from_the_environment_or_the_device_files(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidia10", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).write_text("")
    assert task_gpus.visible_gpus({}, str(tmp_path)) == ["0", "1", "10"]
    assert task_gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5"}, str(tmp_path)) == ["3", "5"]
    assert task_gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, str(tmp_path)) == []
    assert task_gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, str(tmp_path)) == []
    assert task_gpus.visible_gpus({}, str(tmp_path / "missing")) == []


def test_every_task_starts_with_its_own_cuda_visible_devices():
    tasks = cluster_launch.build_tasks(["--strategy", "multi_worker_mirrored", "--num_devices", "2"],
                                 workers=2, ps=0, evaluator=True, gpus=["4", "5", "6", "7"])
    assert {t.name: t.env for t in tasks} == {
        "chief:0": {"CUDA_VISIBLE_DEVICES": "4,5"}, "worker:0": {"CUDA_VISIBLE_DEVICES": "6,7"},
        "evaluator:0": {"CUDA_VISIBLE_DEVICES": ""}}
    cpu = cluster_launch.build_tasks(["--strategy", "multi_worker_mirrored"], workers=2, ps=0,
                               evaluator=False, gpus=[])
    assert all(t.env == {} for t in cpu)  # a CPU machine's tasks start as before


def test_cluster_refuses_an_impossible_split_before_starting_anything(tmp_path):
    """A real `cluster` launch with the launcher's GPUs given by CUDA_VISIBLE_DEVICES."""
    result = support.run_argv(
        [sys.executable, "-m", "estimator_dist", "cluster", "--workers", "3", "--batch_size",
         "63", "--model_dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().endswith(
        "3 training task(s) x an even share of GPU(s) each need more than this machine's 2 "
        "GPU(s) (0,1); ask for fewer workers or --num_devices")
    assert "started" not in result.stdout


def tfjob(tmp_path, *flags):
    out = tmp_path / "job.yaml"
    result = run_cli("tfjob", "--image", "registry.example/estimator-dist:1", "--pvc", "claim",
                     "--mount_path", str(tmp_path), "--model_dir", str(tmp_path / "run"),
                     "--output", str(out), *flags)
    return result, (yaml.safe_load(out.read_text()) if result.returncode == 0 else None)


def test_tfjob_pods_ask_for_their_gpus(tmp_path):
    result, job = tfjob(tmp_path, "--workers", "3", "--ps", "1", "--evaluator", "--gpus", "2",
                        "--evaluator_gpus", "1", "--strategy", "parameter_server",
                        "--batch_size", "96")
    assert result.returncode == 0, result.stderr
    command = job["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--num_devices", "2"]  # the pod computes on its 2 GPUs
    limits = {rtype: spec["template"]["spec"]["containers"][0].get("resources", {}).get(
        "limits", {}) for rtype, spec in job["spec"]["tfReplicaSpecs"].items()}
    assert limits == {"Chief": {"nvidia.com/gpu": 2}, "Worker": {"nvidia.com/gpu": 2},
                      "PS": {}, "Evaluator": {"nvidia.com/gpu": 1}}
    _, cpu_job = tfjob(tmp_path, "--workers", "2")
    assert all("resources" not in spec["template"]["spec"]["containers"][0]
               for spec in cpu_job["spec"]["tfReplicaSpecs"].values())


def test_tfjob_refuses_num_devices_that_disagree_with_gpus(tmp_path):
    result, _ = tfjob(tmp_path, "--workers", "2", "--gpus", "2", "--num_devices", "4")
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "--num_devices 4 with --gpus 2: each pod computes on the GPUs it asks for; give "
        "--num_devices 2 or leave it out (0: every GPU of the pod)")
