"""Cluster runs with real processes on 127.0.0.1: MWMS, parameter server, async PS,
a killed worker, TF_CONFIG errors, and a Kubeflow TFJob's replicas."""
import json
import os
import re
import signal
import sys
import time
import types

import pytest
import yaml

from estimator_dist import timers
from estimator_dist.launch import supervisor as launcher
from estimator_dist.launch import tfjob
from support import (REPO, TRAIN, Run, alive, checkpoint_steps, cli_argv, cli_in_process,
                     environment, final_export, run_cli, supervise, timers_setting, wait_for)


def test_multi_worker_mirrored_two_workers_and_evaluator(tmp_path, monkeypatch):
    """Also: each worker reads its own shard (the shard_probe input records it; a cluster of
    its own cost another two TensorFlow starts)."""
    model_dir = str(tmp_path / "run")
    probe = shard_probe_dir(tmp_path, monkeypatch)
    run = Run(["--workers", "2", "--evaluator", "--strategy", "multi_worker_mirrored",
               "--train_steps", "40", "--save_checkpoints_steps", "20", "--model_dir", model_dir,
               "--import", "shard_probe", "--input", "shard_probe",
               "--summary_json", str(tmp_path / "summary.json")] + TRAIN)
    assert run.wait() == 0, run.text
    assert probe_shards(probe) == ["0-of-2", "1-of-2"]
    assert checkpoint_steps(model_dir)[-1] == 40
    assert final_export(model_dir), run.text
    assert "[chief:0] step 40/40" in run.text and "[evaluator:0] done: step 40" in run.text
    assert run.pid_of("worker:0")
    assert not os.path.exists(os.path.join(model_dir, "tmp_worker_0"))  # the worker's copies
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["num_workers"] == 2 and summary["global_batch_size"] == 32
    assert summary["metrics"]["global_step"] == 40 and 0 <= summary["metrics"]["accuracy"] <= 1


def test_async_parameter_server_without_strategy(tmp_path):
    """No evaluator: the chief evaluates and exports the final checkpoint itself (it ended
    with `done: step N` and no metrics, and --summary_json had none)."""
    model_dir = str(tmp_path / "run")
    run = Run(["--workers", "2", "--ps", "1", "--strategy", "none", "--train_steps", "40",
               "--save_checkpoints_steps", "20", "--model_dir", model_dir,
               "--summary_json", str(tmp_path / "summary.json")] + TRAIN)
    assert run.wait() == 0, run.text
    assert checkpoint_steps(model_dir)[-1] >= 40
    assert final_export(model_dir), run.text
    assert "no evaluator task" in run.text
    done = next(line for line in run.lines if line.startswith("[chief:0] done: step "))
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["metrics"]["global_step"] == summary["global_step"]
    assert f"accuracy {summary['metrics']['accuracy']:.4f}" in done, run.text


@pytest.mark.parametrize("strategy,ps,expect", [
    ("parameter_server", "1", "restarting it"),
    ("multi_worker_mirrored", "0", "restarting the whole cluster"),
])
def test_killed_worker_is_restarted_and_run_finishes(strategy, ps, expect, tmp_path):
    """SIGKILL to a worker: restarted, the run ends as it would have. The killed process could
    not remove its temporary directory: the launcher does, and every task's is gone."""
    model_dir = str(tmp_path / "run")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # The killed worker's peers wait out the SIGTERM deadline (they cannot vote): 8 s, not 20.
    run = Run(["--workers", "2", "--ps", ps, "--evaluator", "--strategy", strategy,
               "--max_restarts", "2", "--train_steps", "200", "--save_checkpoints_steps", "40",
               "--model_dir", model_dir] + TRAIN, timeout=400,
              env=environment(TMPDIR=str(tmp), **{timers.ENV: timers_setting(peer_deadline_s=8)}))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and run.proc.poll() is None:
        if os.path.isdir(model_dir) and [s for s in checkpoint_steps(model_dir) if s > 0]:
            break
        time.sleep(0.5)
    pid = run.pid_of("worker:0")
    assert pid and alive(pid), run.text
    os.kill(pid, signal.SIGKILL)
    assert run.wait() == 0, run.text
    assert expect in run.text
    assert checkpoint_steps(model_dir)[-1] >= 200 and final_export(model_dir), run.text
    assert not os.listdir(tmp), os.listdir(tmp)


