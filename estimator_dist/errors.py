"""Errors that end a run with a one-line message and a meaningful exit code.

Codes 1-127 are permanent failures: rerunning the same command fails the same
way. 128 + N means "killed by signal N" and is what schedulers retry (Kubeflow's
`restartPolicy: ExitCode` restarts on 128-255): a preempted run exits 143 after
writing a final checkpoint, and rerunning it resumes from that checkpoint.
"""
import re
import sys

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USER = 2
EXIT_NON_FINITE = 4
EXIT_STORAGE = 5
EXIT_INTERRUPTED = 130
EXIT_PREEMPTED = 143  # 128 + SIGTERM
EXIT_PEER_LOST = 144  # a multi_worker_mirrored peer is gone: retryable (peers.py)
# SIGTERM to `train` outside its training guard (stop_messages.outside_the_run, signals).
OUTSIDE_THE_RUN = ("SIGTERM outside a training step (starting, connecting to its peers or "
                   "reporting): stopped at once, nothing to save; exit code 143 (retryable); "
                   "rerun the same command to resume")


def message(error: BaseException) -> str:
    """An exception's whole message: a TensorFlow OpError's `message`, else str()."""
    return getattr(error, "message", None) or str(error)


def first_line(error: BaseException, limit: int = 300) -> str:
    """An exception's message cut to its first line (TensorFlow's run to many), or its type."""
    text = message(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


def op_error_line(error: BaseException, limit: int = 300) -> str:
    """The line of a TensorFlow OpError that says what failed, without "Graph execution
    error:", the "Detected at node" stack, the "From /job:chief/replica:0/task:0:" line a
    multi-worker error starts with and the "[[{{node ...}}]]" suffix."""
    for line in message(error).splitlines():
        text = re.sub(r"\s*\[\[\{\{node .*$", "", line).strip()
        if text and not line[:1].isspace() and not re.match(
                r"(Graph execution error:|Detected at node|<stack traces|File |Original stack|Node:|"
                r"From /job:[^ ]*:$)", text):
            return text[:limit]
    return first_line(error, limit)


class ReportedError(Exception):
    """A failure reported as one line on stderr (no traceback) with its own exit code."""

    exit_code = EXIT_INTERNAL
    label = "error"
    # Raised inside a tf.function (a model_fn under a tf.distribute strategy), TensorFlow's
    # autograph would re-raise it with an "in user code:" stack in its message; this
    # attribute makes it pass through unchanged.
    ag_pass_through = True


class UserError(ReportedError):
    """A mistake in what the user asked for: printed as one line, exit code 2."""

    exit_code = EXIT_USER


class UntrainableTrainOp(UserError):
    """A train_op that cannot train (graph/train_op_checks.py), found after its first updates:
    only step 0's initial weights were saved, so a model_dir the run created is removed."""


class NonFiniteError(ReportedError):
    """The loss or a gradient became NaN or Inf: training stopped before applying that step."""

    exit_code = EXIT_NON_FINITE


class StorageError(ReportedError):
    """Writing a checkpoint or an export failed (disk full, file too large, read-only)."""

    exit_code = EXIT_STORAGE


class TrainingFailed(ReportedError):
    """A training step failed in TensorFlow (e.g. a label outside the model's classes): one
    line naming what failed; --verbose keeps TensorFlow's traceback."""

    exit_code = EXIT_INTERNAL


class OutOfMemory(TrainingFailed):
    """TensorFlow could not allocate a tensor (ResourceExhaustedError, or a folded constant it
    could not expand) while initializing or training the model: it or its batch is too large
    for this machine. Permanent for the same command (exit 1, one line); a model_dir the run
    created is removed while it holds no checkpoint."""


class Preempted(ReportedError):
    """SIGTERM during training: a final checkpoint was written; rerun to resume."""

    exit_code = EXIT_PREEMPTED
    label = "preempted"
    step = None  # the global step training stopped at, when known


class RunFinished(ReportedError):
    """SIGTERM to a cluster task after the chief finished the run (the launcher, or Kubeflow's
    cleanPodPolicy, stops the tasks still running): the run's normal end, exit 0."""

    exit_code = EXIT_OK
    label = "done"

    def __init__(self, task: str, step):
        super().__init__(f"the chief finished the run at step {step}; {task} stopped with it")


class Interrupted(ReportedError):
    """Ctrl-C (SIGINT) during a local run's training: a final checkpoint was written."""

    exit_code = EXIT_INTERRUPTED
    label = "interrupted"
    step = None  # the global step training stopped at, when known


def reported(error: "ReportedError") -> int:
    """Print a reported error as the command's one line on stderr; its exit code."""
    print(f"estimator-dist: {error.label}: {error}", file=sys.stderr)
    return error.exit_code


def interrupted() -> int:
    """Ctrl-C outside a run's own handling: one line, exit 130."""
    print("estimator-dist: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED
