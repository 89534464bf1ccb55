"""Run a SavedModel's serving_default signature on a CSV or .npy file, or on image files
(image_input.py); results as a DataFrame, one row per input row or image, in input order."""
import os
import re
from typing import Dict

import numpy as np
import pandas as pd
import tensorflow as tf

from estimator_dist.serving import csv_rows
from estimator_dist.serving import image_input
from estimator_dist.serving import vocabulary
from estimator_dist.serving.signatures import (  # noqa: F401 - predict.X for callers
    SIGNATURE, example_input, input_specs, load_signature, model_dir_of, raw_specs, serialized)
from estimator_dist.serving import export as export_lib
from estimator_dist import errors
from estimator_dist import files
from estimator_dist.errors import UserError

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


def _feature_shape(spec):
    """The shape of one example; a dimension the signature leaves open is None."""
    return [None if d is None else int(d) for d in spec.shape[1:]]


def _size(shape) -> int:
    """Values per example; -1 when a dimension is open (the count is not fixed)."""
    return -1 if None in shape else int(np.prod(shape, dtype=np.int64))


def _fits(shape, expected) -> bool:
    return len(shape) == len(expected) and all(e is None or s == e
                                               for s, e in zip(shape, expected))


def _shape_text(shape) -> str:
    return ", ".join("?" if d is None else str(d) for d in shape)


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
    size = _size(shape)
    flat = array.ndim == 2 and size >= 0 and array.shape[1] == size  # one example per row
    if not _fits(list(array.shape[1:]), shape) and not flat:
        raise UserError(f"--input {path}: array of shape {list(array.shape)} does not fit feature "
                        f"'{name}' of shape [N, {_shape_text(shape)}]"
                        + (f" (or [N, {size}], one flattened example per row)" if size >= 0 else ""))
    if array.dtype.kind not in "biuf":
        raise UserError(f"--input {path}: array of dtype {array.dtype}; feature '{name}' takes "
                        f"{spec.dtype.name} numbers (save a real-valued array)")
    if array.shape[0] == 0:
        raise UserError(f"--input {path}: array of shape {list(array.shape)} holds no examples; "
                        f"give at least one")
    values = _cast(array, spec.dtype.as_numpy_dtype,
                   lambda index, value: f"--input {path}: feature '{name}': value {value} at "
                                        f"index {index}")
    if not _fits(list(values.shape[1:]), shape):  # [N, prod(shape)]: the shape is all known
        values = values.reshape([len(values)] + shape)
    return {name: values}


def _cast(array, dtype, where) -> np.ndarray:
    """`array` as `dtype`; a NaN/Inf, a number beyond that dtype's range, or a fraction for an
    integer feature is refused (a cast would change it silently). where(index, value): how the
    message names the bad value (an index of a .npy, a line and column of a CSV)."""
    dtype = np.dtype(dtype)
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array)
        if bad.any():
            index = _index(bad)
            raise UserError(f"{where(index, array[index])} is not a finite number; fix or drop "
                            f"that example (values are not imputed)")
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            cast = array.astype(dtype)
        bad = ~np.isfinite(cast)
        if bad.any():
            index = _index(bad)
            raise UserError(f"{where(index, array[index])} is beyond the range of {dtype.name}, "
                            f"the model's feature type; fix the value")
        return cast
    if dtype.kind in "iu" and array.dtype.kind in "fiu":
        info = np.iinfo(dtype)
        bad = (array < info.min) | (array > info.max)
        if array.dtype.kind == "f":
            bad |= array != np.floor(array)
        if bad.any():
            index = _index(bad)
            raise UserError(f"{where(index, array[index])} is not a {dtype.name} (the model's "
                            f"feature type: whole numbers {info.min}..{info.max}); fix the value")
    return array.astype(dtype)


def _index(mask: np.ndarray):
    """The first True position of `mask`, as a tuple of ints."""
    return tuple(int(i) for i in np.argwhere(mask)[0])


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
    return _cast(values, dtype, lambda index, value: f"--input {path} line {lines[index[0]]} "
                                                     f"column '{column}': {cells[index[0]]!r}")


def _overflows(text: str) -> bool:
    """True for a number too large for float64 ('1e400'), which pandas reads as not a number."""
    try:
        return np.isinf(float(text))
    except ValueError:
        return False


def read_csv(path: str, specs, id_column: str = "", columns=None) -> Dict[str, np.ndarray]:
    """The features of a CSV read as training reads one (csv_rows.py): string features keep
    their cells ("" included) without surrounding spaces, as numeric cells are read; numeric
    ones refuse missing, non-numeric, infinite cells.
    id_column: a column that is no feature (read_ids passes it through).
    columns: the column names of a CSV without a header line (--columns)."""
    header, cells, lines = _csv_cells(path, columns)
    if id_column:
        keep = [j for j, column in enumerate(header) if j != _id_index(header, id_column, path)]
        header, cells = [header[j] for j in keep], cells[:, keep]
    return _features(path, header, cells, lines, specs, named=bool(columns))