def test_bad_tf_config_is_one_line_exit_2(tmp_path):
    env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": {"ps": ["127.0.0.1:1"]},
                                                  "task": {"type": "ps", "index": 0}})}
    proc = run_cli("train", "--strategy", "multi_worker_mirrored", "--model_dir",
                   tmp_path / "r", env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("estimator-dist: error: TF_CONFIG cluster chief count 0: must be "
                                   "exactly 1 (a 'chief' or 'master' list with one address), or 0 "
                                   "beside 'worker' tasks (worker 0 is then the chief) "
                                   "(TF_CONFIG environment variable)")
    assert not (tmp_path / "r").exists()


def test_launcher_rejects_bad_shapes(capsys, monkeypatch):
    """In this process (a user's run of a refusal: test_a_refusal_as_a_user_runs_it)."""
    code, _, err = cli_in_process(["cluster", "--workers", "2", "--strategy", "parameter_server"],
                                  capsys, monkeypatch)
    assert code == 2
    assert err == ("estimator-dist: error: --strategy parameter_server needs ps tasks, but "
                   "--ps is 0; add --ps 1 (or more) or use --strategy multi_worker_mirrored\n")


@pytest.mark.parametrize("command, flags, message", [
    # Each task would refuse these at its start (the launcher printed one line per task).
    ("cluster", ["--workers", "3", "--batch_size", "64"],
     "--batch_size 64 is not divisible by the 3 replicas of --strategy multi_worker_mirrored; "
     "use a multiple of 3 (e.g. 66)"),
    ("cluster", ["--workers", "2", "--train_steps", "-5"], "--train_steps -5: must be > 0"),
    ("cluster", ["--workers", "2", "--model", "tabular", "--data_path", "/no/such.csv",
                 "--label_column", "y"], "data file not found: '/no/such.csv'; fix --data_path PATH"),
    # A TFJob's pods: --num_devices GPUs each (one device when auto).
    ("tfjob", ["--workers", "3", "--batch_size", "64"], "--batch_size 64 is not divisible by the 3"),
    ("tfjob", ["--workers", "2", "--num_devices", "3", "--batch_size", "64"],
     "--batch_size 64 is not divisible by the 6 replicas"),
    ("tfjob", ["--workers", "2", "--data_path", "/mnt/d.csv"],
     "--data_path '/mnt/d.csv': input 'digits' does not read it"),
    # Without an evaluator task nothing evaluates while a cluster trains.
    ("cluster", ["--workers", "2", "--early_stop", "loss", "--eval_every", "20"],
     "--early_stop loss: in a cluster only the evaluator task evaluates during training, and "
     "there is none; add --evaluator"),
    ("tfjob", ["--workers", "2", "--export", "best"], "--export best: in a cluster only the"),
    # Alone in its cluster it runs as one process, with no server: the launcher waited for
    # its port (exit 3).
    ("cluster", ["--workers", "1", "--strategy", "mirrored"],
     "--strategy mirrored runs in one process, and `cluster` starts TF_CONFIG tasks; run "
     "'estimator-dist train --strategy mirrored', or use multi_worker_mirrored, parameter_server "
     "(or none with --ps for async between-graph training)"),
    ("cluster", ["--workers", "2", "--startup_timeout", "nan"],
     "--startup_timeout nan: must be a number of seconds > 0"),
    ("cluster", ["--workers", "40", "--batch_size", "80"],
     "--workers 40 --ps 0: 40 tasks, each a TensorFlow process"),
    # A model_dir off the volume is pod-local: the checkpoints die with the pod.
    ("tfjob", ["--workers", "2", "--pvc", "claim"], "--model_dir "),
    # The claim's own fault first: it was reported as the --model_dir off the volume.
    ("tfjob", ["--workers", "2", "--pvc", "Bad_Claim"],
     "--pvc 'Bad_Claim': must be a PersistentVolumeClaim name"),
    ("tfjob", ["--workers", "2", "--mount_path", "/data"],
     "--mount_path /data: only --pvc is mounted there; add --pvc CLAIM or leave it out"),
    # Written, for Kubernetes to refuse.
    ("tfjob", ["--workers", "2", "--image", "my image"],
     "--image 'my image': not a container image reference"),
    ("tfjob", ["--workers", "2", "--image", "IMG:Latest@@"],
     "--image 'IMG:Latest@@': not a container image reference"),
    # The launcher read the first --strategy, the train flags the last: horovod replicas.
    ("tfjob", ["--workers", "2", "--strategy", "multi_worker_mirrored", "--strategy", "horovod"],
     "tfjob --strategy horovod: a TFJob runs TF_CONFIG tasks"),
    ("cluster", ["--workers", "2", "--strategy", "horovod", "--strategy", "multi_worker_mirrored",
                 "--batch_size", "63"], "--batch_size 63 is not divisible by the 2 replicas of "
                                        "--strategy multi_worker_mirrored"),
])
def test_cluster_and_tfjob_check_the_train_flags_before_launching_or_writing(
        command, flags, message, tmp_path, capsys, monkeypatch):
    """In this process (starting a task fails the test); a user's run of two of them, in
    test_a_refusal_as_a_user_runs_it."""
    out = tmp_path / "job.yaml"
    extra = ["--image", "img:1", "--output", str(out)] if command == "tfjob" else []
    code, stdout, stderr = cli_in_process([command, *extra, *flags, "--model_dir",
                                           tmp_path / "run"], capsys, monkeypatch)
    assert code == 2 and stdout == "", stdout  # no task was started
    assert stderr.startswith(f"estimator-dist: error: {message}"), stderr
    assert stderr.count("\n") == 1
    assert not out.exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["cluster", "tfjob"])
