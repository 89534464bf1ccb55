"""The chief's side of an elastic launcher's step file (launch/step_file.py): its first step."""
import os

import tensorflow as tf

from estimator_dist.launch import step_file


class StepFileHook(tf.compat.v1.train.SessionRunHook):
    """Writes launch/step_file.py's file after this process's first step (note_stop: when
    training stopped on a signal)."""

    def __init__(self, path: str):
        self._path = path
        self._written = False

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_run(self, run_context, run_values):
        if not self._written:
            self._written = True
            step_file.note_start(self._path, int(run_context.session.run(self._global_step)))


def step_file_hooks():
    """[StepFileHook] when an elastic launcher asked this process for one (its chief)."""
    path = os.environ.get(step_file.ENV)
    return [StepFileHook(path)] if path else []
