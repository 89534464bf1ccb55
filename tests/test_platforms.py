"""Training under the TF_CONFIG that Vertex AI, AI Platform and SageMaker write, with real
processes on 127.0.0.1. The formats, and where each comes from: platform_configs.py."""
import glob
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from estimator_dist.launch import supervisor as launcher
import platform_configs as platforms
from conftest import supervise
from support import checkpoint_steps, popen

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["--model", "digits", "--batch_size", "32", "--seed", "1"]


def start(args, tf_config, log, extra_env=None, module=("-m", "estimator_dist", "train")):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "CLUSTER_SPEC")}
    env.update({"TF_CONFIG": tf_config} if tf_config else {})
    env.update(extra_env or {})
    # cold: each host's command is a new interpreter, as the platform starts it (a warm
    # SageMaker worker once never ended after its master did; cause not found).
    return popen([sys.executable, *module, *args], cold=True, cwd=REPO, env=env, stdout=log,
                 stderr=subprocess.STDOUT)


class Tasks:
    """Processes started as a platform starts them (each host its own command), each writing
    to its own log; whatever is still running at the end is killed."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.procs = {}

    def start(self, name, args, tf_config, extra_env=None, module=("-m", "estimator_dist", "train")):
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 - closed by the process' end
        self.procs[name] = start(args, tf_config, log, extra_env, module)
        log.close()

    def wait(self, name, timeout=300):
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} timed out:\n{self.output(name)[-3000:]}") from None

    def output(self, name):
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def stop_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)


@pytest.fixture
def tasks(tmp_path):
    t = Tasks(tmp_path)
    yield t
    t.stop_all()


def final_exports(model_dir):
    return sorted(glob.glob(os.path.join(model_dir, "export", "final", "*", "saved_model.pb")))


def metrics_line(output):
    """The 'done:' line's metrics: {'accuracy': 0.41, 'loss': 1.9, ...}."""
    done = [line for line in output.splitlines() if line.startswith("done: step ")]
    assert done, output[-3000:]
    return {k: float(v) for k, v in re.findall(r"(\w+) (-?[\d.]+)", done[-1].split("  ", 1)[-1])}


@pytest.mark.parametrize("strategy, chief, devices", [
    ("mirrored", "chief", ["--num_devices", "2"]),
    ("central_storage", "master", ["--num_devices", "2"]),  # older jobs say master
    ("one_device", "chief", []),
])
def test_a_one_replica_vertex_job_runs_every_one_machine_strategy_locally(
        strategy, chief, devices, tmp_path):
    """Vertex AI and AI Platform set TF_CONFIG for a one-machine job too: mirrored exited 1
    with TensorFlow's AssertionError (_is_device_list_single_worker), central_storage with an
    AttributeError, one_device with "Cannot assign a device", each leaving config.yaml. It is
    now a local run: it trains, evaluates, exports, and never binds the TF_CONFIG address."""
    model_dir = tmp_path / "run"
    tf_config = platforms.vertex_tf_config({chief: [platforms.VERTEX_ONE_REPLICA]}, chief)
    log = open(tmp_path / "train.log", "wb")
    proc = start(["--strategy", strategy, *devices, "--train_steps", "20", "--model_dir",
                  str(model_dir), "--summary_json", str(tmp_path / "s.json"), *TRAIN], tf_config, log)
    log.close()
    code = proc.wait(300)
    output = (tmp_path / "train.log").read_text()
    assert code == 0, output[-3000:]
    assert checkpoint_steps(model_dir)[-1] == 20 and len(final_exports(str(model_dir))) == 1
    assert 0 <= metrics_line(output)["accuracy"] <= 1
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["role"] == "local" and summary["num_devices"] == (2 if devices else 1)


def test_a_vertex_chief_alone_beside_an_evaluator_pool_trains_and_the_evaluator_exports(
        tasks, tmp_path):
    """A chief (worker pool 0, --strategy mirrored over 2 devices) and an evaluator (pool 3):
    the chief's TF_CONFIG made MirroredStrategy assert. Vertex AI's CLUSTER_SPEC lists the
    evaluator pool: the chief trains alone (TensorFlow sees no cluster) and leaves evaluating
    and exporting to the evaluator: one final export."""
    model_dir = str(tmp_path / "run")
    chief, evaluator = (f"127.0.0.1:{p}" for p in launcher.free_ports(2))
    pools = {"workerpool0": [chief], "workerpool3": [evaluator]}
    args = ["--strategy", "mirrored", "--num_devices", "2", "--train_steps", "20",
            "--save_checkpoints_steps", "10", "--model_dir", model_dir, *TRAIN]
    for name, task_type, pool in (("chief", "chief", "workerpool0"),
                                  ("evaluator", "evaluator", "workerpool3")):
        tasks.start(name, args, platforms.vertex_tf_config({"chief": [chief]}, task_type),
                    {"CLUSTER_SPEC": platforms.vertex_cluster_spec(pools, pool)})
    assert tasks.wait("chief") == 0, tasks.output("chief")[-3000:]
    assert tasks.wait("evaluator") == 0, tasks.output("evaluator")[-3000:]
    assert checkpoint_steps(model_dir)[-1] == 20
    assert "the evaluator task evaluates and exports" in tasks.output("chief")
    assert len(final_exports(model_dir)) == 1, tasks.output("evaluator")[-3000:]
    assert 0 <= metrics_line(tasks.output("evaluator"))["accuracy"] <= 1