def test_a_refusal_as_a_user_runs_it(command, tmp_path):
    """The CLI in a process of its own: exit 2, one line, no TensorFlow noise, nothing started."""
    out = tmp_path / "job.yaml"
    extra = ["--image", "img:1", "--output", str(out)] if command == "tfjob" else []
    proc = run_cli(command, *extra, "--workers", "3", "--batch_size", "64", "--model_dir",
                   tmp_path / "run")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("estimator-dist: error: --batch_size 64 is not divisible by the "
                                  "3 replicas of --strategy multi_worker_mirrored; use a multiple "
                                  "of 3 (e.g. 66)"), proc.stderr
    assert proc.stderr.count("\n") == 1
    assert not out.exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("kwargs, message", [
    (dict(namespace="Bad NS"), "--namespace 'Bad NS': must be a DNS-1123 label"),
    (dict(pvc="Bad_Claim"), "--pvc 'Bad_Claim': must be a PersistentVolumeClaim name"),
    (dict(pvc="claim", mount_path="relative/dir"), "--mount_path 'relative/dir': must be an "
                                                   "absolute path"),
])
def test_tfjob_refuses_what_kubernetes_would(kwargs, message):
    from estimator_dist.errors import UserError

    with pytest.raises(UserError, match=f"^{re.escape(message)}"):
        tfjob.manifest("job", "img:1", ["--strategy", "multi_worker_mirrored"], 2, 0, False, **kwargs)
    job = tfjob.manifest("job", "img:1", ["--strategy", "multi_worker_mirrored"], 2, 0, False,
                         namespace="team-a", pvc="data.v1", mount_path="/mnt/data")
    assert job["metadata"]["namespace"] == "team-a"


def operator_tf_config(job, replica_type, index, hosts):
    """TF_CONFIG exactly as Kubeflow's TFJob operator writes it (kubeflow.org/v1)."""
    cluster = {rtype.lower(): hosts[rtype.lower()] for rtype in job["spec"]["tfReplicaSpecs"]}
    return json.dumps({"cluster": cluster, "task": {"type": replica_type.lower(), "index": index},
                       "environment": "cloud"})


