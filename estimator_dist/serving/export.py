"""SavedModel export: serving signatures over raw feature tensors, exporters, export-from-dir."""
import os
import re
from typing import Any, Dict, List, Mapping, Optional

import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist.checkpoint_files import step_of
from estimator_dist import errors
from estimator_dist import files
from estimator_dist.guards import storage
from estimator_dist.errors import UserError

EXPORT_SUBDIR = "export"


# Where the receiver leaves the serialized tf.Example input (heads.py's classification and
# regression signatures take it, as TF Serving's :classify and :regress do).
EXAMPLES_COLLECTION = "estimator_dist_serialized_examples"
# The serving input of a model whose features are one tensor, not a dict
# (input_meta["plain_features"]): the SavedModel's signature takes it under this name and
# the model_fn is handed the tensor itself (runner.serving_checked).
PLAIN_FEATURE = "input"


def _example_dtype(dtype: tf.DType) -> Optional[tf.DType]:
    """What tf.Example holds a feature of `dtype` as (float32, int64, bytes; parsed, then cast)."""
    if dtype == tf.string:
        return tf.string
    if dtype.is_bool or dtype.is_integer:
        return tf.int64
    return tf.float32 if dtype.is_floating else None


def example_parsing_spec(serving_features: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """tf.io.parse_example's spec for the serving features, or None when a feature cannot be a
    fixed-length tf.Example feature (an open dimension, a dtype tf.Example cannot hold)."""
    spec = {}
    for name, (shape, dtype) in serving_features.items():
        parsed = _example_dtype(tf.as_dtype(dtype))
        if parsed is None or any(d is None for d in shape):
            return None
        spec[name] = tf.io.FixedLenFeature(list(shape), parsed)
    return spec


def serving_input_fn(serving_features: Mapping[str, Any]):
    """A receiver fn taking one raw tensor per feature, batch dimension first.

    Where every feature fits a fixed-length tf.Example feature, each raw input defaults to
    the same feature parsed from a batch of serialized tf.Examples (left in
    EXAMPLES_COLLECTION): the predict signature feeds the raw tensors (the parse never
    runs), the classification/regression signatures feed serialized examples.
    """

    def receiver_fn():
        spec = example_parsing_spec(serving_features)
        parsed = None
        if spec is not None:
            examples = tf.compat.v1.placeholder(tf.string, [None], name="input_example_tensor")
            tf.compat.v1.add_to_collection(EXAMPLES_COLLECTION, examples)
            parsed = tf.io.parse_example(examples, spec)
        placeholders = {}
        for name, (shape, dtype) in serving_features.items():
            dtype, shape = tf.as_dtype(dtype), [None] + list(shape)
            if parsed is None:
                placeholders[name] = tf.compat.v1.placeholder(dtype, shape, name=name)
            else:
                placeholders[name] = tf.compat.v1.placeholder_with_default(
                    tf.cast(parsed[name], dtype), shape, name=name)
        return tf.estimator.export.ServingInputReceiver(placeholders, placeholders)

    return receiver_fn


def receiver_fn(serving):
    """The receiver fn of a serving input: a receiver fn itself (named at registration), or
    serving_features ({name: [shape without batch, dtype]}) for serving_input_fn."""
    return serving if callable(serving) else serving_input_fn(serving)


def receiver_features(fn, owner: str) -> Dict[str, Any]:
    """serving_features of the features a receiver fn hands the model_fn (built in a
    scratch graph), for the run's description and checks; UserError if it is no receiver."""
    with tf.Graph().as_default():
        try:
            receiver = fn()
        except Exception as e:  # noqa: BLE001 - the user's function, said in one line
            raise UserError(f"{owner}: its serving_input function failed: "
                            f"{type(e).__name__}: {errors.first_line(e)}") from None
        if not isinstance(receiver, tf.estimator.export.ServingInputReceiver):
            raise UserError(f"{owner}: its serving_input function returned "
                            f"{type(receiver).__name__}; it must return a "
                            f"tf.estimator.export.ServingInputReceiver (e.g. from "
                            f"tf.estimator.export.build_raw_serving_input_receiver_fn)")
        features = receiver.features
        if not isinstance(features, dict):
            features = {PLAIN_FEATURE: features}
        return {name: [t.shape.as_list()[1:] if t.shape.rank else [], t.dtype.name]
                for name, t in features.items()}


def serialized_examples(graph) -> Optional[tf.Tensor]:
    """The export's serialized tf.Example input, if its receiver made one."""
    found = graph.get_collection(EXAMPLES_COLLECTION)
    return found[0] if found else None


def metric_compare(metric: str, higher: bool):
    """compare_fn for BestExporter: is the current evaluation better on `metric`?

    BestExporter also replays the eval event files with it when a run restarts,
    so a restarted run never exports a model worse than the best already kept.
    """

    def is_better(best_eval_result, current_eval_result):
        for result in (best_eval_result, current_eval_result):
            if metric not in result:
                known = ", ".join(sorted(k for k in result if k != "global_step"))
                raise UserError(f"--best_metric {metric}: not an eval metric of this model; it "
                                f"reports {known}")
        best, current = best_eval_result[metric], current_eval_result[metric]
        return current > best if higher else current < best

    return is_better


class BestExporter(tf.estimator.BestExporter):
    """BestExporter that stays correct across restarts.

    TF's exports on the first evaluation of every process (`not _has_exported`),
    so a restarted run exported its first evaluation even when it was worse than
    the best model already kept (measured). Here the best so far is replayed from
    the evaluations before this one, and only a better result exports.
    """

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        if internals.best_exporter_model_dir(self) != estimator.model_dir:
            earlier = self._best_before(estimator.eval_dir(), int(eval_result["global_step"]))
            kept = os.path.isdir(export_path) and any(
                re.fullmatch(r"\d+", name) for name in os.listdir(export_path))
            internals.resume_best_exporter(self, estimator.model_dir, earlier,
                                           earlier is not None and kept)
        return super().export(estimator, export_path, checkpoint_path, eval_result,
                              is_the_final_export)

    def _best_before(self, eval_dir: str, step: int):
        better = internals.best_exporter_compare_fn(self)
        best = None
        for path in tf.io.gfile.glob(os.path.join(eval_dir, "*.tfevents.*")):
            for event in tf.compat.v1.train.summary_iterator(path):
                result = {v.tag: v.simple_value for v in event.summary.value
                          if v.HasField("simple_value")}
                if result and event.step < step and (best is None or better(best, result)):
                    best = result
        return best


class FinalExporter(tf.estimator.FinalExporter):
    """FinalExporter that exports a checkpoint once: one run, at most one final export.

    A cluster restarted after training ended (a ps task's death restarts every task)
    resumed at --train_steps and its evaluator exported the same checkpoint again.
    """

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        if is_the_final_export and checkpoint_path and \
                export_of_step(export_path, step_of(checkpoint_path)):
            return None
        return super().export(estimator, export_path, checkpoint_path, eval_result,
                              is_the_final_export)


def export_of_step(export_base: str, step: int) -> Optional[str]:
    """The export under export_base made from the checkpoint at `step`, or None (a
    SavedModel keeps the global_step variable of the checkpoint it was made from)."""
    if not os.path.isdir(export_base):
        return None
    for name in sorted(os.listdir(export_base), reverse=True):
        path = os.path.join(export_base, name)
        if not re.fullmatch(r"\d+", name) or \
                not os.path.isfile(os.path.join(path, "saved_model.pb")):
            continue
        try:
            exported = tf.train.load_variable(os.path.join(path, "variables", "variables"),
                                              "global_step")
        except (tf.errors.OpError, ValueError):
            continue
        if int(exported) == step:
            return path
    return None


def make_exporters(mode: str, serving_features, keep: int, best_metric: str = "loss",
                   higher: bool = False) -> List[tf.estimator.Exporter]:
    """Exporters for EvalSpec: latest (every eval), best (by best_metric), final (at the end)."""
    receiver = receiver_fn(serving_features)
    if mode == "latest":
        return [tf.estimator.LatestExporter("latest", receiver, exports_to_keep=keep)]
    if mode == "best":
        return [BestExporter("best", receiver,
                                          compare_fn=metric_compare(best_metric, higher),
                                          exports_to_keep=keep)]
    if mode == "final":
        return [FinalExporter("final", receiver)]
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


def export_saved_model(estimator, serving_features: Dict[str, Any], export_base: str,
                       checkpoint_path: str) -> str:
    """Export one SavedModel under export_base/<timestamp>; returns its path.

    Refuses a base holding anything but earlier exports (storage.check_export_base).
    On failure (e.g. disk full) the half-written `temp-<timestamp>` dir is removed
    and earlier exports stay as they were.
    """
    storage.check_export_base(export_base)
    created = files.missing_dirs(export_base)
    try:
        with storage.cleanup_on_failure([export_base]), storage.not_world_writable():
            path = estimator.export_saved_model(export_base, receiver_fn(serving_features),
                                                checkpoint_path=checkpoint_path)
    except (tf.errors.OpError, OSError) as e:
        files.remove_empty_dirs(created)
        if storage.storage_reason(e) is not None:
            raise storage.storage_error(e, f"exporting into {export_base}",
                                        "earlier exports there are intact, the partial export "
                                        "was removed") from None
        if isinstance(e, (tf.errors.NotFoundError, tf.errors.PermissionDeniedError,
                          tf.errors.FailedPreconditionError, OSError)):
            raise UserError(f"cannot write an export into {export_base} ({errors.first_line(e)}); "
                            f"nothing was exported; give an --export_dir that can be created and "
                            f"written to") from None
        raise
    return as_text(path)
