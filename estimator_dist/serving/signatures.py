"""Which signature of a SavedModel predict runs, and how its rows reach it: raw features, or
serialized tf.Examples for a canned Estimator's classify/regress/predict signatures."""
import os
from typing import Dict

import numpy as np
import tensorflow as tf

from estimator_dist.errors import UserError
from estimator_dist.serving import canned
from estimator_dist.serving import export as export_lib

SIGNATURE = "serving_default"


def model_dir_of(saved_model: str) -> str:
    """The model_dir a SavedModel was exported into (MODEL_DIR/export/...), else 'MODEL_DIR'."""
    parts = os.path.abspath(saved_model).split(os.sep)
    if export_lib.EXPORT_SUBDIR in parts[1:]:
        index = len(parts) - 1 - parts[::-1].index(export_lib.EXPORT_SUBDIR)
        return os.sep.join(parts[:index]) or os.sep
    return "MODEL_DIR"


def load_signature(path: str, name: str = ""):
    """(loaded, signature): `name`, or by default the raw-feature signature of a canned
    Estimator's export (canned.PREDICT_RAW) when there is one, else serving_default."""
    loaded = tf.saved_model.load(path)
    signatures = loaded.signatures
    has = ", ".join(signatures) or "none"
    if name:
        if name not in signatures:
            raise UserError(f"--signature {name}: SavedModel {path} has no such signature; it "
                            f"has {has}; give one of those")
        return loaded, signatures[name]
    for default in (canned.PREDICT_RAW, SIGNATURE):
        if default in signatures:
            return loaded, signatures[default]
    raise UserError(f"SavedModel {path} has no '{SIGNATURE}' signature; it has {has}; pick one "
                    f"with --signature NAME, or re-export it (estimator-dist export --model_dir "
                    f"{model_dir_of(path)}: a canned Estimator's export then has "
                    f"'{canned.PREDICT_RAW}' over raw features)")


# The one input of a signature over serialized tf.Examples (classify/regress: inputs;
# a canned export's predict: examples).
EXAMPLE_INPUTS = ("inputs", "examples")


def example_input(signature):
    """The input name of a signature taking one batch of serialized tf.Examples, else None."""
    specs = input_specs(signature)
    if len(specs) != 1:
        return None
    (name, spec), = specs.items()
    return name if name in EXAMPLE_INPUTS and spec.dtype == tf.string and \
        spec.shape.rank == 1 else None


def serialized(features: Dict[str, np.ndarray]) -> np.ndarray:
    """Each example of the features as a serialized tf.Example (float, int64, bytes lists)."""
    n = len(next(iter(features.values())))
    rows = []
    for i in range(n):
        example = tf.train.Example()
        for name, values in features.items():
            value = np.ravel(values[i])
            feature = example.features.feature[name]
            if value.dtype.kind in "SOU":
                feature.bytes_list.value.extend(
                    v if isinstance(v, bytes) else str(v).encode() for v in value)
            elif value.dtype.kind in "biu":
                feature.int64_list.value.extend(int(v) for v in value)
            else:
                feature.float_list.value.extend(float(v) for v in value)
        rows.append(example.SerializeToString())
    return np.array(rows, dtype=object)


def raw_specs(loaded, signature, name: str, path: str):
    """The raw feature specs to read --input with: the signature's own, or for a signature
    over serialized tf.Examples the export's raw-feature signature's (the rows are then
    serialized to tf.Examples)."""
    if example_input(signature) is None:
        return input_specs(signature)
    for raw in (canned.PREDICT_RAW, SIGNATURE):
        if raw in loaded.signatures and example_input(loaded.signatures[raw]) is None:
            return input_specs(loaded.signatures[raw])
    raise UserError(f"--signature {name}: takes serialized tf.Examples, and SavedModel {path} "
                    f"has no signature over raw features to read --input's columns by; give "
                    f"a signature over raw features")


def input_specs(signature) -> Dict[str, tf.TensorSpec]:
    return dict(signature.structured_input_signature[1])
