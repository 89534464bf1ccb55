"""Any CSV (default: scikit-learn's breast cancer) as numeric and categorical features.

`prepare()` reads the data once, infers column types, the task and the label
vocabulary, and fixes a train/eval split; its JSON-serializable result is all the
`tabular` model_fn needs, so export works later without the data. The input_fn
re-reads the data the same way (cached per file) and feeds raw values: scaling
and vocabulary lookup happen inside the model graph, so a SavedModel takes the
same raw values a CSV holds.
"""
import math
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import pandas as pd
import tensorflow as tf

from estimator_dist.serving import csv_rows
from estimator_dist.serving.csv_rows import MISSING
from estimator_dist.errors import UserError
from estimator_dist.training import position
from estimator_dist.training.registry import register_input
from input_fns.batch_limit import check_training_batch

DEFAULT_LABEL = "target"
TASKS = ("auto", "classification", "regression")
MAX_AUTO_CLASSES = 20  # an integer label with more distinct values is a regression target
MAX_VOCABULARY = 1000  # most frequent train values per categorical column; the rest are OOV
ONE_HOT_MAX = 16  # vocabulary + OOV bucket up to this size: one-hot, above it: an embedding
MAX_EMBEDDING_DIM = 16
SPLIT_SEED = 0  # fixed, never params["seed"]: the eval rows must not change between runs
SYNTHETIC_ROWS = 400


@dataclass(frozen=True)
class Table:
    """Parsed data: per-column arrays (float64 numeric, object str categorical)."""

    source: str  # the file path, or a name for built-in data
    columns: List[str]
    values: Dict[str, np.ndarray]
    kinds: Dict[str, str]  # column -> "numeric" | "categorical"
    lines: Optional[np.ndarray]  # file line of each row (None for built-in data)

    def where(self, row: int) -> str:
        if self.lines is None:
            return f"{self.source} row {row + 1}"
        return f"{self.source} line {int(self.lines[row])}"


_CACHE: Dict[tuple, Table] = {}


def _builtin_table(synthetic: bool) -> Table:
    if synthetic:
        rng = np.random.RandomState(0)
        x = rng.randn(SYNTHETIC_ROWS, 4)
        y = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] + 0.3 * rng.randn(SYNTHETIC_ROWS) > 0)
        frame = pd.DataFrame(x, columns=[f"x{i}" for i in range(4)])
        frame[DEFAULT_LABEL] = y.astype(np.int64)
        source = "synthetic"
    else:
        from sklearn.datasets import load_breast_cancer

        frame = load_breast_cancer(as_frame=True).frame
        source = "sklearn breast_cancer"
    columns = [str(c) for c in frame.columns]
    values = {c: frame[c].to_numpy(np.float64) for c in columns}
    return Table(source, columns, values, {c: "numeric" for c in columns}, None)


def _resolve_path(params) -> str:
    path = str(params["data_path"])
    if os.path.exists(path) or os.path.isabs(path) or not params.get("data_dir"):
        tried = [path]
    else:
        tried = [path, os.path.join(str(params["data_dir"]), path)]
    for candidate in tried:
        if os.path.isfile(candidate):
            return candidate
        if os.path.isdir(candidate):
            raise UserError(f"data_path '{candidate}' is a directory; give the CSV file itself")
    raise UserError(f"data file not found: {' or '.join(repr(t) for t in tried)}; fix --data_path PATH "
                    f"(leave it empty for the built-in breast cancer data)")


def _typed_column(path, name, cells: pd.Series, lines):
    """(kind, values): numeric when the column's values are numbers, else categorical."""
    missing = cells.str.strip().str.lower().isin(MISSING).to_numpy()
    numbers = pd.to_numeric(cells.where(~missing), errors="coerce").to_numpy(np.float64)
    text = np.isnan(numbers) & ~missing
    n_numbers = int((~np.isnan(numbers)).sum())
    n_text = int(text.sum())
    if n_numbers == 0 and n_text == 0:
        raise UserError(f"{path}: column '{name}' has no values; fill it in or remove the column")
    if n_numbers <= n_text:
        # Stripped as numeric cells are (and as predict strips them): raw UCI rows
        # ("47, Private, ...") otherwise split one class into " Private" and "Private".
        return "categorical", cells.str.strip().to_numpy(object)
    if n_text:
        i = int(np.argmax(text))
        raise UserError(f"{path} line {lines[i]}, column '{name}': text '{cells.iloc[i]}' in a numeric "
                        f"column ({n_numbers} of {len(cells)} values are numbers); fix the value "
                        f"(text is never coerced to a number)")
    if missing.any():
        i = int(np.argmax(missing))
        raise UserError(f"{path} line {lines[i]}, column '{name}': missing value '{cells.iloc[i]}' in a "
                        f"numeric column; fill it in or drop the row (missing values are not imputed)")
    if not np.isfinite(numbers).all():
        i = int(np.argmax(~np.isfinite(numbers)))
        raise UserError(f"{path} line {lines[i]}, column '{name}': '{cells.iloc[i]}' is not a finite "
                        f"number; fix the value")
    return "numeric", numbers


