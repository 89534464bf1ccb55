"""The final checkpoint when nobody else handles it: a chief with no evaluator task evaluates
and exports it, an early stop exports the stopped step, a rerun at --train_steps exports a
step an earlier run left unexported."""
import os
from typing import Any, Dict, Optional

import tensorflow as tf

from estimator_dist.distribute import tf_config as cluster_lib
from estimator_dist.guards import signals
from estimator_dist.guards import stop_messages
from estimator_dist.serving import export as export_lib
from estimator_dist.training.estimator import single_device_estimator
from estimator_dist.training.plan import Plan
from estimator_dist.checkpoint_files import latest_step, step_of


def export_from_chief(p: Plan) -> Optional[str]:
    """With no evaluator task nobody runs the exporters: the chief exports the final checkpoint
    (once: None when a restart of the cluster finds it exported already)."""
    base = os.path.join(p.model_dir, export_lib.EXPORT_SUBDIR, "final")
    latest = tf.train.latest_checkpoint(p.model_dir)
    if latest and export_lib.export_of_step(base, step_of(latest)):
        return None
    with cluster_lib.local_only():
        estimator = single_device_estimator(p)
    return export_lib.export_saved_model(estimator, p.serving_input, base, latest)


def evaluate_final_checkpoint(p: Plan, eval_spec) -> Dict[str, Any]:
    """A cluster's chief with no evaluator task: nothing evaluated while the cluster trained,
    so it evaluates the final checkpoint on one device, for its result line and summary."""
    latest = tf.train.latest_checkpoint(p.model_dir)
    if latest is None:  # evaluate() would use random initial weights, silently
        return {}
    with cluster_lib.local_only():
        estimator = single_device_estimator(p)
    with signals.raise_on_sigterm(lambda: stop_messages.final_evaluation_stopped(latest)):
        return estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps,
                                  checkpoint_path=latest)


def stopped_early(hooks) -> bool:
    return any(getattr(h, "stopped_early", False) for h in hooks)


def export_after_early_stop(p: Plan, estimator, hooks, say):
    """--export final after an early stop (local, Horovod rank 0): export the stopped step.

    Estimator runs the FinalExporter only for a checkpoint at --train_steps, which an
    early stop never writes: the run ended, exit 0, with no SavedModel. A cluster's
    evaluator exports on the chief's end marker (evaluator.py). Inside TrainingGuard:
    SIGTERM here removes the partial export.
    """
    step = latest_step(p.model_dir)
    if p.config.train.export != "final" or not p.role.exports_after_early_stop or \
            not stopped_early(hooks) or \
            step is None or step >= p.config.train.train_steps:
        return
    base = os.path.join(p.model_dir, export_lib.EXPORT_SUBDIR, "final")
    export_lib.export_saved_model(estimator, p.serving_input, base,
                                  tf.train.latest_checkpoint(p.model_dir))
    say(f"early stop: exported the checkpoint at step {step} as the final export")


def export_when_already_trained(p: Plan, estimator, eval_spec, eval_result):
    """A run resumed at --train_steps: Estimator skipped training and with it the exporters,
    so a final checkpoint a run with --export none left unexported was never exported (exit 0,
    no SavedModel). Each exporter runs as at the end of training, unless an export of that
    step is there already."""
    latest = tf.train.latest_checkpoint(p.model_dir)
    if latest is None:
        return
    step = step_of(latest)
    for exporter in eval_spec.exporters:
        base = os.path.join(p.model_dir, export_lib.EXPORT_SUBDIR, exporter.name)
        if export_lib.export_of_step(base, step):
            continue
        exporter.export(estimator, base, latest, eval_result, is_the_final_export=True)
