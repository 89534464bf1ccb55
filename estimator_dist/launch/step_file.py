"""The step file: how an elastic launcher learns when its chief trains (no TensorFlow).

The launcher names a file in the chief's environment (ENV); the chief's StepFileHook
(training/step_file_hook.py) writes it after its first step of this process (note_start)
and again when training stops on a signal (note_stop): {"first_step", "first_at",
"last_step", "last_at"} (wall-clock seconds).
The launcher times a start (or a re-form) to that first step, and reads what a stop
lost: the steps trained after the checkpoint it stopped at.
"""
import json
import os
import time
from typing import Any, Dict

ENV = "ESTIMATOR_DIST_STEP_FILE"


def write(path: str, fields: Dict[str, Any]):
    """Replace the file whole (rename), so a reader never sees half of it."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(fields, f)
    os.replace(tmp, path)


def read(path: str) -> Dict[str, Any]:
    """What the chief wrote; {} before it wrote anything."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def note_start(path: str, step: int):
    """The step this process trained first, and when (the file written anew)."""
    write(path, {"first_step": step, "first_at": time.time()})


def note_stop(step):
    """The step training stopped at on SIGTERM (Preempted.step), into the step file if there
    is one: the launcher reports the steps trained after the checkpoint as lost."""
    path = os.environ.get(ENV)
    if path and step is not None:
        write(path, {**read(path), "last_step": step, "last_at": time.time()})