def test_tfjob_manifest_replicas_run_with_operator_tf_config(tmp_path, warm_tasks):
    """Also the parameter_server cluster of two workers, a ps and an evaluator trained to its
    --train_steps (a test of its own ran the same cluster under `cluster`)."""
    model_dir = str(tmp_path / "run")
    out = tmp_path / "job.yaml"
    # The replicas share model_dir through the claim, mounted here at tmp_path.
    code = run_cli("tfjob", "--image", "registry.example/estimator-dist:1", "--name", "digits-ps",
                   "--pvc", "claim", "--mount_path", tmp_path, "--workers", "2", "--ps", "1",
                   "--evaluator", "--output", out, "--strategy", "parameter_server",
                   "--train_steps", "30", "--save_checkpoints_steps", "15", "--model_dir",
                   model_dir, *TRAIN, timeout=120)
    assert code.returncode == 0, code.stderr
    job = yaml.safe_load(out.read_text())
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "TFJob"
    specs = job["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 1, "PS": 1,
                                                            "Evaluator": 1}
    container = specs["Chief"]["template"]["spec"]["containers"][0]
    assert container["name"] == "tensorflow" and container["command"][:2] == ["estimator-dist", "train"]

    names = [f"{rtype.lower()}:{i}" for rtype, s in specs.items() for i in range(s["replicas"])]
    ports = launcher.free_ports(len(names))
    hosts = {}
    for name, port in zip(names, ports):
        hosts.setdefault(name.split(":")[0], []).append(f"127.0.0.1:{port}")
    tasks = []
    for name, port in zip(names, ports):
        rtype, index = name.split(":")
        rkey = next(k for k in specs if k.lower() == rtype)
        command = specs[rkey]["template"]["spec"]["containers"][0]["command"]
        argv = cli_argv(*command[1:])
        tasks.append(launcher.Task(name, argv, operator_tf_config(job, rkey, int(index), hosts), port))
    lines = []
    supervisor = launcher.Supervisor(tasks, whole_restart=False, max_restarts=0,
                                     startup_timeout=120, emit=lines.append)
    assert supervise(supervisor) == 0, "\n".join(lines)
    assert checkpoint_steps(model_dir)[-1] >= 30 and final_export(model_dir), "\n".join(lines)
    ps = next(task.process for task in tasks if task.name == "ps:0")
    assert not alive(ps.pid), "the ps task must be stopped by PID"


def tfjob_cli(tmp_path, *flags):
    """`estimator-dist tfjob` as a user runs it: (the finished process, the manifest or None)."""
    out = tmp_path / "job.yaml"
    proc = run_cli("tfjob", "--image", "registry.example/estimator-dist:1", "--output", out,
                   *flags, timeout=120)
    return proc, (yaml.safe_load(out.read_text()) if out.exists() else None)


def tfjob_here(tmp_path, capsys, monkeypatch, *flags):
    """`estimator-dist tfjob` in this process (cli_in_process): (the exit code, stdout and
    stderr as a finished process has them, the manifest or None)."""
    out = tmp_path / "job.yaml"
    argv = ["tfjob", "--image", "registry.example/estimator-dist:1", "--output", out, *flags]
    code, stdout, stderr = cli_in_process(argv, capsys, monkeypatch)
    done = types.SimpleNamespace(returncode=code, stdout=stdout, stderr=stderr)
    return done, (yaml.safe_load(out.read_text()) if out.exists() else None)


