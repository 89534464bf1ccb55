"""Training under a real Slurm (`make slurm`: slurmctld + slurmd + munge, one node standing in
for several): srun steps typed as docs/slurm.md gives them. Skipped with the reason when Slurm
is not up; under CI (CI=true, which runs `make slurm` first) a missing Slurm fails."""
import json
import os
import re
import subprocess
import time
import uuid

import pytest

from support import (TRAIN, Run, checkpoint_steps, run_cli, environment, final_export, latest_step,
                     short_timers_setting, slurm_up, srun_cli, wait_for)
from estimator_dist import timers
from estimator_dist.guards import signals
from test_elastic_launcher import USER_MODEL


# One Slurm job of this file at a time: the node's CPUs are the machine's 2 cores (a full
# run had the SIGUSR1 test's 3 tasks beside another test's job and miss the chief's deadline).
pytestmark = pytest.mark.xdist_group("test_slurm_jobs.py")


def step_env(timers_too="", **extra):
    """The short timers, and a task still running 5 s after the chief's end ends (not 30);
    `timers_too`: more NAME=SECONDS, which win."""
    setting = ",".join(filter(None, [short_timers_setting(), "step_end_grace_s=5", timers_too]))
    return environment(**{timers.ENV: setting}, **extra)


@pytest.fixture
def slurm_job():
    """A unique job name; whatever still runs under it is cancelled afterwards."""
    reason = slurm_up()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    name = f"edtest-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["scancel", "--name", name], capture_output=True, timeout=30)


def run_args(model_dir, steps=20, *extra):
    return ["train", *TRAIN, "--train_steps", steps, "--save_checkpoints_steps", steps // 2,
            "--model_dir", model_dir, *extra]


