"""SavedModel export: serving signatures over raw feature tensors, exporters, export-from-dir."""
import os
import re
from typing import Any, Dict, List, Mapping

import tensorflow as tf

from estimator_dist.errors import UserError

EXPORT_SUBDIR = "export"


def serving_input_fn(serving_features: Mapping[str, Any]):
    """A receiver fn taking one raw tensor per feature, batch dimension first."""

    def receiver_fn():
        placeholders = {
            name: tf.compat.v1.placeholder(tf.as_dtype(dtype), [None] + list(shape), name=name)
            for name, (shape, dtype) in serving_features.items()
        }
        return tf.estimator.export.ServingInputReceiver(placeholders, placeholders)

    return receiver_fn


def _loss_smaller(best_eval_result, current_eval_result):
    return current_eval_result["loss"] < best_eval_result["loss"]


def make_exporters(mode: str, serving_features, keep: int) -> List[tf.estimator.Exporter]:
    """Exporters for EvalSpec: latest (every eval), best (lowest eval loss), final (at the end)."""
    receiver = serving_input_fn(serving_features)
    if mode == "latest":
        return [tf.estimator.LatestExporter("latest", receiver, exports_to_keep=keep)]
    if mode == "best":
        return [tf.estimator.BestExporter("best", receiver, compare_fn=_loss_smaller,
                                          exports_to_keep=keep)]
    if mode == "final":
        return [tf.estimator.FinalExporter("final", receiver)]
    return []


def export_paths(model_dir: str) -> List[str]:
    """Every finished SavedModel under model_dir/export, oldest first."""
    root = os.path.join(model_dir, EXPORT_SUBDIR)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if "saved_model.pb" in filenames and re.fullmatch(r"\d+", os.path.basename(dirpath)):
            found.append(dirpath)
    return sorted(found, key=lambda p: (os.path.basename(p), p))


def as_text(path) -> str:
    return path.decode() if isinstance(path, bytes) else str(path)


def resolve_checkpoint(model_dir: str, checkpoint: str = "") -> str:
    """A named checkpoint (path or model.ckpt-N in model_dir) or the latest; refuse if none."""
    if checkpoint:
        candidates = [checkpoint, os.path.join(model_dir, checkpoint)]
        for path in candidates:
            if tf.compat.v1.train.checkpoint_exists(path):
                return path
        raise UserError(f"--checkpoint {checkpoint}: no such checkpoint (looked at "
                        f"{', '.join(candidates)}); list the model.ckpt-* files in {model_dir}")
    latest = tf.train.latest_checkpoint(model_dir)
    if not latest:
        raise UserError(f"'{model_dir}' has no checkpoint; train first (estimator-dist train "
                        f"--model_dir {model_dir})")
    return latest


def export_saved_model(estimator, serving_features: Dict[str, Any], export_base: str,
                       checkpoint_path: str) -> str:
    """Export one SavedModel under export_base/<timestamp>; returns its path."""
    path = estimator.export_saved_model(export_base, serving_input_fn(serving_features),
                                        checkpoint_path=checkpoint_path)
    return as_text(path)
