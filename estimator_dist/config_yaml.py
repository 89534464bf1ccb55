"""Config files: the strict YAML reader (--config, a model_dir's config.yaml) and the
config.yaml a run saves into its model_dir."""
import os
from typing import Any, Dict, Mapping, Optional

import yaml

from estimator_dist import files
from estimator_dist.errors import UserError
from estimator_dist.config_schema import TOP_LEVEL

CONFIG_FILE = "config.yaml"


class _DuplicateKey(yaml.YAMLError):
    pass


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # '<<: *base' then a key of its own is an override, not a duplicate
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = first_line.get(key)
                except TypeError:
                    continue  # unhashable: SafeLoader's own error follows
                line = key_node.start_mark.line + 1
                if seen is not None:
                    raise _DuplicateKey(f"line {line}: the key '{key}' is given twice (first on "
                                        f"line {seen}); YAML would keep only the last, so remove "
                                        f"one")
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str) -> Dict[str, Any]:
    """Read a config file; a malformed one is a UserError naming the file and line."""
    if os.path.isdir(path):
        raise UserError(f"config file '{path}' is a directory; give the YAML file itself")
    if not os.path.isfile(path):
        raise UserError(f"config file '{path}' does not exist; check the --config path")
    try:
        with open(path, encoding="utf-8") as f:
            loader = _StrictLoader(f)  # a SafeLoader: what yaml.safe_load does, stricter
            try:
                data = loader.get_single_data()
            finally:
                loader.dispose()
    except _DuplicateKey as e:
        raise UserError(f"config file '{path}' {e}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"config file '{path}' is not UTF-8 text (byte {e.start}); give a "
                        f"YAML file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"config file '{path}'{where}: not valid YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file '{path}' must hold a mapping of keys "
                        f"({', '.join(TOP_LEVEL)}), got {type(data).__name__}")
    return data


def save(config, model_dir: str, extra: Optional[Mapping[str, Any]] = None):
    """Write the resolved config (and extra resolved facts) into model_dir, atomically."""
    data = config.to_dict()
    if extra:
        data["resolved"] = dict(extra)
    path = os.path.join(model_dir, CONFIG_FILE)
    files.write_text(path, yaml.safe_dump(data, sort_keys=False))
    return path


def unreadable_saved(model_dir: str) -> Optional[str]:
    """Why model_dir's config.yaml is no run's config (unreadable, not YAML, no model named),
    or None (it is one, or there is none)."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.lexists(path):
        return None
    try:
        data = load_yaml(path)
    except (UserError, OSError) as e:
        return str(e)
    if not isinstance(data.get("model"), str):
        return f"config file '{path}' names no model"
    return None


def load_saved(model_dir: str) -> Dict[str, Any]:
    """The config a training run saved into model_dir."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise UserError(f"'{model_dir}' has no {CONFIG_FILE}; is it a model_dir written by "
                        f"'estimator-dist train'?")
    return load_yaml(path)