@pytest.mark.parametrize("name, message", [
    ("1st-run", "--name '1st-run': the TFJob operator takes only a DNS-1035 label: a lower-case "
                "letter first, then lower-case letters, digits or '-', no '-' at the end, at most "
                "63 characters; e.g. 'job-1st-run'"),
    ("run-", "--name 'run-': the TFJob operator takes only a DNS-1035 label"),
    ("My_Run", "--name 'My_Run': the TFJob operator takes only a DNS-1035 label"),
    ("r" * 64, f"--name '{'r' * 64}': the TFJob operator takes only a DNS-1035 label"),
    # Fits alone, but the operator's service digits-...-evaluator-0 would not.
    ("d" * 55, f"--name '{'d' * 55}': the operator names this job's services up to "
               f"'{'d' * 55}-evaluator-0' (67 characters), over the 63 of a DNS label; give a "
               f"name of at most 51 characters"),
])
def test_tfjob_refuses_a_name_the_operator_refuses(name, message, tmp_path, capsys,
                                                   monkeypatch):
    """The operator validates a TFJob's name as a DNS-1035 label: '1st-run' was written."""
    proc, job = tfjob_here(tmp_path, capsys, monkeypatch, "--name", name, "--evaluator",
                           "--pvc", "data", "--model_dir", "/mnt/estimator-dist/run")
    assert (proc.returncode, proc.stdout, job) == (2, "", None), proc.stderr
    assert proc.stderr.startswith(f"estimator-dist: error: {message}"), proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_one_replica_tfjob_runs_without_tf_config(tmp_path, capsys, monkeypatch):
    """The operator gives a job of one replica no TF_CONFIG: `--workers 1` wrote
    multi_worker_mirrored, whose pod exited 2. It now trains on the pod alone. (The manifest
    written in this process: its pod's command is the run that matters.)"""
    model_dir = str(tmp_path / "run")
    with monkeypatch.context() as here:  # the pod below is a process
        proc, job = tfjob_here(tmp_path, capsys, here, "--workers", "1", "--name", "one-pod",
                               "--train_steps", "10", "--model_dir", model_dir, *TRAIN)
    assert proc.returncode == 0, proc.stderr
    specs = job["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1}
    command = specs["Chief"]["template"]["spec"]["containers"][0]["command"]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}  # as the operator runs it
    pod = run_cli(*command[1:], env=env)
    assert pod.returncode == 0, pod.stderr
    assert checkpoint_steps(model_dir)[-1] == 10 and final_export(model_dir)


def test_a_one_replica_tfjob_refuses_a_cluster_strategy(tmp_path, capsys, monkeypatch):
    proc, job = tfjob_here(tmp_path, capsys, monkeypatch, "--workers", "1", "--strategy",
                           "multi_worker_mirrored")
    assert (proc.returncode, job) == (2, None)
    assert proc.stderr == ("estimator-dist: error: --strategy multi_worker_mirrored with --workers "
                           "1 and no --ps or --evaluator: the TFJob operator gives a job of one "
                           "replica no TF_CONFIG, so its pod would exit 2; use --strategy mirrored "
                           "(every GPU of the pod) or none, or leave --strategy out, or add "
                           "--workers 2 or --evaluator\n")


@pytest.mark.parametrize("flags", [[], ["--model_dir", "runs/mine"], ["--evaluator"]])
def test_a_multi_replica_tfjob_refuses_a_pod_local_model_dir(flags, tmp_path, capsys, monkeypatch):
    """Without --pvc the default runs/MODEL is private to each pod: the evaluator never saw a
    checkpoint."""
    proc, job = tfjob_here(tmp_path, capsys, monkeypatch, "--workers", "2", *flags)
    assert (proc.returncode, job) == (2, None)
    assert re.fullmatch(r"estimator-dist: error: --model_dir (runs/MODEL \(the default\)|runs/mine): "
                        r"each of this job's [23] replicas runs in a pod of its own, where that "
                        r"path is private \(the others never see its checkpoints\); add --pvc "
                        r"CLAIM and a --model_dir under --mount_path \(e\.g\. "
                        r"/mnt/estimator-dist/runs/my-run\)\n", proc.stderr), proc.stderr


@pytest.mark.parametrize("flags", [["--pvc", "data", "--model_dir", "/mnt/estimator-dist/run"],
                                   ["--pvc", "data", "--mount_path", "/data", "--model_dir",
                                    "/data/runs/run"]])
