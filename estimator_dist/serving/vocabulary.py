"""The vocabularies a SavedModel's lookup tables know, read from its graph, so `predict` can
say when a string cell is outside one (TensorFlow maps it to the out-of-vocabulary id or
bucket without a word: raw rows with surrounding spaces changed a prediction 0.96 -> 0.36).

Feature columns (canned estimators included) build each table under a `<key>_lookup` name
scope. `categorical_column_with_vocabulary_list` fills it from a string constant
(LookupTableImportV2); `categorical_column_with_vocabulary_file` from a text file the export
keeps in its assets/ (InitializeTableFromTextFileV2: the first vocab_size lines, each whole
or one delimited column of it). Both are read here. Hashed buckets and identity columns have
no list to compare against and are left alone.
"""
import os
import re
from typing import Dict, FrozenSet, List

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2  # no public reader

_TABLE_FILL_OPS = ("LookupTableImportV2", "LookupTableImport", "InitializeTableV2",
                   "InitializeTable")
_LOOKUP_SCOPE = re.compile(r"(?:^|/)([^/]+?)_lookup(?:_\d+)?/")
_FILE_FILL_OPS = ("InitializeTableFromTextFileV2", "InitializeTableFromTextFile")
_WHOLE_LINE = -2  # TextFileIndex.WHOLE_LINE; -1 (LINE_NUMBER) gives no string keys
_PASS_THROUGH_OPS = ("Identity", "Cast")


def _serving_graph(saved_model: str):
    """The serving meta graph's nodes and {asset tensor name: its file in assets/}."""
    with open(os.path.join(saved_model, "saved_model.pb"), "rb") as f:
        proto = saved_model_pb2.SavedModel.FromString(f.read())
    for meta_graph in proto.meta_graphs:
        if "serve" in meta_graph.meta_info_def.tags:
            return meta_graph.graph_def.node, _assets(saved_model, meta_graph)
    return [], {}


def _assets(saved_model: str, meta_graph) -> Dict[str, str]:
    """{asset tensor's op name: its file}: the meta graph's asset_file_def, or (TF1's
    Builder, Estimator's exports) the AssetFileDefs of its `saved_model_assets` collection,
    as TensorFlow's loader reads them."""
    defs = list(meta_graph.asset_file_def)
    for packed in meta_graph.collection_def["saved_model_assets"].any_list.value:
        asset = meta_graph_pb2.AssetFileDef()
        if packed.Unpack(asset):
            defs.append(asset)
    return {a.tensor_info.name.split(":")[0]: os.path.join(saved_model, "assets", a.filename)
            for a in defs}


def _file_keys(path: str, node) -> List[str]:
    """The keys a table filled from this vocabulary file holds, as TensorFlow reads them."""
    key_index = node.attr["key_index"].i
    if key_index != _WHOLE_LINE and key_index < 0:
        return []
    delimiter = node.attr["delimiter"].s.decode("utf-8", "replace") or "\t"
    size = node.attr["vocab_size"].i
    keys = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if 0 <= size <= len(keys):
                break
            line = line.rstrip("\r\n")
            if key_index == _WHOLE_LINE:
                keys.append(line)
            else:
                cells = line.split(delimiter)
                if key_index < len(cells):
                    keys.append(cells[key_index])
    return keys


def _string_constant(node) -> List[str]:
    tensor = tf.make_ndarray(node.attr["value"].tensor)
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            for v in np.ravel(tensor)]


def known_vocabularies(saved_model: str) -> Dict[str, FrozenSet[str]]:
    """{feature column key: the strings its lookup table knows} for every table filled from a
    string list or a vocabulary file; empty when there are none (or the graph cannot be read)."""
    try:
        nodes, assets = _serving_graph(saved_model)
        nodes = list(nodes)
    except (OSError, ValueError):
        return {}
    by_name = {node.name: node for node in nodes}
    found: Dict[str, set] = {}
    for node in nodes:
        scope = _LOOKUP_SCOPE.search(node.name)
        if node.op not in _TABLE_FILL_OPS + _FILE_FILL_OPS or len(node.input) < 2 or not scope:
            continue
        name = node.input[1].split(":")[0].lstrip("^")
        if node.op in _FILE_FILL_OPS:
            try:
                found.setdefault(scope.group(1), set()).update(_file_keys(assets[name], node))
            except (KeyError, OSError):  # not an asset of this export: nothing to compare
                pass
            continue
        keys = by_name.get(name)
        while keys is not None and keys.op in _PASS_THROUGH_OPS and keys.input:
            keys = by_name.get(keys.input[0].split(":")[0])
        if keys is None or keys.op != "Const" or \
                keys.attr["dtype"].type != tf.string.as_datatype_enum:
            continue
        found.setdefault(scope.group(1), set()).update(_string_constant(keys))
    return {name: frozenset(values) for name, values in found.items() if values}


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
