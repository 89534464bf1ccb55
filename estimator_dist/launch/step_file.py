"""The step file: how an elastic launcher learns when its chief trains (no TensorFlow).

The launcher names a file in the chief's environment (ENV); the chief's StepFileHook
(training/hooks.py) writes it after its first step of this process and again when
training ends: {"first_step", "first_at", "last_step", "last_at"} (wall-clock seconds).
The launcher times a start (or a re-form) to that first step, and reads what a stop
lost: the steps trained after the checkpoint it stopped at.
"""
import json
import os
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
