"""The evaluator task of a cluster, and the chief's "training ended" marker.

Estimator's evaluator loops until it has evaluated a checkpoint at max_steps. A
run that stops early (early stopping) never writes one, so the evaluator would
wait forever and the final export would never run (in a TFJob, the job would
never finish). The chief therefore writes model_dir/training_end.json when its
training ends; the evaluator stops its loop when it sees the marker, then
evaluates the final checkpoint and runs the exporters as the final export.
"""
import json
import os
import time

import tensorflow as tf

from estimator_dist import files
from estimator_dist.compat import internals

END_MARKER = "training_end.json"
# Estimator's evaluator loop (throttle_secs 0) re-reads the checkpoint state as fast as it
# can while there is no new checkpoint: ~0.44 of a core, idle. It sleeps between empty polls
# instead, from the first to the longest wait, doubling.
FIRST_WAIT_S = 0.05
LONGEST_WAIT_S = 1.0
# The loop found a checkpoint at max_steps: the chief's last save and its end marker follow
# within a step and a save; a chief gone before marking the end is waited for this long.
END_WAIT_S = 60.0


def marker_path(model_dir: str) -> str:
    return os.path.join(model_dir, END_MARKER)


def clear_end(model_dir: str):
    """The chief, starting (or resuming): no stale marker may end the new run's evaluation."""
    try:
        os.remove(marker_path(model_dir))
    except FileNotFoundError:
        pass


def mark_end(model_dir: str, global_step: int):
    """The chief, after training: tell the evaluator which checkpoint is the last."""
    files.write_text(marker_path(model_dir), json.dumps({"global_step": global_step}))


def end_step(model_dir: str, since: float):
    """The step the chief marked as the run's end, if it did so after `since` (a time.time()):
    an earlier run's marker does not count. None: training has not ended."""
    path = marker_path(model_dir)
    try:
        if os.path.getmtime(path) < since:
            return None
        with open(path) as f:
            return json.load(f).get("global_step")
    except (OSError, ValueError):
        return None


def _marker_state(path: str):
    """(modification time in ns, content) of the end marker; None without one."""
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_mtime_ns, f.read()
    except OSError:
        return None


class StopWhenTrainingEnded(internals.ContinuousEvalListener):
    """Ends Estimator's evaluation loop once the chief has marked the end of training, and
    backs off while there is no new checkpoint to evaluate."""

    def __init__(self, model_dir: str, sleep=time.sleep):
        self._path = marker_path(model_dir)
        # A marker here already is an earlier run's: the chief removes it as it starts, which
        # may be after this task started (a rerun's evaluator took a marker written 0.4 s
        # before it started as this run's end). Only a new or rewritten marker ends this run.
        self._stale = _marker_state(self._path)
        self._wait = 0.0
        self._sleep = sleep

    def after_eval(self, eval_result) -> bool:
        if internals.evaluated(eval_result):
            self._wait = 0.0
        else:  # no (new) checkpoint yet
            self._wait = min(LONGEST_WAIT_S, max(FIRST_WAIT_S, 2 * self._wait))
            self._sleep(self._wait)
        return True

    def ended(self) -> bool:
        state = _marker_state(self._path)
        return state is not None and state != self._stale

    def before_eval(self) -> bool:
        return not self.ended()


class HeldFinalExport:
    """The exporters, as Estimator's evaluator loop sees them: an export the loop calls final
    (its checkpoint reached max_steps) is held, not written. Under asynchronous training
    another worker's update can land after the chief's last step check, so the chief's last
    checkpoint may come after the one the loop found at max_steps; the one final export is
    of the last checkpoint, after the chief marked the end (`final_evaluation`)."""

    def __init__(self, exporters):
        self.checkpoint, self.metrics = None, None
        self.exporters = [_Held(exporter, self) for exporter in exporters]


class _Held(tf.estimator.Exporter):
    """One exporter whose final export goes to `holder` instead of being written."""

    def __init__(self, exporter, holder: HeldFinalExport):
        self._exporter, self._holder = exporter, holder

    @property
    def name(self):
        return self._exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        if is_the_final_export:
            self._holder.checkpoint, self._holder.metrics = checkpoint_path, eval_result
            return None
        return self._exporter.export(estimator, export_path, checkpoint_path, eval_result,
                                     is_the_final_export)


def wait_for_end(model_dir: str, seconds: float, sleep=time.sleep):
    """After the loop evaluated a checkpoint at max_steps: the chief is saving its last
    checkpoint, then marks the end. Wait for the marker (a chief gone before it: `seconds`)."""
    deadline = time.monotonic() + seconds
    while end_step(model_dir, since=0.0) is None and time.monotonic() < deadline:
        sleep(FIRST_WAIT_S)


def final_evaluation(estimator, eval_spec, say, held: HeldFinalExport = None):
    """Evaluate the last checkpoint (unless the loop's held export is of it) and run every
    exporter as the final export."""
    checkpoint = estimator.latest_checkpoint()
    if held is not None and held.checkpoint == checkpoint:
        metrics = held.metrics
    else:
        metrics = estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps,
                                     checkpoint_path=checkpoint, name=eval_spec.name,
                                     hooks=eval_spec.hooks)
    for exporter in eval_spec.exporters:
        base = os.path.join(tf.compat.as_str_any(estimator.model_dir), "export", exporter.name)
        exporter.export(estimator, base, checkpoint, metrics, is_the_final_export=True)
    say(f"training ended at step {metrics['global_step']}: evaluated and exported the last "
        f"checkpoint")
    return metrics


def run(estimator, train_spec, eval_spec, say, end_wait_s=END_WAIT_S):
    """The evaluator task: evaluate each new checkpoint until training ends, however it ends;
    then one final export, of the last checkpoint."""
    model_dir = tf.compat.as_str_any(estimator.model_dir)
    listener = StopWhenTrainingEnded(model_dir)
    held = HeldFinalExport(eval_spec.exporters)
    internals.run_evaluator_loop(estimator, train_spec,
                                 eval_spec._replace(exporters=held.exporters), listener)
    if held.checkpoint is not None and not listener.ended():
        wait_for_end(model_dir, end_wait_s)
    if held.checkpoint is not None or listener.ended():
        final_evaluation(estimator, eval_spec, say, held)
