"""The commands that drive Estimator: train (this process's procedure, training/roles.py),
evaluate and export a checkpoint."""
from typing import Any, Dict

import tensorflow as tf

from estimator_dist import files
from estimator_dist import quiet
from estimator_dist.errors import TrainingFailed, op_error_line
from estimator_dist.guards import storage
from estimator_dist.serving import export as export_lib
from estimator_dist.training import config as config_lib
from estimator_dist.training import roles
from estimator_dist.training.estimator import make_input_fn, single_device_estimator
from estimator_dist.training.plan import plan
from estimator_dist.training.preflight import restorable_checkpoint
from estimator_dist.training.summary import plain


def train(config: config_lib.Config, out=print, extra_hooks=()) -> Dict[str, Any]:
    """Train and evaluate as configured (this process's part of a cluster, by its kind:
    training/roles.py); returns the summary. extra_hooks: SessionRunHooks added to
    training's (the bench's step clock)."""
    return roles.run(config, out, extra_hooks)


def evaluate(config: config_lib.Config, checkpoint: str = "") -> Dict[str, Any]:
    """Evaluate a named or the latest checkpoint; refuses when there is none or it does not fit."""
    p = plan(config)
    path = restorable_checkpoint(p, checkpoint)
    estimator = single_device_estimator(p)
    eval_dir = estimator.eval_dir("cli")
    created, before = files.missing_dirs(eval_dir), set(storage.event_files(eval_dir))
    try:
        metrics = estimator.evaluate(make_input_fn(p, tf.estimator.ModeKeys.EVAL),
                                     steps=config.train.eval_steps or None, checkpoint_path=path,
                                     name="cli")
    except (tf.errors.OpError, RuntimeError, IndexError) as e:
        if storage.storage_reason(e):  # its metrics go to model_dir/eval_cli: not the labels
            # The events file its writer began (0 bytes on a full disk) holds no result.
            storage.remove(set(storage.event_files(eval_dir)) - before)
            files.remove_empty_dirs(created)
            raise storage.storage_error(e, f"evaluating {path} (writing its metrics)",
                                        "the checkpoints are unchanged; no partial events file "
                                        "was left") from None
        if not isinstance(e, tf.errors.OpError):
            raise
        if not quiet.is_quiet():
            raise
        raise TrainingFailed(f"evaluating {path} failed: {op_error_line(e)} "
                             f"({type(e).__name__}); check the input's labels and features "
                             f"against the model; --verbose shows TensorFlow's traceback") from None
    return {k: plain(v) for k, v in metrics.items()}


def export(config: config_lib.Config, input_meta: Dict[str, Any], export_base: str,
           checkpoint: str = "") -> str:
    """Export a SavedModel from a checkpoint on one CPU; no data needed. Refuses as evaluate does."""
    p = plan(config, input_meta=input_meta)
    path = restorable_checkpoint(p, checkpoint)
    return export_lib.export_saved_model(single_device_estimator(p), p.serving_input,
                                         export_base, path)
