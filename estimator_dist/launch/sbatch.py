"""`sbatch`: a Slurm batch script whose one srun step runs the train command on every task
(docs/slurm.md); the counterpart of `tfjob` for Slurm. Imports no TensorFlow.

The step's tasks take their roles from Slurm (distribute/slurm.py): --workers training tasks
(the chief first), then --ps parameter servers and, with --evaluator, the evaluator. What
Slurm would not do by itself, the script does:
- requeue on the retryable exit codes only (143: preempted, a final checkpoint saved; 144: a
  lost peer): Slurm ends such a job FAILED, not requeued, even with --requeue, unless the
  admin's slurm.conf says `RequeueExit=143,144`. The script calls `scontrol requeue` itself,
  at most --max_restarts times (SLURM_RESTART_COUNT counts them); any other code ends the job;
- with --time, asks Slurm for SIGUSR1 --signal_before seconds before the limit
  (`--signal=B:USR1@S`, to the batch shell) and passes it to the step's tasks (`scancel
  --signal=USR1`), which save and exit 143: the requeued job resumes at that step. At the
  limit itself Slurm ends the job TIMEOUT, not requeued, and every step since the last
  checkpoint was lost;
- runs srun with --kill-on-bad-exit=0: with 1, a task killed by SIGKILL made srun return 137
  and kill the others, whose own exit codes (143, 144) never reached the script.
"""
import re
import shlex
import sys
from typing import List

from estimator_dist.errors import EXIT_PEER_LOST, EXIT_PREEMPTED, UserError

RETRYABLE = (EXIT_PREEMPTED, EXIT_PEER_LOST)
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
TIME_RE = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
MAX_SIGNAL_BEFORE = 65535  # Slurm's limit for --signal's @time


def check_job_flags(name: str, time_limit: str, signal_before: int, max_restarts: int,
                    partition: str):
    if not NAME_RE.fullmatch(name):
        raise UserError(f"--job_name {name!r}: must be letters, digits, '_', '.' or '-', a "
                        f"letter or digit first")
    if time_limit and not TIME_RE.fullmatch(time_limit):
        raise UserError(f"--time {time_limit!r}: must be a Slurm time limit: minutes (60), "
                        f"H:M:S (2:00:00) or D-H:M:S (1-12:00:00)")
    if not 0 < signal_before <= MAX_SIGNAL_BEFORE:
        raise UserError(f"--signal_before {signal_before}: must be 1-{MAX_SIGNAL_BEFORE} "
                        f"seconds (Slurm's limit)")
    if max_restarts < 0:
        raise UserError(f"--max_restarts {max_restarts}: must be >= 0")
    if partition and not NAME_RE.fullmatch(partition):
        raise UserError(f"--partition {partition!r}: must be a Slurm partition name")


def script(train_args: List[str], workers: int, ps: int, evaluator: bool, name: str,
           time_limit: str = "", signal_before: int = 120, max_restarts: int = 3,
           partition: str = "", python: str = sys.executable) -> str:
    """The batch script's text (bash)."""
    tasks = workers + ps + int(evaluator)
    role_flags = (["--ps", str(ps)] if ps else []) + (["--evaluator"] if evaluator else [])
    train = " ".join(shlex.quote(a) for a in
                     [python, "-m", "estimator_dist", "train", *train_args, *role_flags])
    retryable = "|".join(str(c) for c in RETRYABLE)
    head = ["#!/bin/bash",
            f"# Written by estimator-dist sbatch; submit it with `sbatch FILE` (docs/slurm.md).",
            f"# {workers} training task(s) (task 0 the chief), {ps} ps"
            f"{', 1 evaluator' if evaluator else ''}: the tasks take their roles from Slurm.",
            f"#SBATCH --job-name={name}",
            f"#SBATCH --ntasks={tasks}",
            "#SBATCH --requeue",
            "#SBATCH --open-mode=append"]
    if partition:
        head.append(f"#SBATCH --partition={partition}")
    if time_limit:
        head += [f"#SBATCH --time={time_limit}",
                 f"#SBATCH --signal=B:USR1@{signal_before}"]
    body = f"""
restarts=${{SLURM_RESTART_COUNT:-0}}
echo "estimator-dist sbatch: job $SLURM_JOB_ID, restart $restarts of at most {max_restarts}"
# Slurm's pre-timeout SIGUSR1 comes to this shell: every task gets it, saves and exits 143.
trap 'echo "estimator-dist sbatch: SIGUSR1 before the time limit: the tasks save"; \\
  scancel --signal=USR1 "$SLURM_JOB_ID"' USR1
# --kill-on-bad-exit=0: the tasks end by themselves; with 1 srun reported 137, hiding them.
srun --kill-on-bad-exit=0 {train} &
step=$!
code=0
wait "$step" || code=$?
while kill -0 "$step" 2>/dev/null; do  # a trapped signal ended the wait, not the step
  code=0
  wait "$step" || code=$?
done
case "$code" in
  {retryable})
    if [ "$restarts" -lt {max_restarts} ]; then
      echo "estimator-dist sbatch: exit code $code (retryable): requeued, resumes from the latest checkpoint"
      scontrol requeue "$SLURM_JOB_ID"
      exit "$code"
    fi
    echo "estimator-dist sbatch: exit code $code after $restarts restart(s), --max_restarts {max_restarts}: not requeued"
    exit 1 ;;  # not $code: an admin's RequeueExit=143,144 would requeue it again
esac
exit "$code"
"""
    return "\n".join(head) + "\n" + body