def test_a_multi_replica_tfjob_on_shared_storage_is_written(flags, tmp_path, capsys,
                                                           monkeypatch):
    proc, job = tfjob_here(tmp_path, capsys, monkeypatch, "--workers", "2", *flags)
    assert proc.returncode == 0, proc.stderr
    command = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--model_dir") + 1] == flags[flags.index("--model_dir") + 1]


def shard_probe_dir(tmp_path, monkeypatch):
    """The directory where `--import shard_probe --input shard_probe` tasks (started after
    this, in this environment) record the input shard each reads."""
    probe = tmp_path / "probe"
    probe.mkdir()
    monkeypatch.setenv("SHARD_PROBE_DIR", str(probe))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [os.path.join(REPO, "tests"), os.environ.get("PYTHONPATH")])))
    return probe


def probe_shards(probe):
    """The shards the training input_fns read, as `I-of-N`, sorted."""
    return sorted(name.split("-", 1)[1] for name in os.listdir(probe))


@pytest.mark.parametrize("strategy, ps", [("parameter_server", "1"),
                                          ("multi_worker_mirrored", "0")])
def test_early_stop_in_a_cluster_stops_every_task_and_exports(strategy, ps, tmp_path):
    """The chief decides on the evaluator's results; workers stop (under
    multi_worker_mirrored the decision is all-reduced: every worker stops at one step); the
    evaluator sees the end marker, evaluates the last checkpoint and runs the final export."""
    model_dir = str(tmp_path / "run")
    run = Run(["--workers", "2", "--ps", ps, "--evaluator", "--strategy", strategy,
               "--train_steps", "20000", "--eval_every", "20", "--early_stop", "loss",
               "--patience", "2", "--min_delta", "0.01", "--set", "learning_rate=0.0",
               "--weights_check_steps", "0",  # frozen on purpose: the plateau
               "--export", "final", "--max_restarts", "0", "--model_dir", model_dir] + TRAIN,
              timeout=400)
    assert run.wait() == 0, run.text
    assert "[chief:0] early stop at step" in run.text
    assert "ran out at step" not in run.text
    assert "[evaluator:0] training ended at step" in run.text
    assert checkpoint_steps(model_dir)[-1] < 20000 and final_export(model_dir), run.text
    if ps != "0":
        ps_pid = run.pid_of("ps:0")
        assert ps_pid and not alive(ps_pid), "the ps task must be stopped by PID"


def test_a_rerun_reports_only_its_own_export_and_a_checkpoint_is_exported_once(tmp_path):
    """Rerunning a finished cluster run to a higher step printed the chief's `exported:` line
    with the previous run's export; a restart after training ended (a ps task's death
    restarts every task) exported the final checkpoint a second time."""
    model_dir = str(tmp_path / "run")

    def cluster(steps):
        run = Run(["--workers", "1", "--ps", "1", "--evaluator", "--strategy",
                   "parameter_server", "--train_steps", str(steps), "--save_checkpoints_steps",
                   "10", "--max_restarts", "0", "--model_dir", model_dir] + TRAIN)
        assert run.wait() == 0, run.text
        return run

    cluster(10)
    (first,) = final_export(model_dir)
    restarted = cluster(10)  # every task again, training already at its end
    assert final_export(model_dir) == [first], restarted.text
    assert "exported:" not in restarted.text, restarted.text
    higher = cluster(20)
    exports = final_export(model_dir)
    assert len(exports) == 2 and first in exports, higher.text
    (newest,) = set(exports) - {first}
    printed = re.findall(r"^\[(\w+:0)\] exported: (\S+)$", higher.text, re.M)
    assert printed and all(path == os.path.dirname(newest) for _, path in printed), higher.text


def test_task_that_never_listens_hits_the_startup_deadline():
    silent = [sys.executable, "-c", "import time; time.sleep(120)"]
    tasks = [launcher.Task("chief:0", silent, "{}", launcher.free_ports(1)[0])]
    lines = []
    supervisor = launcher.Supervisor(tasks, whole_restart=False, max_restarts=3,
                                     startup_timeout=2, emit=lines.append)
    assert supervisor.run() == launcher.EXIT_CLUSTER_FAILED
    assert any("chief:0 did not start listening on 127.0.0.1:" in line and "within 2 s" in line
               for line in lines), lines
    # Stopped by the launcher (SIGTERM), not orphaned, and long before its 120 s sleep ended.
    assert tasks[0].process.returncode == -signal.SIGTERM


