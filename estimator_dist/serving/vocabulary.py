"""The vocabularies a SavedModel's lookup tables know, read from its graph, so `predict` can
say when a string cell is outside one (TensorFlow maps it to the out-of-vocabulary id or
bucket without a word: raw rows with surrounding spaces changed a prediction 0.96 -> 0.36).

Feature columns (`categorical_column_with_vocabulary_list`, canned estimators included)
build each table under a `<key>_lookup` name scope and fill it from a string constant
(LookupTableImportV2); that is what is read here. Tables filled from a file, hashed
buckets and identity columns have no list to compare against and are left alone.
"""
import os
import re
from typing import Dict, FrozenSet, List

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2  # the SavedModel proto: no public reader

_TABLE_FILL_OPS = ("LookupTableImportV2", "LookupTableImport", "InitializeTableV2",
                   "InitializeTable")
_LOOKUP_SCOPE = re.compile(r"(?:^|/)([^/]+?)_lookup(?:_\d+)?/")
_PASS_THROUGH_OPS = ("Identity", "Cast")


def _graph_nodes(saved_model: str):
    with open(os.path.join(saved_model, "saved_model.pb"), "rb") as f:
        proto = saved_model_pb2.SavedModel.FromString(f.read())
    for meta_graph in proto.meta_graphs:
        if "serve" in meta_graph.meta_info_def.tags:
            return meta_graph.graph_def.node
    return []


def _string_constant(node) -> List[str]:
    tensor = tf.make_ndarray(node.attr["value"].tensor)
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            for v in np.ravel(tensor)]


def known_vocabularies(saved_model: str) -> Dict[str, FrozenSet[str]]:
    """{feature column key: the strings its lookup table knows} for every table filled from a
    string list; empty when there are none (or the graph cannot be read)."""
    try:
        nodes = list(_graph_nodes(saved_model))
    except (OSError, ValueError):
        return {}
    by_name = {node.name: node for node in nodes}
    found: Dict[str, set] = {}
    for node in nodes:
        if node.op not in _TABLE_FILL_OPS or len(node.input) < 2:
            continue
        keys = by_name.get(node.input[1].split(":")[0].lstrip("^"))
        while keys is not None and keys.op in _PASS_THROUGH_OPS and keys.input:
            keys = by_name.get(keys.input[0].split(":")[0])
        scope = _LOOKUP_SCOPE.search(node.name)
        if keys is None or keys.op != "Const" or scope is None or \
                keys.attr["dtype"].type != tf.string.as_datatype_enum:
            continue
        found.setdefault(scope.group(1), set()).update(_string_constant(keys))
    return {name: frozenset(values) for name, values in found.items()}


def outside_notes(features: Dict[str, np.ndarray], vocabularies: Dict[str, FrozenSet[str]],
                  path: str) -> List[str]:
    """One line per string feature with values outside the vocabulary the export knows."""
    notes = []
    for name, values in sorted(features.items()):
        known = vocabularies.get(name)
        if known is None or values.dtype.kind != "O":
            continue
        flat = [v.decode() if isinstance(v, bytes) else str(v) for v in values.reshape(-1)]
        outside = [i for i, v in enumerate(flat) if v not in known]
        if not outside:
            continue
        first = outside[0]
        sample = ", ".join(repr(v) for v in sorted(known)[:5])
        notes.append(f"--input {path}: feature '{name}': {len(outside)} of {len(flat)} values are "
                     f"outside the vocabulary the export knows (first {flat[first]!r}, "
                     f"example {first + 1}; "
                     f"it knows {len(known)}, e.g. {sample}); they are predicted as "
                     f"out-of-vocabulary")
    return notes