def _csv_table(path: str) -> Table:
    header, rows, lines = csv_rows.read_rows(path, path)
    frame = pd.DataFrame(rows, columns=header, dtype=object)
    kinds, values = {}, {}
    for name in header:
        kinds[name], values[name] = _typed_column(path, name, frame[name], lines)
    return Table(path, list(header), values, kinds, lines)


def load_table(params) -> Table:
    """The parsed data named by params (synthetic, data_path, or breast cancer); cached per file."""
    if params.get("synthetic") or not params.get("data_path"):
        key = ("builtin", bool(params.get("synthetic")))
        if key not in _CACHE:
            _CACHE[key] = _builtin_table(bool(params.get("synthetic")))
        return _CACHE[key]
    path = _resolve_path(params)
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_mtime_ns, stat.st_size)
    if key not in _CACHE:
        _CACHE[key] = _csv_table(path)
    return _CACHE[key]


def sanitize_names(names: List[str]) -> Dict[str, str]:
    """column -> a unique feature name of [A-Za-z0-9_] starting with a letter, in column order."""
    out, used = {}, set()
    for name in names:
        base = re.sub(r"[^A-Za-z0-9_]", "_", name)
        if not base[:1].isalpha():
            base = "f_" + base
        candidate, k = base, 2
        while candidate in used:
            candidate, k = f"{base}_{k}", k + 1
        used.add(candidate)
        out[name] = candidate
    return out


def split_indices(n_rows: int, eval_fraction: float):
    """(train rows, eval rows), each in file order, from a permutation with a fixed seed."""
    n_eval = min(max(int(round(n_rows * eval_fraction)), 1), n_rows - 1)
    order = np.random.RandomState(SPLIT_SEED).permutation(n_rows)
    return np.sort(order[n_eval:]), np.sort(order[:n_eval])


def _label_key(value) -> str:
    """The vocabulary string of one label value: '3' for 3.0, the text itself for text."""
    if isinstance(value, str):
        return value
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def _validate_fraction(params) -> float:
    raw = params.get("eval_fraction", 0.2)
    try:
        fraction = float(raw)
    except (TypeError, ValueError):
        fraction = float("nan")
    if not 0.0 < fraction < 1.0:
        raise UserError(f"eval_fraction {raw!r} must be a number strictly between 0 and 1; "
                        f"fix it with --set eval_fraction=0.2")
    return fraction


def _label_column(params, table: Table) -> str:
    label = "" if params.get("synthetic") else params.get("label_column") or ""
    if not label:
        if params.get("data_path") and not params.get("synthetic"):
            raise UserError(f"label_column is required with data_path '{params['data_path']}'; "
                            f"columns: {', '.join(table.columns)}; set --label_column NAME")
        label = DEFAULT_LABEL
    if label not in table.values:
        raise UserError(f"label column '{label}' is not in {table.source}; columns: "
                        f"{', '.join(table.columns)}; fix --label_column NAME")
    return label


def _label_info(table: Table, label: str, requested: str) -> dict:
    values = table.values[label]
    if table.kinds[label] == "categorical":
        empty = np.asarray([not v.strip() for v in values])
        if empty.any():
            i = int(np.argmax(empty))
            raise UserError(f"{table.where(i)}, label column '{label}': missing label '{values[i]}'; "
                            f"fill it in or drop the row")
        if requested == "regression":
            i = int(np.argmax(pd.to_numeric(pd.Series(values), errors="coerce").isna().to_numpy()))
            raise UserError(f"task 'regression' needs a numeric label, but column '{label}' holds text "
                            f"('{values[i]}' at {table.where(i)}); use --set task=classification")
        task = "classification"
        vocabulary = sorted(set(values.tolist()))
    else:
        distinct = np.unique(values)
        integral = bool(np.all(distinct == np.round(distinct)))
        task = requested
        if task == "auto":
            task = "classification" if integral and len(distinct) <= MAX_AUTO_CLASSES else "regression"
        vocabulary = [_label_key(v) for v in distinct]  # np.unique sorts numerically
    if task == "regression":
        std = float(values.std())
        return {"task": task, "num_classes": None, "label_vocabulary": [],
                "label_mean": float(values.mean()), "label_std": std if std > 1e-12 else 1.0}
    if len(vocabulary) < 2:
        raise UserError(f"label column '{label}' has a single value ({vocabulary[0]!r}); classification "
                        f"needs at least 2 classes; pick another label_column")
    return {"task": task, "num_classes": len(vocabulary), "label_vocabulary": vocabulary,
            "label_mean": 0.0, "label_std": 1.0}


def _vocabulary(values: np.ndarray) -> List[str]:
    uniques, counts = np.unique(values.astype(str), return_counts=True)
    if len(uniques) > MAX_VOCABULARY:
        keep = sorted(zip(-counts, uniques))[:MAX_VOCABULARY]
        uniques = np.asarray([u for _, u in keep])
    return sorted(str(u) for u in uniques)


