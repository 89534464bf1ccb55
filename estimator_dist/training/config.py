"""Run configuration: strict YAML / flag / --set overrides onto the frozen dataclasses
(config_schema.py), and the checks of the result.

Precedence, lowest first: dataclass defaults, the model's registered
run_defaults, the YAML file (--config), command-line flags, then --set for hparams.
"""
import dataclasses
import difflib
import math
import os
from dataclasses import fields
from types import MappingProxyType
from typing import Any, Dict, Mapping, Tuple

import yaml

from estimator_dist import files
from estimator_dist.distribute import specs
from estimator_dist.errors import UserError
# The dataclasses and the config files have modules of their own; config_lib.X names them all.
from estimator_dist.config_schema import (  # noqa: F401 - re-exported
    MAX_READER_NICE, MAX_SEED, NO_READER_NICE, NO_SEED, SECTIONS, TOP_LEVEL, ComputeConfig,
    Config, DataConfig, DistributeConfig, TrainConfig, field_types, flag_names)
from estimator_dist.config_yaml import (  # noqa: F401 - re-exported
    CONFIG_FILE, load_saved, load_yaml, save, unreadable_saved)

EXPORT_MODES = ("latest", "best", "final", "none")
VARIABLE_DEVICES = ("auto", "cpu", "device0")
MIXED_PRECISION = ("none", "bfloat16", "float16")
GRADIENT_COMPRESSION = ("none", "fp16", "bf16")  # compression.SETTINGS
MAX_STEPS = 2**63 - 1  # the global step is an int64


def _unknown_key(key, valid, where):
    key = str(key)  # YAML keys may be numbers (`5: 6`)
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return UserError(f"the key '{key}' does not exist in {where}; valid keys: "
                     f"{', '.join(sorted(valid))}{hint}")


def check_type(key, value, expected, where):
    """Return value as `expected`, or raise naming key, value and the type wanted."""
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif expected is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif expected is str:
        if isinstance(value, str):
            return value
    elif isinstance(value, expected):
        return value
    raise UserError(f"{where}: '{key}' must be {expected.__name__}, got {value!r} "
                    f"({type(value).__name__})")


def parse_scalar(key, text, expected):
    """Parse a --set / flag string into the type of the default it overrides."""
    if expected is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
    elif expected is int:
        try:
            return int(text)
        except ValueError:
            pass
    elif expected is float:
        try:
            return float(text)
        except ValueError:
            pass
    elif expected is str:
        return text
    name = expected.__name__
    article = "an" if name[0] in "aeiou" else "a"
    raise UserError(f"--set {key}={text}: '{key}' takes {article} {name} "
                    f"(its default is of that type); fix the value")


def merge_sections(base: Dict[str, Dict[str, Any]], updates: Mapping[str, Any], where: str):
    """Apply nested updates {section: {key: value}} onto base, strictly."""
    for section, values in updates.items():
        if section not in SECTIONS:
            raise _unknown_key(section, list(SECTIONS), where)
        if not isinstance(values, Mapping):
            raise UserError(f"{where}: '{section}' must be a mapping, got {values!r}")
        types = field_types(SECTIONS[section])
        for key, value in values.items():
            if key not in types:
                raise _unknown_key(key, list(types), f"{where} section '{section}'")
            base[section][key] = check_type(key, value, types[key], f"{where} section '{section}'")


def resolve_hparams(defaults: Mapping[str, Any], from_file: Mapping[str, Any],
                    overrides: Tuple[str, ...], model: str) -> Dict[str, Any]:
    """Model defaults, then YAML hparams, then --set key=value; unknown keys fail."""
    hparams = dict(defaults)
    where = f"the hparams of model '{model}'"
    for key, value in (from_file or {}).items():
        if key not in defaults:
            raise _unknown_key(key, list(defaults), where)
        # A default of None says nothing about the type: any value may replace it.
        hparams[key] = value if defaults[key] is None else \
            check_type(key, value, type(defaults[key]), where)
    for item in overrides:
        if "=" not in item:
            raise UserError(f"--set '{item}' is not key=value; e.g. --set learning_rate=0.1")
        key, text = item.split("=", 1)
        key = key.strip()
        if key not in defaults:
            raise _unknown_key(key, list(defaults), where)
        hparams[key] = _yaml_scalar(text) if defaults[key] is None else \
            parse_scalar(key, text, type(defaults[key]))
    return hparams