def read_ids(path: str, id_column: str, columns=None) -> np.ndarray:
    """--id_column's cells, in row order, as written."""
    header, cells, _ = _csv_cells(path, columns)
    return cells[:, _id_index(header, id_column, path)]


def _csv_cells(path: str, columns=None):
    header, rows, lines = csv_rows.read_rows(path, f"--input {path}", columns)
    return header, np.array(rows, dtype=object).reshape(len(rows), len(header)), lines


def _id_index(header, id_column: str, path: str) -> int:
    if id_column not in header:
        raise UserError(f"--id_column {id_column}: no such column in --input {path}; it has "
                        f"{', '.join(header)}")
    return header.index(id_column)


def _features(path, header, cells, lines, specs, named=False) -> Dict[str, np.ndarray]:
    """named: the column names came from --columns (a missing one is no header problem)."""
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
                            f"{', '.join(specs)}; the file has {', '.join(header)}"
                            f"{'' if named else NO_HEADER_FIX}")
        if len(matches) > 1:
            raise UserError(f"--input {path}: columns {', '.join(repr(header[j]) for j in matches)} "
                            f"all match feature '{name}'; rename or remove all but one")
        column, shape = cells[:, matches[0]], _feature_shape(spec)
        if _size(shape) != 1:  # a cell holds one value; TensorFlow aborted on [N] for [N, 8, 8, 1]
            raise UserError(_one_column_error(path, header[matches[0]], name, shape, len(specs)))
        if spec.dtype == tf.string:
            values = np.array([cell.strip() for cell in column], dtype=object)
        else:
            values = _numeric(column, header[matches[0]], lines, path, spec.dtype.as_numpy_dtype)
        features[name] = values.reshape([len(values)] + shape)
    return features


NO_HEADER_FIX = ("; a file without a header line: give --no_header --columns NAME,... (its "
                 "column names, in order)")


def _one_column_error(path, column, name, shape, n_features) -> str:
    size = _size(shape)
    needs = f"{size} values" if size >= 0 else "a varying number of values"
    fix = (f"give a wide CSV with one column per value ({size} columns, none named '{name}') or "
           f"a .npy array of shape [N, {_shape_text(shape)}]" if n_features == 1 and size > 0
           else "predict reads such a feature only from a wide CSV or a .npy, and those feed a "
                "model with a single feature")
    return (f"--input {path}: column '{column}' gives one value per row, but feature '{name}' "
            f"has shape [{_shape_text(shape)}] ({needs} per example); {fix}")


def read_npy_like(values, name, spec, path):
    shape = _feature_shape(spec)
    if values.shape[1] != _size(shape):
        raise UserError(f"--input {path}: {values.shape[1]} columns, but feature '{name}' needs "
                        f"{_size(shape)} values per row (shape {shape})")
    return {name: values.reshape([-1] + shape).astype(spec.dtype.as_numpy_dtype)}


def read_inputs(path: str, specs, id_column: str = "", columns=None) -> Dict[str, np.ndarray]:
    if os.path.isdir(path):
        raise UserError(f"--input {path}: is a directory; give the .csv or .npy file itself")
    if not os.path.isfile(path):
        raise UserError(f"--input {path}: no such file")
    if path.endswith(".npy"):
        if id_column:
            raise UserError(f"--id_column {id_column}: a .npy --input has no columns; give a "
                            f".csv, or leave --id_column out (rows stay in input order)")
        if columns:
            raise UserError("--columns: a .npy --input has no columns; give a .csv, or leave "
                            "--no_header and --columns out")
        features = read_npy(path, specs)
    elif path.endswith(".csv") or columns:  # --no_header: UCI's adult.data, adult.test
        features = read_csv(path, specs, id_column, columns)
    else:
        raise UserError(f"--input {path}: unsupported file type; give a .csv or .npy file (or "
                        f"--no_header --columns for a CSV by another name)")
    check_features(features, specs, path)
    return features


def check_features(features: Dict[str, np.ndarray], specs, path: str):
    """Every feature [N] + its shape, the same N > 0 for all: TensorFlow may abort the process
    (a failed Check, not an exception) on a tensor of another rank."""
    counts = {len(v) for v in features.values()}
    for name, spec in specs.items():
        shape = list(features[name].shape)
        if not _fits(shape[1:], _feature_shape(spec)):
            raise UserError(f"--input {path}: feature '{name}' was read as shape {shape}, but the "
                            f"model takes [N, {_shape_text(_feature_shape(spec))}]")
    if counts == {0}:
        raise UserError(f"--input {path}: holds no examples; give at least one")
    if len(counts) > 1:
        raise UserError(f"--input {path}: the features have different example counts "
                        f"({', '.join(f'{k}: {len(v)}' for k, v in features.items())})")


