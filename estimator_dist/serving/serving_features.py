"""serving_features ({name: [shape without batch, dtype]}): checked when an input declares
them, inferred from its dataset when it does not, described for the run's lines, and matched
against the features the input yields in training."""
from typing import Any, Dict, Mapping

import tensorflow as tf

from estimator_dist.errors import UserError
from estimator_dist.serving.export import PLAIN_FEATURE


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