def _yaml_scalar(text: str):
    """--set text for an hparam whose default is None: read as YAML would (3, 0.5, true, abc)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if value is None or isinstance(value, (bool, int, float, str)) else text


def build_config(model: str, file_data: Mapping[str, Any], flags: Mapping[str, Any],
                 run_defaults: Mapping[str, Any], hparam_defaults: Mapping[str, Any],
                 overrides: Tuple[str, ...] = (), imports: Tuple[str, ...] = ()) -> Config:
    """Combine every source into one frozen Config (see module docstring for order)."""
    check_top_level(file_data)
    sections = {name: dataclasses.asdict(cls()) for name, cls in SECTIONS.items()}
    section_of = flag_names()
    for key, value in run_defaults.items():
        if key not in section_of:
            raise _unknown_key(key, list(section_of), f"run_defaults of model '{model}'")
        sections[section_of[key]][key] = value
    merge_sections(sections, {k: v for k, v in file_data.items() if k in SECTIONS}, "config file")
    given_seed = flags.get("seed")
    if given_seed is not None and given_seed < 0:
        raise _seed_error(given_seed)
    given_nice = flags.get("reader_nice")
    if given_nice is not None and given_nice < 0:  # -1 would read as "not given"
        raise _reader_nice_error(given_nice)
    for key, value in flags.items():
        if value is not None:
            sections[section_of[key]][key] = value
    hparams = resolve_hparams(hparam_defaults, file_data.get("hparams") or {}, overrides, model)
    return Config(
        model=model,
        data=DataConfig(**sections["data"]),
        train=TrainConfig(**sections["train"]),
        distribute=DistributeConfig(**sections["distribute"]),
        compute=ComputeConfig(**sections["compute"]),
        hparams=MappingProxyType(hparams),
        imports=tuple(imports),
    )


def check_top_level(file_data: Mapping[str, Any], where="config file"):
    for key in file_data:
        if key not in TOP_LEVEL:
            raise _unknown_key(key, list(TOP_LEVEL), where)
    model = file_data.get("model")
    if model is not None and not isinstance(model, str):
        raise UserError(f"{where}: 'model: {model!r}' must be a registered model's name, e.g. "
                        f"'model: digits'")
    imports = file_data.get("imports")
    if imports is not None and not (isinstance(imports, list) and
                                    all(isinstance(m, str) for m in imports)):
        raise UserError(f"{where}: 'imports: {imports!r}' must be a list of module names, e.g. "
                        f"'imports: [my_models]'")


def _reader_nice_error(nice) -> UserError:
    return UserError(f"--reader_nice {nice}: must be 0-{MAX_READER_NICE} (0 keeps the input "
                     f"pipeline at the training step's priority)")


def _seed_error(seed) -> UserError:
    return UserError(f"--seed {seed}: must be 0..{MAX_SEED} (TensorFlow's graph-seed range); "
                     f"leave it out for no seed")


def validate(config: Config):
    """Range checks that need no TensorFlow; raise UserError on the first problem."""
    t = config.train
    _validate_finite(config)
    positive = {"batch_size": t.batch_size, "train_steps": t.train_steps,
                "keep_checkpoint_max": t.keep_checkpoint_max}
    for key, value in positive.items():
        if value <= 0:
            raise UserError(f"--{key} {value}: must be > 0")
    for key in ("eval_steps", "eval_every", "save_checkpoints_steps"):
        if getattr(t, key) < 0:
            raise UserError(f"--{key} {getattr(t, key)}: must be >= 0 (0 means the default)")
    for key in ("train_steps", "eval_steps", "eval_every", "save_checkpoints_steps"):
        if getattr(t, key) > MAX_STEPS:
            raise UserError(f"--{key} {getattr(t, key)}: must be at most {MAX_STEPS} (the global "
                            f"step is an int64); give a smaller step count")
    if t.seed != NO_SEED and not 0 <= t.seed <= MAX_SEED:
        raise _seed_error(t.seed)
    if t.export not in EXPORT_MODES:
        raise UserError(f"--export {t.export}: must be one of {', '.join(EXPORT_MODES)}")
    if t.eval_every and t.save_checkpoints_steps and t.eval_every != t.save_checkpoints_steps:
        raise UserError(
            f"--eval_every {t.eval_every} and --save_checkpoints_steps {t.save_checkpoints_steps} "
            f"differ; Estimator evaluates after every checkpoint, so give one of them")
    _validate_workflow(t)
    _validate_paths(t)
    d = config.distribute
    if d.num_devices < 0:
        raise UserError(f"--num_devices {d.num_devices}: must be >= 0 (0 = auto)")
    if d.variable_device not in VARIABLE_DEVICES:
        raise UserError(f"--variable_device {d.variable_device}: must be "
                        f"{', '.join(VARIABLE_DEVICES[:-1])} or {VARIABLE_DEVICES[-1]}")
    if d.ps < 0:
        raise UserError(f"--ps {d.ps}: must be >= 0")
    if d.accumulate_steps < 1:
        raise UserError(f"--accumulate_steps {d.accumulate_steps}: must be >= 1 "
                        f"(1 = apply every batch)")
    nice = config.data.reader_nice
    if nice != NO_READER_NICE and not 0 <= nice <= MAX_READER_NICE:
        raise _reader_nice_error(nice)
    if d.gradient_compression not in GRADIENT_COMPRESSION:
        raise UserError(f"--gradient_compression {d.gradient_compression}: must be "
                        f"{', '.join(GRADIENT_COMPRESSION)}")
    if config.compute.mixed_precision not in MIXED_PRECISION:
        raise UserError(f"--mixed_precision {config.compute.mixed_precision}: must be "
                        f"{', '.join(MIXED_PRECISION[:-1])} or {MIXED_PRECISION[-1]}")
    _refuse_ignored(config)


def _validate_finite(config: Config):
    """Every float setting is finite: NaN fails both `< 0` and `>= 0`, so range checks pass it."""
    for section in SECTIONS:
        values = getattr(config, section)
        for f in fields(values):
            value = getattr(values, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise UserError(f"--{f.name} {value}: must be a finite number; give one such "
                                f"as {f.default}")


def _takes_variable_device(strategy: str) -> bool:
    return strategy in specs.SPECS and specs.SPECS[strategy].variable_device_flag


# Settings only another setting reads: (section, field, whether the config reads it,
# what reads it, the fix). Only a value other than the dataclass default can be told
# apart from "not given".
IGNORED_UNLESS = (
    ("distribute", "variable_device", lambda c: _takes_variable_device(c.distribute.strategy),
     "--strategy tower", "add --strategy tower"),
    ("train", "best_metric", lambda c: c.train.export == "best",
     "--export best", "add --export best"),
    ("train", "higher_is_better", lambda c: bool(c.train.early_stop) or c.train.export == "best",
     "--early_stop METRIC and --export best", "add one of them"),
    ("train", "patience", lambda c: bool(c.train.early_stop),
     "--early_stop METRIC", "add --early_stop (e.g. --early_stop loss)"),
    ("train", "min_delta", lambda c: bool(c.train.early_stop),
     "--early_stop METRIC", "add --early_stop (e.g. --early_stop loss)"),
    ("train", "warm_start_vars", lambda c: bool(c.train.warm_start_from),
     "--warm_start_from", "add --warm_start_from DIR_OR_CHECKPOINT"),
)


# Former defaults a saved config.yaml holds (every field is written): read as "not given".
FORMER_DEFAULTS = {"variable_device": ("cpu",)}  # the default before "auto"


def _ignored(config: Config):
    """(section, field, value, read by, fix) of each setting given that nothing reads."""
    for section, name, read, reader, fix in IGNORED_UNLESS:
        value = getattr(getattr(config, section), name)
        unset = (getattr(SECTIONS[section], name),) + FORMER_DEFAULTS.get(name, ())
        if value not in unset and not read(config):
            yield section, name, value, reader, fix


def _refuse_ignored(config: Config):
    """A setting that only another one reads would be accepted and silently ignored."""
    for _, name, value, reader, fix in _ignored(config):
        shown = f"--{name}" if value is True else f"--{name} {value}"
        raise UserError(f"{shown}: only {reader} {'read' if ' and ' in reader else 'reads'} it; "
                        f"{fix} or leave it out")


def without_ignored(config: Config) -> Config:
    """config with the settings nothing reads reset to their defaults (a run saved before
    they were refused, re-resolved for evaluate/export).

    reader_nice too: only training's reader threads read it, and a run saved before inputs
    without a reader refused it holds 19 there, which would now read as given.
    """
    for section, name, _, _, _ in list(_ignored(config)):
        part = dataclasses.replace(getattr(config, section),
                                   **{name: getattr(SECTIONS[section], name)})
        config = dataclasses.replace(config, **{section: part})
    return dataclasses.replace(
        config, data=dataclasses.replace(config.data, reader_nice=NO_READER_NICE))


# Metrics where larger is better even without --higher_is_better.
HIGHER_IS_BETTER = ("accuracy", "auc", "precision", "recall")


def higher_is_better(metric: str, flag: bool) -> bool:
    """Direction of a metric: --higher_is_better, or a known accuracy-like name."""
    return flag or metric in HIGHER_IS_BETTER


def _validate_workflow(t: "TrainConfig"):
    if t.eval_every_secs < 0:
        raise UserError(f"--eval_every_secs {t.eval_every_secs}: must be >= 0")
    if t.eval_every_secs and (t.eval_every or t.save_checkpoints_steps):
        raise UserError(f"--eval_every_secs {t.eval_every_secs} with --eval_every/"
                        f"--save_checkpoints_steps: evaluation follows checkpoints, so give "
                        f"steps or seconds, not both")
    if t.weights_check_steps < 0:
        raise UserError(f"--weights_check_steps {t.weights_check_steps}: must be >= 0 (0 turns "
                        f"the check off)")
    if t.patience < 1:
        raise UserError(f"--patience {t.patience}: must be >= 1 (evaluations without improvement)")
    if t.min_delta < 0:
        raise UserError(f"--min_delta {t.min_delta}: must be >= 0")
    if t.warm_start_from and not _elsewhere(t.warm_start_from) and \
            not os.path.exists(t.warm_start_from) and \
            not os.path.exists(t.warm_start_from + ".index"):
        raise UserError(f"--warm_start_from {t.warm_start_from}: no such checkpoint or directory")
    import re

    try:
        re.compile(t.warm_start_vars)
    except re.error as e:
        raise UserError(f"--warm_start_vars {t.warm_start_vars!r}: not a regular expression "
                        f"({e})") from None


def _elsewhere(path: str) -> bool:
    """A path still holding ~ or $VARS here is another machine's (a TFJob's pods expand it;
    every local command has expanded it, paths.py): not checked on this one."""
    return path.startswith("~") or "$" in path


def _validate_paths(t: "TrainConfig"):
    """--model_dir must be (or can become) a directory, --summary_json a file in one."""
    if t.model_dir and not _elsewhere(t.model_dir):
        blocker = _existing_ancestor(t.model_dir)
        if not os.path.isdir(blocker):
            raise UserError(f"--model_dir {t.model_dir}: {blocker} is a file, not a directory; "
                            f"give a directory path (it is created if missing)")
    if t.summary_json and not _elsewhere(t.summary_json):
        files.check_output_file("--summary_json", t.summary_json, "summary.json")


def _existing_ancestor(path: str) -> str:
    """`path` itself if it exists, else its nearest existing parent."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def checkpoint_every(config: Config) -> int:
    """Steps between checkpoints (and so between evaluations)."""
    t = config.train
    if t.eval_every_secs:
        return 0
    return t.eval_every or t.save_checkpoints_steps or max(1, min(500, t.train_steps))
