"""What a run leaves and says at its end: run files, the summary, its one-line result."""
import glob
import json
import os
from typing import Any, Dict

import tensorflow as tf

from estimator_dist.training import config as config_lib
from estimator_dist import files
from estimator_dist.training.plan import Plan


def save_run_files(p: Plan, say=None):
    """Write the resolved config into model_dir (the chief's job); a config.yaml there that
    is no run's config is replaced, and `say` says so (it was replaced silently)."""
    problem = config_lib.unreadable_saved(p.model_dir)
    if problem and say:
        say(f"note: {problem}; replaced it with this run's config")
    os.makedirs(p.model_dir, exist_ok=True)
    config_lib.save(p.config, p.model_dir, extra={
        "input": p.input.name,
        "devices": list(p.devices.names),
        "replicas": p.replicas,
        "per_replica_batch": p.per_replica_batch,
        "input_meta": p.input_meta,
    })


def write_summary(path: str, summary: Dict[str, Any]):
    files.write_text(path, json.dumps(summary, indent=2, sort_keys=True))


def plain(value):
    """numpy scalars -> Python numbers for JSON."""
    return value.item() if hasattr(value, "item") else value


def silent(*_):
    pass


def final_eval_metrics(model_dir: str) -> Dict[str, Any]:
    """The last evaluation's scalars from model_dir/eval (the evaluator task's result)."""
    latest: Dict[str, Any] = {}
    best_step = -1
    for path in sorted(glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            values = {v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")}
            if values and event.step >= best_step:
                best_step, latest = event.step, {**values, "global_step": event.step}
    return latest


def format_result(summary: Dict[str, Any], evaluated_elsewhere: bool = False) -> str:
    """The run's last line(s). evaluated_elsewhere: a cluster's training task, whose
    evaluator task evaluates and exports (training/roles.py)."""
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in sorted(summary["metrics"].items())
                        if k != "global_step" and isinstance(v, float))
    if not summary["metrics"] and evaluated_elsewhere:
        metrics = "(the evaluator task evaluates and exports)"
    line = f"done: step {summary['global_step']}  {metrics}"
    if summary["exports"]:
        line += f"\nexported: {summary['exports'][-1]}"
    return line
