"""An srun step as a cluster (distribute/slurm.py): host lists in Slurm's order, roles by
SLURM_PROCID, ports, and the refusals every task of a step gives alike. No Slurm needed,
except for the comparison with `scontrol show hostnames` (skipped without it)."""
import json
import shutil
import subprocess

import pytest

import support
from estimator_dist import timers
from estimator_dist.distribute import slurm
from estimator_dist.distribute import tf_config
from estimator_dist.errors import UserError

LISTS = ["node[9-10]", "node[01-03,7],gpu5", "a1,b[2-3],c", "n[008-011]", "node10,node9",
         "rack[1-2]-n[1-2]"]


def step_env(procid=0, ntasks=2, nodelist="vm", per_node=None, resv="23001-23003", **extra):
    env = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
           "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_STEP_NODELIST": nodelist,
           "SLURM_STEP_TASKS_PER_NODE": per_node or str(ntasks), **extra}
    if resv:
        env["SLURM_STEP_RESV_PORTS"] = resv
    return env


@pytest.mark.parametrize("nodelist, hosts", [
    ("node[9-10]", ["node9", "node10"]),
    ("node[01-03,7],gpu5", ["node01", "node02", "node03", "node7", "gpu5"]),
    ("node10,node9", ["node10", "node9"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
])
def test_hostnames_in_slurms_order(nodelist, hosts):
    """Numeric ranges in order, never sorted as strings (TensorFlow's resolver put node10
    before node9, while Slurm gives node9 rank 0)."""
    assert slurm.expand_hostnames(nodelist) == hosts


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm's scontrol is not installed "
                                                               "(make slurm installs it)")
@pytest.mark.parametrize("nodelist", LISTS)
def test_hostnames_equal_scontrols(nodelist):
    """The expansion is the one Slurm itself gives (scontrol needs no running daemon)."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, timeout=30, check=True).stdout.split()
    assert slurm.expand_hostnames(nodelist) == out


def test_tasks_per_node_and_reserved_ports():
    assert slurm.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.reserved_ports("23001-23003,23010") == [23001, 23002, 23003, 23010]


def test_roles_by_procid_chief_workers_ps_evaluator():
    """Four tasks on two nodes, --ps 1 --evaluator: chief and worker on node9, the ps and the
    evaluator on node10; each node's tasks take the reserved ports in turn."""
    configs = [json.loads(slurm.tf_config(step_env(i, 4, "node[9-10]", "2(x2)"), ps=1,
                                          evaluator=True)) for i in range(4)]
    assert [c["task"] for c in configs] == [
        {"type": "chief", "index": 0}, {"type": "worker", "index": 0},
        {"type": "ps", "index": 0}, {"type": "evaluator", "index": 0}]
    assert configs[0]["cluster"] == {"chief": ["node9:23001"], "worker": ["node9:23002"],
                                     "ps": ["node10:23001"], "evaluator": ["node10:23002"]}
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)


def test_ports_from_the_job_without_reserved_ports():
    """No MpiParams=ports: a block chosen by job and step id; another job or step of the
    same job gets another block."""
    def ports(job, step):
        env = step_env(0, 2, resv="", SLURM_JOB_ID=str(job), SLURM_STEP_ID=str(step))
        return json.loads(slurm.tf_config(env))["cluster"]

    assert ports(41, 0) == ports(41, 0)
    assert ports(41, 0) != ports(42, 0) != ports(41, 1)
    first = int(ports(41, 0)["chief"][0].rpartition(":")[2])
    assert slurm.PORT_LOW <= first < slurm.PORT_LOW + slurm.PORT_BLOCKS * slurm.PORT_BLOCK


def test_from_env_reads_the_step_for_a_cluster_strategy():
    spec = tf_config.from_env("multi_worker_mirrored", step_env(1, 2))
    assert (spec.task_type, spec.task_index, spec.num_workers) == ("worker", 0, 2)
    # a one-process strategy in a step: no cluster (srun -n 1 train ...)
    assert tf_config.from_env("none", step_env(0, 1)) is None
    # TF_CONFIG wins over the step
    given = json.dumps({"cluster": {"chief": ["h:1"], "worker": ["h:2"]},
                        "task": {"type": "chief", "index": 0}})
    assert tf_config.from_env("multi_worker_mirrored",
                              {**step_env(1, 2), "TF_CONFIG": given}).is_chief


