"""SavedModel export: serving signatures over raw feature tensors, exporters, export-from-dir."""
import os
import re
from typing import Any, Dict, List, Mapping, Optional

import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist.guards import checkpoints
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


def check_serving_features(serving_features, where: str):
    """UserError unless serving_features is {name: [shape without batch, dtype name]}, checked
    when prepare() returns it (a bad one failed only at the export after training)."""
    example = "e.g. {'image': [[8, 8, 1], 'float32']}"
    if not isinstance(serving_features, dict) or not serving_features:
        raise UserError(f"{where} returned serving_features {serving_features!r}; it must be a "
                        f"non-empty dict {{feature name: [shape without batch, dtype name]}}, "
                        f"{example}")
    for name, spec in serving_features.items():
        ok = isinstance(name, str) and isinstance(spec, (list, tuple)) and len(spec) == 2
        shape, dtype = spec if ok else (None, None)
        ok = ok and isinstance(shape, (list, tuple)) and all(
            d is None or (isinstance(d, int) and not isinstance(d, bool) and d > 0) for d in shape)
        try:
            ok = ok and isinstance(dtype, str) and tf.as_dtype(dtype) is not None
        except TypeError:
            ok = False
        if not ok:
            raise UserError(f"{where} returned serving_features[{name!r}] = {spec!r}; each must "
                            f"be [shape without batch (positive ints or None), a dtype name such "
                            f"as 'float32'], {example}")


def inferred_serving_features(dataset, input_name: str) -> Dict[str, Any]:
    """input_meta for an input whose prepare() gives no serving_features (or that has none):
    serving_features read off its TRAIN dataset's element_spec (or the tensors it returns:
    none and tower take them), each feature's dtype and shape without the batch dimension
    (an unknown dimension stays open), and plain_features when the features are one tensor
    rather than a dict."""
    leaves = tf.nest.flatten(dataset)
    if isinstance(dataset, tf.data.Dataset):
        spec = dataset.element_spec
    elif leaves and all(tf.is_tensor(leaf) for leaf in leaves):  # (features, labels) tensors
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), dataset)
        spec = tuple(spec) if isinstance(spec, list) else spec
    else:
        raise UserError(f"input '{input_name}': cannot infer a serving signature from what its "
                        f"input_fn returns ({type(dataset).__name__}); return a tf.data.Dataset "
                        f"of (features, labels), or serving_features from a prepare()")
    features = spec[0] if isinstance(spec, tuple) and spec else spec  # labels are optional
    plain = not isinstance(features, dict)
    features = {PLAIN_FEATURE: features} if plain else features
    inferred = {}
    for name, feature in features.items():
        if not isinstance(feature, tf.TensorSpec) or feature.shape.rank is None or \
                feature.shape.rank == 0:
            what = (f"a {type(feature).__name__}" if not isinstance(feature, tf.TensorSpec) else
                    "a tensor of unknown rank" if feature.shape.rank is None else "not batched")
            raise UserError(f"input '{input_name}': feature {name!r} is {what}, so its serving "
                            f"input cannot be inferred; return serving_features "
                            f"{{{name!r}: [shape without batch, dtype]}} from a prepare()")
        inferred[name] = [feature.shape.as_list()[1:], feature.dtype.name]
    return {"serving_features": inferred, **({"plain_features": True} if plain else {})}


def describe_serving_features(serving_features: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {list(shape)} {dtype}"
                     for name, (shape, dtype) in serving_features.items())


def _spec_text(shape, dtype) -> str:
    return f"[{list(shape)}, '{dtype}']"


def _tensor_spec_text(value) -> str:
    shape = value.shape if isinstance(value, tf.Tensor) else None
    dims = "unknown" if shape is None or shape.rank is None else shape.as_list()[1:]
    return f"[{dims}, '{value.dtype.base_dtype.name}']"


