"""Run a SavedModel's serving_default signature on a CSV or .npy file; results as a DataFrame."""
import os
import re
from typing import Dict

import numpy as np
import pandas as pd
import tensorflow as tf

from estimator_dist import csv_rows
from estimator_dist import export as export_lib
from estimator_dist.errors import UserError

SIGNATURE = "serving_default"


def sanitize(name: str) -> str:
    """Column header -> signature key form (what the built-in inputs export)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", str(name).strip())


def find_saved_model(path: str) -> str:
    """A SavedModel dir as given, or the newest export under a model_dir."""
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    exports = export_lib.export_paths(path) if os.path.isdir(path) else []
    if not exports:
        raise UserError(f"--saved_model {path}: no saved_model.pb there or under {path}/export; "
                        f"export one first (estimator-dist export --model_dir DIR)")
    return max(exports, key=os.path.basename)


def load_signature(path: str):
    loaded = tf.saved_model.load(path)
    if SIGNATURE not in loaded.signatures:
        raise UserError(f"SavedModel {path} has no '{SIGNATURE}' signature; it has "
                        f"{', '.join(loaded.signatures) or 'none'}")
    return loaded, loaded.signatures[SIGNATURE]


def input_specs(signature) -> Dict[str, tf.TensorSpec]:
    return dict(signature.structured_input_signature[1])


def _feature_shape(spec):
    return [int(d) for d in spec.shape[1:]]


def read_npy(path: str, specs) -> Dict[str, np.ndarray]:
    if len(specs) != 1:
        raise UserError(f"--input {path}: a .npy file feeds one feature, but the model takes "
                        f"{len(specs)} ({', '.join(specs)}); use a CSV with those columns")
    (name, spec), = specs.items()
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise UserError(f"--input {path}: not a readable .npy array ({e})") from None
    shape = _feature_shape(spec)
    flat = array.ndim == 2 and array.shape[1] == int(np.prod(shape))  # one example per row
    if list(array.shape[1:]) != shape and not flat:
        raise UserError(f"--input {path}: array of shape {list(array.shape)} does not fit feature "
                        f"'{name}' of shape [N, {', '.join(map(str, shape))}] (or [N, "
                        f"{int(np.prod(shape))}], one flattened example per row)")
    if array.dtype.kind not in "biuf":
        raise UserError(f"--input {path}: array of dtype {array.dtype}; feature '{name}' takes "
                        f"{spec.dtype.name} numbers (save a real-valued array)")
    return {name: array.reshape([-1] + shape).astype(spec.dtype.as_numpy_dtype)}


def _numeric(cells, column, lines, path, dtype):
    """One column's cells as `dtype`; a missing, non-numeric or infinite cell is refused, and
    so is a number beyond a float dtype's range (1e300 would reach a float32 model as inf)."""
    text = pd.Series(cells, dtype=object).str.strip()
    missing = csv_rows.missing(cells)
    values = pd.to_numeric(text.where(~missing), errors="coerce").to_numpy(np.float64)
    bad = missing | ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        where = f"--input {path} line {lines[row]} column '{column}'"
        if missing[row]:
            raise UserError(f"{where}: missing value {cells[row]!r} (every numeric feature needs a "
                            f"number; missing values are not imputed)")
        if np.isnan(values[row]) and not _overflows(text.iloc[row]):
            raise UserError(f"{where}: {cells[row]!r} is not a number")
        raise UserError(f"{where}: {cells[row]!r} is not a finite number; fix the value")
    if np.issubdtype(dtype, np.floating):
        with np.errstate(over="ignore"):
            cast = values.astype(dtype)
        if not np.isfinite(cast).all():
            row = int(np.argmax(~np.isfinite(cast)))
            raise UserError(f"--input {path} line {lines[row]} column '{column}': {cells[row]!r} is "
                            f"beyond the range of {np.dtype(dtype).name}, the model's feature "
                            f"type; fix the value")
        return cast
    return values.astype(dtype)