@pytest.mark.parametrize("env, strategy, ps, evaluator, says", [
    (step_env(0, 1), "parameter_server", 1, False, "srun -n 1: is too few tasks"),
    (step_env(0, 2), "parameter_server", 0, False, "needs ps tasks"),
    (step_env(0, 3), "multi_worker_mirrored", 1, False, "takes no ps tasks"),
    ({}, "parameter_server", 1, False, "only in an srun step"),
    (step_env(0, 2), "mirrored", 1, False, "only in an srun step"),
    (step_env(0, 2, SLURM_DISTRIBUTION="cyclic"), "multi_worker_mirrored", 0, False,
     "--distribution"),
    (step_env(0, 4, per_node="2(x2)", nodelist="n[1-2]", resv="23001"),
     "multi_worker_mirrored", 0, False, "fewer ports"),
])
def test_refusals_name_the_fix(env, strategy, ps, evaluator, says):
    """One line naming the value and the fix; every task of the step gives the same one."""
    lines = set()
    for procid in range(int(env.get("SLURM_STEP_NUM_TASKS", "1"))):
        with pytest.raises(UserError) as refused:
            tf_config.from_env(strategy, {**env, "SLURM_PROCID": str(procid)} if env else env,
                               ps=ps, evaluator=evaluator)
        lines.add(str(refused.value))
    assert len(lines) == 1
    line, = lines
    assert says in line and "\n" not in line


def test_parameter_server_worker_without_its_ps_exits_144(tmp_path):
    """A parameter_server worker whose ps tasks are gone (under Slurm nobody stops it) waited
    forever for its session, silently; now it exits 144 (retryable) at its session deadline,
    with one line."""
    ports = support.free_ports(3)
    try:
        cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"],
                   "ps": [f"127.0.0.1:{ports[2]}"]}
        env = support.environment(
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
        env[timers.ENV] = "session_deadline_s=8"
        done = support.run_cli("train", *support.TRAIN, "--strategy", "parameter_server",
                               "--train_steps", "10", "--model_dir", tmp_path / "run",
                               env=env, timeout=180)
    finally:
        support.release_ports(ports)
    assert done.returncode == 144, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("estimator-dist:")]
    assert len(lines) == 1 and "session was not ready after 8 s" in lines[0], done.stderr


def test_a_one_process_strategy_in_a_multi_task_step_is_refused():
    """`srun -n 2 train --strategy mirrored` trained two separate runs into one model_dir."""
    with pytest.raises(UserError, match=r"srun -n 2: runs --strategy mirrored as 2 separate"):
        slurm.check_one_process_step("mirrored", step_env(1, 2))
    slurm.check_one_process_step("mirrored", step_env(0, 1))  # one task: a local run
    slurm.check_one_process_step("multi_worker_mirrored", step_env(0, 2))
    slurm.check_one_process_step("horovod", {**step_env(0, 2), "HOROVOD_RANK": "0"})


def test_sbatch_writes_a_script_that_requeues_on_the_retryable_codes_only(tmp_path):
    """`estimator-dist sbatch` as a user types it: the script asks for the pre-timeout signal,
    runs srun without --kill-on-bad-exit's 137, passes the train flags with the step's roles,
    and requeues on 143/144 up to --max_restarts."""
    script = tmp_path / "job.sbatch"
    done = support.run_cli("sbatch", "--workers", 2, "--ps", 1, "--evaluator", "--time",
                           "2:00:00", "--signal_before", 300, "--max_restarts", 5, "--output",
                           script, *support.TRAIN, "--model_dir", "/shared/run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"submit it with: sbatch {script}" in done.stdout
    text = script.read_text()
    for line in ("#SBATCH --ntasks=4", "#SBATCH --requeue", "#SBATCH --time=2:00:00",
                 "#SBATCH --signal=B:USR1@300", "  143|144)", 'scontrol requeue "$SLURM_JOB_ID"',
                 'if [ "$restarts" -lt 5 ]', "srun --kill-on-bad-exit=0 "):
        assert line in text, line
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert srun.endswith("--strategy parameter_server --ps 1 --evaluator &"), srun
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


@pytest.mark.parametrize("flags, says", [
    (["--time", "2h"], "--time '2h': must be a Slurm time limit"),
    (["--workers", "3", "--batch_size", "32"], "not divisible by the 3 replicas"),
])
def test_sbatch_refuses_bad_flags_before_writing(flags, says, tmp_path):
    script = tmp_path / "job.sbatch"
    done = support.run_cli("sbatch", "--output", script, "--time", "10", *support.TRAIN[:2],
                           *flags, cwd=tmp_path)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not script.exists()