def test_an_ai_platform_evaluator_outside_the_cluster_makes_the_only_final_export(tmp_path):
    """AI Platform lists no evaluator in `cluster`: the chief printed "no evaluator task" and
    exported, the evaluator exported too, and `exported:` named the evaluator's. The job's
    TrainingInput (`job`) counts the evaluator: the chief leaves the export to it."""
    model_dir = str(tmp_path / "run")
    chief, worker = (f"127.0.0.1:{p}" for p in launcher.free_ports(2))
    cluster = {"chief": [chief], "worker": [worker]}
    job = platforms.ai_platform_job(workers=1, evaluators=1)
    argv = [sys.executable, "-m", "estimator_dist", "train", "--strategy",
            "multi_worker_mirrored", "--train_steps", "20", "--save_checkpoints_steps", "10",
            "--model_dir", model_dir, *TRAIN]
    configs = {"chief:0": ("chief", 0), "worker:0": ("worker", 0), "evaluator:0": ("evaluator", 0)}
    ports = {"chief:0": int(chief.rsplit(":", 1)[1]), "worker:0": int(worker.rsplit(":", 1)[1])}
    lines = []
    supervisor = launcher.Supervisor(
        [launcher.Task(name, argv, platforms.ai_platform_tf_config(cluster, *configs[name], job),
                       ports.get(name)) for name in configs],
        whole_restart=True, max_restarts=0, startup_timeout=120, emit=lines.append)
    assert supervise(supervisor) == 0, "\n".join(lines)
    text = "\n".join(lines)
    assert "no evaluator task" not in text, text
    assert len(final_exports(model_dir)) == 1, text
    exported = [line for line in lines if "exported: " in line]
    assert len(exported) == 1 and exported[0].startswith("[evaluator:0]"), text


def test_sagemaker_parameter_servers_started_outside_serve_the_master_and_worker(tasks, tmp_path):
    """SageMaker's toolkit starts each host's ps itself, from a cluster that names the chief
    `master`. Renamed `chief` for TensorFlow, the chief was unknown to those servers: it
    failed at step 1 (No worker known as /job:chief) and the worker exited 0 with no
    checkpoint. TensorFlow keeps `master` now (Estimator's own layout: the master evaluates
    and exports), and the run completes on the outside ps servers."""
    model_dir = str(tmp_path / "run")
    ports = launcher.free_ports(4)
    hosts = [(f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[2]}"),
             (f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[3]}")]
    cluster = platforms.sagemaker_ps_cluster(hosts)
    for i in range(len(hosts)):
        tasks.start(f"ps{i}", [json.dumps(cluster), str(i)], None,
                    module=(os.path.join(REPO, "tests", "platform_configs.py"),))
    args = ["--strategy", "none", "--train_steps", "30", "--save_checkpoints_steps", "15",
            "--model_dir", model_dir, *TRAIN]
    for i, name in enumerate(("master", "worker")):
        tasks.start(name, args, platforms.sagemaker_ps_tf_config(cluster, i))
    assert tasks.wait("master") == 0, tasks.output("master")[-3000:]
    assert tasks.wait("worker") == 0, tasks.output("worker")[-3000:]
    assert all(tasks.procs[f"ps{i}"].poll() is None for i in range(2))  # served throughout
    assert checkpoint_steps(model_dir)[-1] >= 30 and len(final_exports(model_dir)) == 1
    assert 0 <= metrics_line(tasks.output("master"))["accuracy"] <= 1


def test_sagemaker_multi_worker_mirrored_with_workers_only(tasks, tmp_path):
    """SageMaker's MultiWorkerMirrored (TensorFlow's MWMS tutorial) gives only `worker`
    tasks, worker 0 the chief: refused ("chief count 0"). Now worker 0 is the chief; with no
    evaluator task it evaluates the final checkpoint itself: metrics in its last line and in
    --summary_json."""
    model_dir = str(tmp_path / "run")
    workers = [f"127.0.0.1:{p}" for p in launcher.free_ports(2)]
    for i in range(2):
        tasks.start(f"worker{i}", ["--strategy", "multi_worker_mirrored", "--train_steps", "20",
                                   "--model_dir", model_dir, "--summary_json",
                                   str(tmp_path / f"s{i}.json"), *TRAIN],
                    platforms.sagemaker_mwms_tf_config(workers, i))
    for i in range(2):
        assert tasks.wait(f"worker{i}") == 0, tasks.output(f"worker{i}")[-3000:]
    assert checkpoint_steps(model_dir)[-1] == 20 and len(final_exports(model_dir)) == 1
    accuracy = metrics_line(tasks.output("worker0"))["accuracy"]
    summary = json.loads((tmp_path / "s0.json").read_text())
    assert summary["role"] == "chief" and summary["num_workers"] == 2
    assert summary["metrics"]["accuracy"] == pytest.approx(accuracy, abs=1e-4)
    assert not (tmp_path / "s1.json").exists()  # the other worker holds no result