def preempt_and_resume(run, task, model_dir):
    """SIGTERM to `task` once it trains: (the step of the final checkpoint it saved, the line
    where the restarted task resumes from it)."""
    wait_for(run, rf"^\[{task}\] step \d+/")
    os.kill(run.pid_of(task), signal.SIGTERM)
    saved, _ = wait_for(run, rf"^\[{task}\] estimator-dist: preempted: SIGTERM at step (\d+): "
                             r"saved (\S+)/model\.ckpt-(\d+); exit code 143 \(retryable\)")
    step = int(saved.group(1))
    assert step > 0 and int(saved.group(3)) == step and saved.group(2) == str(model_dir)
    assert step in checkpoint_steps(model_dir)
    _, resumed = wait_for(run, rf"^\[{task}\] resuming from the checkpoint at step {step} in ")
    return step, resumed


def test_sigterm_to_the_chief_saves_a_final_checkpoint_and_the_cluster_resumes_from_it(tmp_path):
    """A preempted chief (parameter servers: it saves alone) finishes its step, saves, exits
    143; the launcher restarts the cluster, which resumes from that checkpoint. It used to
    die at once, losing every step since the last periodic checkpoint. (One training task:
    on this 2-core machine a second one starves the chief, whose step then outlasts the
    deadline.) Then SIGTERM to the launcher stops every task, exit 143."""
    model_dir = str(tmp_path / "run")
    run = Run(["--workers", "1", "--ps", "1", "--strategy", "parameter_server",
               "--train_steps", "1000000", "--save_checkpoints_steps", "1000000",
               "--max_restarts", "1", "--model_dir", model_dir] + TRAIN)
    try:
        step, resumed = preempt_and_resume(run, "chief:0", model_dir)
        assert "[launcher] chief:0 exited with code 143; restarting the whole cluster" in run.text
        wait_for(run, r"^\[chief:0\] step \d+/", start=resumed)
        pids = [run.pid_of(task) for task in ("chief:0", "ps:0")]  # the restarted ones
        assert all(pids) and all(alive(p) for p in pids), run.text
        run.proc.send_signal(signal.SIGTERM)  # Ctrl-C of the launcher: the new chief saves too
        assert run.wait() == 143, run.text
        # SIGTERM stops every task, the ps (which never exits by itself) by its PID: gone as
        # the launcher exits (it waits for each), not later by the SIGTERM of its death.
        assert not [p for p in pids if alive(p)], run.text
        again = re.findall(r"^\[chief:0\] estimator-dist: preempted: SIGTERM at step (\d+): saved",
                           run.text, re.M)
        assert len(again) == 2 and int(again[1]) > step, run.text
    finally:  # a failed step above must not leave the cluster running
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            run.proc.wait(60)
    assert checkpoint_steps(model_dir)[-1] == int(again[1])