def embedding_dim(vocabulary_size: int) -> int:
    """0 (one-hot) for small vocabularies, else an embedding width; the +1 is the OOV bucket."""
    size = vocabulary_size + 1
    return 0 if size <= ONE_HOT_MAX else min(MAX_EMBEDDING_DIM, int(math.ceil(math.sqrt(size))))


def prepare(params) -> dict:
    """Read the data once: column types, vocabularies, scaling, task, split; JSON-serializable.

    Raises:
      UserError: the file is missing, empty, ragged or malformed, the label column is
        unknown or has missing values or a setting (task, eval_fraction) is invalid.
    """
    requested = params.get("task", "auto") or "auto"
    if requested not in TASKS:
        raise UserError(f"task '{requested}' is not one of {', '.join(TASKS)}; fix it with --set task=auto")
    fraction = _validate_fraction(params)
    table = load_table(params)
    label = _label_column(params, table)
    feature_columns = [c for c in table.columns if c != label]
    if not feature_columns:
        raise UserError(f"{table.source} has only the label column '{label}'; it needs feature columns too")
    n_rows = len(table.values[label])
    if n_rows < 2:
        raise UserError(f"{table.source} has {n_rows} data row; it needs at least 2 (train and eval)")
    train_rows, eval_rows = split_indices(n_rows, fraction)
    names = sanitize_names(feature_columns)
    info = {"columns": {}, "numeric_columns": [], "categorical_columns": [], "numeric_mean": {},
            "numeric_std": {}, "vocabularies": {}, "embedding_dims": {}, "serving_features": {}}
    for column in feature_columns:
        name = names[column]
        info["columns"][name] = column
        train_values = table.values[column][train_rows]
        if table.kinds[column] == "numeric":
            std = float(train_values.std())
            info["numeric_columns"].append(name)
            info["numeric_mean"][name] = float(train_values.mean())
            info["numeric_std"][name] = std if std > 1e-12 else 1.0
            info["serving_features"][name] = [[], "float32"]
        else:
            vocabulary = _vocabulary(train_values)
            info["categorical_columns"].append(name)
            info["vocabularies"][name] = vocabulary
            info["embedding_dims"][name] = embedding_dim(len(vocabulary))
            info["serving_features"][name] = [[], "string"]
    info.update(_label_info(table, label, requested))
    info.update({"label_column": label, "data_source": table.source,
                 "train_examples": int(len(train_rows)), "eval_examples": int(len(eval_rows))})
    return info


def load_split(params, mode):
    """(features {name: array}, labels) of the train split (TRAIN) or the eval split (else).

    Numeric features are float32, categorical ones str objects, exactly as `prepare`
    described them; labels are int32 class ids or float32 targets.
    """
    table = load_table(params)
    label = params["label_column"]
    n_rows = len(table.values[label]) if label in table.values else 0
    if n_rows != params["train_examples"] + params["eval_examples"]:
        raise UserError(f"{table.source} changed since it was prepared ({n_rows} rows, prepared "
                        f"{params['train_examples'] + params['eval_examples']}); run again to re-prepare")
    train_rows, eval_rows = split_indices(n_rows, _validate_fraction(params))
    rows = train_rows if mode == tf.estimator.ModeKeys.TRAIN else eval_rows
    features = {}
    for name, column in params["columns"].items():
        kind = "numeric" if name in params["numeric_columns"] else "categorical"
        if table.kinds.get(column) != kind:
            raise UserError(f"{table.source} changed since it was prepared (column '{column}' is no "
                            f"longer {kind}); run again to re-prepare")
        values = table.values[column][rows]
        features[name] = values.astype(np.float32) if kind == "numeric" else values.astype(str).astype(object)
    values = table.values[label][rows]
    if params["task"] == "regression":
        return features, values.astype(np.float32)
    ids = {key: i for i, key in enumerate(params["label_vocabulary"])}
    keys = [_label_key(v) for v in values]
    unknown = [k for k in keys if k not in ids]
    if unknown:
        raise UserError(f"{table.source} has label '{unknown[0]}' that was not there when it was "
                        f"prepared; run again to re-prepare")
    return features, np.asarray([ids[k] for k in keys], np.int32)


@register_input("tabular", prepare=prepare,
                data_flags=("data_dir", "data_path", "label_column", "synthetic"))
def tabular_input(mode, params, input_context=None):
    """Rows of a CSV as ({feature: value}, label); TRAIN: endless batches, the global batch of
    step k a function of (seed, k) (training/position.py), else one pass."""
    if "serving_features" not in params:
        params = {**params, **prepare(params)}
    features, labels = load_split(params, mode)
    if mode == tf.estimator.ModeKeys.TRAIN:
        check_training_batch("tabular", params, len(labels), input_context)
    if mode == tf.estimator.ModeKeys.TRAIN:  # exact data position: training/position.py
        return position.gathered(position.index_batches(len(labels), params, input_context),
                        features, labels).prefetch(tf.data.AUTOTUNE)
    ds = tf.data.Dataset.from_tensor_slices((features, labels))
    if input_context is not None and input_context.num_input_pipelines > 1:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(params["batch_size"]).prefetch(tf.data.AUTOTUNE)