def test_srun_multi_worker_mirrored_as_typed(slurm_job, tmp_path):
    """`srun -n 2 estimator-dist train --strategy multi_worker_mirrored ...`: task 0 is the
    chief, both train the same steps, the step ends by itself with exit 0."""
    model_dir = tmp_path / "run"
    done = srun_cli(["-n", 2, "--job-name", slurm_job],
                    *run_args(model_dir, 20, "--strategy", "multi_worker_mirrored"),
                    cwd=tmp_path, env=environment(short_timers=True), timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "strategy multi_worker_mirrored on chief:0 of 2 worker(s), 0 ps" in done.stdout
    assert checkpoint_steps(model_dir)[-1] == 20
    assert final_export(model_dir), done.stdout


def test_srun_all_tasks_refuse_together(slurm_job, tmp_path):
    """A batch the step's replicas cannot split: every task says the same line, exit 2."""
    model_dir = tmp_path / "run"
    done = srun_cli(["-n", 3, "--job-name", slurm_job, "--label"],
                    *run_args(model_dir, 20, "--strategy", "multi_worker_mirrored",
                              "--batch_size", "32"),
                    cwd=tmp_path, env=environment(), timeout=180)
    lines = [line for line in done.stderr.splitlines() if "estimator-dist:" in line]
    assert done.returncode == 2, done.stdout + done.stderr
    assert sorted(line.split(":", 1)[0].strip() for line in lines) == ["0", "1", "2"], lines
    assert len({line.split(":", 1)[1] for line in lines}) == 1, lines
    assert "not divisible by the 3 replicas" in lines[0]
    assert not model_dir.exists()


def test_srun_parameter_server_step_ends_by_itself(slurm_job, tmp_path):
    """`srun -n 4 ... --strategy parameter_server --ps 1 --evaluator`: chief, worker, ps and
    evaluator all exit 0 by themselves (the ps served forever: the step never ended), one
    final export, the evaluator's."""
    model_dir = tmp_path / "run"
    done = srun_cli(["-n", 4, "--job-name", slurm_job, "--label"],
                    *run_args(model_dir, 20, "--strategy", "parameter_server", "--ps", "1",
                              "--evaluator"),
                    cwd=tmp_path, env=step_env(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "strategy parameter_server on chief:0 of 2 worker(s), 1 ps" in done.stdout
    # Asynchronous training: the other worker's update can land after the chief's last
    # step check, so the run may end one or two steps past 20.
    ended = re.search(r"^0: done: step (\d+)", done.stdout, re.M)
    assert ended and int(ended.group(1)) >= 20, done.stdout
    assert len(final_export(model_dir)) == 1, done.stdout
    assert checkpoint_steps(model_dir)[-1] >= 20


def test_scancel_signal_usr1_saves_and_the_ps_outlives_the_chiefs_save(slurm_job, tmp_path):
    """`scancel --signal=USR1` signals every task at once, the ps included: the chief saves a
    final checkpoint at the step it reached (SIGUSR1 killed every task at once, exit 138, and
    a ps gone first took the variables with it), the step exits 143 (retryable); the ps
    exits on the chief's end, not at its own limit."""
    model_dir = tmp_path / "run"
    # The chief's step in flight and its save get the default deadline after the signal (a
    # full run, the machine loaded by another job's tasks, missed the short 8 s).
    env = step_env(f"peer_deadline_s={signals.PEER_DEADLINE_S:g}")
    run = Run(run_args(model_dir, 100000, "--strategy", "parameter_server", "--ps", "1")[1:],
              command="train", cwd=tmp_path, env=env, stderr_apart=True,
              prefix=["srun", "-n", 3, "--job-name", slurm_job])
    try:
        wait_for(run, r"^step \d+/100000", seconds=240)
        subprocess.run(["scancel", "--signal=USR1", "--name", slurm_job], check=True, timeout=30)
        code = run.wait()
    finally:
        run.proc.kill()
    saved = [line for line in run.errors if "preempted: SIGUSR1 at step" in line]
    assert code == 143 and saved, "\n".join(run.lines + run.errors)
    step = int(re.search(r"SIGUSR1 at step (\d+): saved", saved[0]).group(1))
    assert step > 0 and latest_step(model_dir) == step, saved
    gave_up = [line for line in run.errors if "a signal stopped this ps task" in line]
    assert not gave_up, "\n".join(run.errors)


def _wait_for_text(path, pattern, seconds):
    """The first match of `pattern` in the file at `path` (a job's output), waiting for it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        found = re.search(pattern, text)
        if found:
            return found
        time.sleep(1)
    raise AssertionError(f"no {pattern!r} in {path} after {seconds} s:\n"
                         + (path.read_text() if path.exists() else "(no file)"))


def _start_when_requeued(job, seconds):
    """Slurm holds a requeued job about 120 s (pending, Reason=BeginTime): start it now, once
    it is pending on that hold, whatever it waits for first (its own end, another job's CPUs);
    return when it runs again, its state in the error if it does not."""
    deadline, shown = time.monotonic() + seconds, ""
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                               timeout=30).stdout
        state = re.search(r"JobState=(\S+) Reason=(\S+)", shown)
        restarts = re.search(r"Restarts=(\d+)", shown)
        if state and restarts and int(restarts.group(1)) >= 1 and state.group(1) != "PENDING":
            return
        if state and state.group(1) == "PENDING" and state.group(2) == "BeginTime":
            # Not in the requeue's own second: slurmd refused that start ("Killing
            # non-startable batch JobId=88: Job credential revoked", the job FAILED).
            time.sleep(2)
            subprocess.run(["scontrol", "update", f"jobid={job}", "starttime=now"],
                           capture_output=True, timeout=30)
        time.sleep(1)
    raise AssertionError(f"job {job} did not run again within {seconds} s:\n{shown}")


# Slurm's signal comes 150-180 s into the job (its checks run every ~30 s): a task took up to
# 100 s to start on the loaded 2-core machine, the requeued one must print its resume first.
@pytest.mark.timeout(900)
def test_sbatch_job_is_requeued_before_its_time_limit_and_resumes_at_the_saved_step(
        slurm_job, tmp_path):
    """`estimator-dist sbatch --time 5 --signal_before 150 ...` then `sbatch FILE`: Slurm's own
    pre-timeout SIGUSR1 makes the task save and exit 143, the script requeues the job, and the
    requeued run resumes at exactly the saved step: no step lost (at the limit itself Slurm
    ended the job TIMEOUT, not requeued, losing every step since the last checkpoint)."""
    script = tmp_path / "job.sbatch"
    # A user's model whose every step also sleeps 0.1 s while `slow` is in the job's working
    # directory, as a real step takes time: the job trains until Slurm's signal (minutes) on a
    # fraction of a core, not one of the two (without `slow`: 228 CPU-s in 163 s, measured).
    (tmp_path / "slow_mlp.py").write_text(USER_MODEL)
    (tmp_path / "slow").touch()
    made = run_cli("sbatch", "--workers", 1, "--job_name", slurm_job, "--time", 5,
                   "--signal_before", 150, "--output", script, "--import", "slow_mlp", "--model",
                   "slow_mlp", "--batch_size", 32, "--seed", 1, "--train_steps", 1000000,
                   "--save_checkpoints_steps", 500000, "--model_dir", "run", cwd=tmp_path,
                   env=step_env())
    assert made.returncode == 0, made.stderr
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], cwd=tmp_path,
                               env=step_env(), capture_output=True, text=True, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    out = tmp_path / f"slurm-{job}.out"
    saved = _wait_for_text(out, r"SIGUSR1 at step (\d+): saved", 300)
    _wait_for_text(out, r"exit code 143 \(retryable\): requeued", 60)
    _start_when_requeued(job, 300)
    resumed = _wait_for_text(out, r"resuming from the checkpoint at step (\d+)", 300)
    text = out.read_text()
    assert "restart 1 of at most 3" in text, text
    assert int(saved.group(1)) > 0 and resumed.group(1) == saved.group(1), text