def run(signature, features: Dict[str, np.ndarray], batch_size: int) -> Dict[str, np.ndarray]:
    return run_batches(signature, slices(features, batch_size))


def slices(features: Dict[str, np.ndarray], batch_size: int):
    """The features batch_size examples at a time, in order."""
    n = len(next(iter(features.values())))
    return ({k: v[start:start + batch_size] for k, v in features.items()}
            for start in range(0, n, batch_size))


def run_batches(signature, batches) -> Dict[str, np.ndarray]:
    """The signature's outputs for every batch ({feature: array}), concatenated in order."""
    chunks = []
    for batch in batches:
        outputs = signature(**{k: tf.constant(v) for k, v in batch.items()})
        chunks.append({k: t.numpy() for k, t in outputs.items()})
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]} if chunks else {}


def check_output_path(path: str, input_path: str = ""):
    """Refuse a --output that cannot be written, or that is the --input file (the input was
    replaced by its predictions), before the model runs."""
    files.check_output_file("--output", path, "predictions.csv")
    if input_path and os.path.exists(path) and os.path.exists(input_path) and \
            os.path.samefile(path, input_path):
        raise UserError(f"--output {path}: is the --input file, which it would replace; give "
                        f"another path")


def _text(values: np.ndarray):
    """String outputs as text (pandas wrote bytes as "b'0'"); other values as they are."""
    if values.dtype.kind in "SO":
        return [v.decode() if isinstance(v, bytes) else v for v in values]
    return values


def to_frame(outputs: Dict[str, np.ndarray]) -> pd.DataFrame:
    columns = {}
    for name in sorted(outputs):
        values = outputs[name]
        if values.ndim == 1:
            columns[name] = _text(values)
        else:
            flat = values.reshape(len(values), -1)
            for i in range(flat.shape[1]):
                columns[f"{name}_{i}"] = _text(flat[:, i])
    return pd.DataFrame(columns)


def csv_columns(args):
    """--no_header and --columns: the column names of a CSV without a header line, or None.
    Both or neither: a header-less file read without names lost its first row as a header,
    and names given for a file with a header would read that header as data."""
    if args.columns and not args.no_header:
        raise UserError(f"--columns {args.columns}: names the columns of a CSV without a header "
                        f"line; add --no_header (or drop --columns to read the header)")
    if args.no_header and not args.columns:
        raise UserError("--no_header: name the file's columns in order, e.g. --columns "
                        "age,workclass,education (a column that is no feature is ignored)")
    if not args.columns:
        return None
    return [name.strip() for name in args.columns.split(",")]


def predict_file(saved_model: str, input_path: str, batch_size: int = 256,
                 id_column: str = "", columns=None, say=None,
                 signature_name: str = "") -> pd.DataFrame:
    """Predictions for every row of input_path, in input order; id_column (a CSV column that
    is no feature) passed through as the first column. A classifier exported with label
    strings gives them as `classes`.

    columns: the column names of a CSV without a header line. say(line): told when string
    values are outside a vocabulary the export knows (vocabulary.py). signature_name: the
    signature to run (load_signature's default otherwise); one over serialized tf.Examples
    is fed the rows as tf.Examples."""
    if batch_size <= 0:
        raise UserError(f"--batch_size {batch_size}: must be > 0")
    path = find_saved_model(saved_model)
    loaded, signature = load_signature(path, signature_name)
    images = image_input.is_image_input(input_path)
    if images:  # JPEG/PNG files or a folder: prepared as the model's input prepared its images
        if id_column:
            raise UserError(f"--id_column {id_column}: image files have no columns; the first "
                            f"output column names each file")
        names, batches = image_input.image_batches(path, model_dir_of(path),
                                                   input_specs(signature), input_path,
                                                   batch_size)
    else:
        features = read_inputs(input_path, raw_specs(loaded, signature, signature_name, path),
                               id_column, columns)
        for note in vocabulary.outside_notes(features, vocabulary.known_vocabularies(path),
                                             input_path):
            (say or print)(note)
        examples = example_input(signature)
        if examples:
            features = {examples: serialized(features)}
        batches = slices(features, batch_size)
    try:
        outputs = run_batches(signature, batches)
    except tf.errors.OpError as e:
        raise UserError(f"SavedModel {path} failed on --input {input_path}: {errors.op_error_line(e)}; if its "
                        f"graph does not match its variables, re-export it with estimator-dist "
                        f"export --model_dir {model_dir_of(path)}") from None
    frame = to_frame(outputs)
    if images:
        frame.insert(0, image_input.FILE_COLUMN, names)
    if id_column:
        frame.insert(0, id_column, read_ids(input_path, id_column, columns))
    return frame