def check_training_features(features, serving_features: Mapping[str, Any], input_name: str,
                            plain: bool = False):
    """UserError unless every serving feature is among the features the input yields in
    training, with its dtype and static shape without the batch dimension (unknown dims
    match anything): checked on the TRAIN graph's own feature tensors, so a disagreement
    stops the run before its first step instead of exporting a SavedModel that fails in
    predict.

    Features the input yields beyond serving_features are allowed: a model_fn may read
    some only in training (e.g. example weights). Features that are one tensor need
    `plain` (input_meta["plain_features"]): without it the SavedModel would hand the
    model_fn a dict.
    """
    fix = "make the input's prepare() serving_features match what its input_fn yields"
    if not isinstance(features, dict):
        if len(serving_features) != 1 or not hasattr(features, "dtype"):
            raise UserError(f"input '{input_name}' yields features that are not a dict of named "
                            f"tensors ({type(features).__name__}), but its serving_features name "
                            f"{', '.join(map(repr, serving_features))}; {fix}")
        if not plain:
            raise UserError(f"input '{input_name}' yields one tensor as features, not a dict; "
                            f"its prepare() must also return 'plain_features': True, or a "
                            f"SavedModel exported from this run would hand the model_fn a dict "
                            f"(or register the input without prepare(), to infer both)")
        features = {next(iter(serving_features)): features}
    for name, (shape, dtype) in serving_features.items():
        value = features.get(name)
        if value is None:
            yielded = ", ".join(map(repr, sorted(map(str, features)))) or "none"
            raise UserError(f"serving feature {name!r} {_spec_text(shape, dtype)}: input "
                            f"'{input_name}' does not yield it in training (it yields "
                            f"{yielded}); a SavedModel exported from this run would not serve; "
                            f"{fix}")
        if not hasattr(value, "dtype"):
            raise UserError(f"serving feature {name!r} {_spec_text(shape, dtype)}: input "
                            f"'{input_name}' yields a {type(value).__name__} under that name, "
                            f"not a tensor; {fix}")
        shape_ok = not isinstance(value, tf.Tensor) or \
            tf.TensorShape([None] + list(shape)).is_compatible_with(value.shape)
        if value.dtype.base_dtype != tf.as_dtype(dtype) or not shape_ok:
            raise UserError(f"feature {name!r}: input '{input_name}' yields "
                            f"{_tensor_spec_text(value)} in training, its serving_features say "
                            f"{_spec_text(shape, dtype)} (shape without batch, dtype); a "
                            f"SavedModel exported from this run would not serve; {fix}")


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
                export_of_step(export_path, checkpoints.step_of(checkpoint_path)):
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


def predict_variables(model_fn, serving_features: Mapping[str, Any],
                      params) -> checkpoints.Variables:
    """A function building the graph export restores into; it returns that graph's {name: shape}.

    The PREDICT graph export builds (global step, serving placeholders,
    model_fn): it needs no data, and has none of the training-only variables
    (optimizer slots, accumulators) a checkpoint also holds.
    """
    return lambda: checkpoints.model_variables(model_fn, receiver_fn(serving_features), params,
                                               mode=tf.estimator.ModeKeys.PREDICT)


# The files of a checkpoint prefix P: P.index, P.data-00000-of-00001, (P.meta).
CHECKPOINT_FILE_SUFFIX = r"\.(index|meta|data-\d{5}-of-\d{5})$"


def resolve_checkpoint(model_dir: str, checkpoint: str = "",
                       variables: Optional[checkpoints.Variables] = None) -> str:
    """A named checkpoint (path or model.ckpt-N in model_dir) or the latest, read back whole.

    Refuses when there is none (TensorFlow would silently use random weights),
    when it is damaged, or when it does not fit `variables()`, the PREDICT
    graph it is to be restored into (checkpoints.check_restore). An unusable
    `checkpoint` state file is worked around read-only (checkpoints.find_latest).
    """
    if checkpoint:
        if os.path.isdir(checkpoint):
            latest = tf.train.latest_checkpoint(checkpoint)
            raise UserError(f"--checkpoint {checkpoint}: is a directory; name one checkpoint, "
                            f"e.g. {latest or os.path.join(checkpoint, 'model.ckpt-N')}")
        prefix = re.sub(CHECKPOINT_FILE_SUFFIX, "", checkpoint)
        if prefix != checkpoint:  # it read the one file as a whole checkpoint, and "lacked" all
            raise UserError(f"--checkpoint {checkpoint}: names one file of a checkpoint; give its "
                            f"prefix, {prefix}")
        candidates = [checkpoint, os.path.join(model_dir, checkpoint)]
        for path in candidates:
            if tf.compat.v1.train.checkpoint_exists(path):
                return checkpoints.check_restore(path, model_dir, variables)
        raise UserError(f"--checkpoint {checkpoint}: no such checkpoint (looked at "
                        f"{', '.join(candidates)}); list the model.ckpt-* files in {model_dir}")
    latest = checkpoints.latest_readable(model_dir, variables)
    if not latest:
        raise UserError(f"'{model_dir}' has no checkpoint; train first (estimator-dist train "
                        f"--model_dir {model_dir})")
    return latest


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