def _overflows(text: str) -> bool:
    """True for a number too large for float64 ('1e400'), which pandas reads as not a number."""
    try:
        return np.isinf(float(text))
    except ValueError:
        return False


def read_csv(path: str, specs) -> Dict[str, np.ndarray]:
    """The features of a CSV read as training reads one (csv_rows.py): string features keep
    their raw cells ("" included), numeric ones refuse missing, non-numeric, infinite cells."""
    header, rows, lines = csv_rows.read_rows(path, f"--input {path}")
    cells = np.array(rows, dtype=object).reshape(len(rows), len(header))
    by_key: Dict[str, list] = {}
    for j, column in enumerate(header):
        by_key.setdefault(sanitize(column), []).append(j)
    if len(specs) == 1:
        (name, spec), = specs.items()
        shape = _feature_shape(spec)
        if shape and name not in by_key:  # a wide CSV: every column is one value of the feature
            dtype = spec.dtype.as_numpy_dtype
            values = np.stack([_numeric(cells[:, j], c, lines, path, dtype)
                               for j, c in enumerate(header)], axis=1)
            return read_npy_like(values, name, spec, path)
    features = {}
    for name, spec in specs.items():
        matches = by_key.get(sanitize(name), [])
        if not matches:
            raise UserError(f"--input {path}: no column for feature '{name}'; the model takes "
                            f"{', '.join(specs)}; the file has {', '.join(header)}")
        if len(matches) > 1:
            raise UserError(f"--input {path}: columns {', '.join(repr(header[j]) for j in matches)} "
                            f"all match feature '{name}'; rename or remove all but one")
        column = cells[:, matches[0]]
        if spec.dtype == tf.string:
            features[name] = column.astype(object)
        else:
            features[name] = _numeric(column, header[matches[0]], lines, path,
                                      spec.dtype.as_numpy_dtype)
    return features


def read_npy_like(values, name, spec, path):
    shape = _feature_shape(spec)
    if values.shape[1] != int(np.prod(shape)):
        raise UserError(f"--input {path}: {values.shape[1]} columns, but feature '{name}' needs "
                        f"{int(np.prod(shape))} values per row (shape {shape})")
    return {name: values.reshape([-1] + shape).astype(spec.dtype.as_numpy_dtype)}


def read_inputs(path: str, specs) -> Dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise UserError(f"--input {path}: no such file")
    if path.endswith(".npy"):
        return read_npy(path, specs)
    if path.endswith(".csv"):
        return read_csv(path, specs)
    raise UserError(f"--input {path}: unsupported file type; give a .csv or .npy file")


def run(signature, features: Dict[str, np.ndarray], batch_size: int) -> Dict[str, np.ndarray]:
    n = len(next(iter(features.values())))
    chunks = []
    for start in range(0, n, batch_size):
        batch = {k: tf.constant(v[start:start + batch_size]) for k, v in features.items()}
        chunks.append({k: t.numpy() for k, t in signature(**batch).items()})
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]} if chunks else {}


def to_frame(outputs: Dict[str, np.ndarray]) -> pd.DataFrame:
    columns = {}
    for name in sorted(outputs):
        values = outputs[name]
        if values.ndim == 1:
            columns[name] = [v.decode() if isinstance(v, bytes) else v for v in values]
        else:
            flat = values.reshape(len(values), -1)
            for i in range(flat.shape[1]):
                columns[f"{name}_{i}"] = flat[:, i]
    return pd.DataFrame(columns)


def predict_file(saved_model: str, input_path: str, batch_size: int = 256) -> pd.DataFrame:
    """Predictions for every row of input_path, in input order."""
    if batch_size <= 0:
        raise UserError(f"--batch_size {batch_size}: must be > 0")
    path = find_saved_model(saved_model)
    _, signature = load_signature(path)
    features = read_inputs(input_path, input_specs(signature))
    return to_frame(run(signature, features, batch_size))