def test_sigterm_to_one_mwms_worker_stops_every_worker_at_one_step_and_they_save_it(tmp_path):
    """Under multi_worker_mirrored a save needs every worker: the workers vote, all stop after
    the same step and save it together, exit 143, and the restarted cluster resumes there. A
    SIGTERM'd worker used to die at once, losing every step since the last periodic
    checkpoint. Then Ctrl-C of the launcher (SIGTERM to every task) does the same. These
    exits skip Python's exit handlers: each task left autograph's temporary files behind."""
    model_dir = str(tmp_path / "run")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run = Run(["--workers", "2", "--strategy", "multi_worker_mirrored",
               "--train_steps", "1000000", "--save_checkpoints_steps", "1000000",
               "--max_restarts", "1", "--model_dir", model_dir] + TRAIN,
              env=environment(TMPDIR=str(tmp)))
    try:
        wait_for(run, r"^\[chief:0\] step \d+/")
        os.kill(run.pid_of("worker:0"), signal.SIGTERM)
        worker, _ = wait_for(run, r"^\[worker:0\] estimator-dist: preempted: SIGTERM at step (\d+): "
                                  r"every worker stopped there \(1 got SIGTERM\); the chief saved "
                                  r"model\.ckpt-(\d+) in (\S+); exit code 143 \(retryable\)")
        step = int(worker.group(1))
        assert worker.group(2) == str(step) and worker.group(3) == model_dir
        chief, _ = wait_for(run, r"^\[chief:0\] estimator-dist: preempted: SIGTERM to another "
                                 r"worker at step (\d+): every worker stopped there \(1 got "
                                 r"SIGTERM\); saved (\S+); exit code 143")
        assert int(chief.group(1)) == step and chief.group(2) == f"{model_dir}/model.ckpt-{step}"
        assert step > 0 and step in checkpoint_steps(model_dir)
        _, resumed = wait_for(run, rf"^\[chief:0\] resuming from the checkpoint at step {step} in ")
        wait_for(run, r"^\[chief:0\] step \d+/", start=resumed)
        pids = [run.pid_of(task) for task in ("chief:0", "worker:0")]  # the restarted ones
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait() == 143, run.text
        assert not [p for p in pids if alive(p)], run.text  # waited for by the launcher
    finally:  # a failed step above must not leave the cluster running
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            run.proc.wait(60)
    again = {task: re.findall(rf"^\[{task}\] estimator-dist: preempted: SIGTERM.* at step (\d+): "
                              r"every worker stopped there \(\d got SIGTERM\)", run.text, re.M)
             for task in ("chief:0", "worker:0")}
    assert len(again["chief:0"]) == 2 and again["chief:0"] == again["worker:0"], run.text
    assert checkpoint_steps(model_dir)[-1] == int(again["chief:0"][1]) > step
    assert not os.listdir(tmp), os.listdir(tmp)  # every task's temporary files removed


def test_sigterm_during_the_chiefs_final_export_removes_it_and_the_restart_exports(tmp_path):
    """With no evaluator the chief exports after training, outside the training guard: SIGTERM
    there killed it at once, leaving a half-written export/final/temp-<timestamp>."""
    model_dir = tmp_path / "run"
    final = model_dir / "export" / "final"
    run = Run(["--workers", "1", "--strategy", "multi_worker_mirrored", "--train_steps", "20",
               "--max_restarts", "1", "--model_dir", str(model_dir)] + TRAIN)
    try:
        pid = int(wait_for(run, r"^\[launcher\] started chief:0 pid (\d+)")[0].group(1))
        deadline = time.monotonic() + 180
        while not (final.is_dir() and any(n.startswith("temp-") for n in os.listdir(final))):
            assert run.proc.poll() is None, "the export ended before it was seen:\n" + run.text
            assert time.monotonic() < deadline, run.text
            time.sleep(0.005)
        # Stopped, the chief cannot finish the export between seeing it and its SIGTERM (on a
        # loaded machine it did: no SIGTERM during the export).
        os.kill(pid, signal.SIGSTOP)
        try:
            assert [n for n in os.listdir(final) if n.startswith("temp-")], \
                "the export ended between seeing it and stopping the chief:\n" + run.text
            os.kill(pid, signal.SIGTERM)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert run.wait() == 0, run.text
    finally:  # a failed step above must not leave the cluster running
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            run.proc.wait(60)
    assert re.search(r"^\[chief:0\] estimator-dist: preempted: SIGTERM during the chief's final "
                     r"export: stopped it \(the partial export was removed\); training is done, "
                     r"the latest checkpoint is \S+/model\.ckpt-20; exit code 143", run.text,
                     re.M), run.text
    assert "[launcher] chief:0 exited with code 143; restarting" in run.text
    assert "[chief:0] no evaluator task: the chief exported the final checkpoint" in run.text
    names = os.listdir(final)
    assert len(names) == 1 and names[0].isdigit(), names
