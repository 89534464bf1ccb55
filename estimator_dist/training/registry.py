"""Name -> function registries for model_fns and input_fns.

Built-ins register by explicit imports in `model_fns/__init__.py` and
`input_fns/__init__.py`; users add their own with `--import my.module`.
"""
import difflib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from estimator_dist.training.config import NO_READER_NICE
from estimator_dist.errors import UserError

# Estimator passes these by name (estimator.py _verify_model_fn_args, _call_input_fn): a
# model_fn takes features and any subset of the rest (model_fn_wrap.estimator_call hands it
# only those); an input_fn any subset, and arguments of other names only with a default.
MODEL_FN_ARGS = ("features", "labels", "mode", "params", "config")
INPUT_FN_ARGS = ("mode", "params", "config", "input_context")
# Run settings an input may read (params of the same names), each with its value when the
# run does not set it; with data_flags declared at registration, a run that sets one the
# input does not read is refused. reader_nice: the input has reader threads that take it
# (reader_priority.py); 0 is a value given, unlike '' and False.
DATA_FLAGS = {"data_dir": "", "data_path": "", "label_column": "", "synthetic": False,
              "reader_nice": NO_READER_NICE}

# What the run itself puts into params beside the hparams (runner.Plan.params): an hparam
# of one of these names would be silently replaced.
RUN_PARAMS = ("batch_size", "global_batch_size", "num_replicas", "lr_scale", "train_steps",
              "seed", "gradient_compression", "start_step", "batch_slices",
              "batches_per_step") + tuple(DATA_FLAGS)
PLAIN_TYPES = (bool, int, float, str, type(None))


def snake_case(name: str) -> str:
    """CamelCase or mixed names -> snake_case, the default registry key."""
    s1 = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s1).lower()


@dataclass(frozen=True)
class Entry:
    """One registered function with what the runner needs to know about it."""

    name: str
    fn: Callable
    hparams: Mapping[str, Any] = field(default_factory=dict)
    default_input: Optional[str] = None
    run_defaults: Mapping[str, Any] = field(default_factory=dict)
    prepare: Optional[Callable] = None
    data_flags: Optional[Tuple[str, ...]] = None  # None: not declared, nothing checked
    # The serving input it names: {feature: [shape without batch, dtype]}, or a
    # serving_input_receiver_fn (check_serving_input); None: read off the input.
    serving_input: Any = None
    doc: str = ""


class Registry:
    """A named collection of functions; duplicates are errors, misses list the names."""

    def __init__(self, kind: str, allowed_args, required_args, others_with_default=False):
        self.kind = kind
        self._allowed = tuple(allowed_args)
        self._required = tuple(required_args)
        self._others_with_default = others_with_default
        self._entries: Dict[str, Entry] = {}

    def register(self, name=None, **meta):
        """Decorator: `@registry.register("name", hparams={...})`."""

        def decorator(fn):
            key = name or snake_case(fn.__name__)
            self._check_signature(key, fn)
            if key in self._entries:
                raise UserError(
                    f"{self.kind} '{key}' is already registered (by {self._entries[key].fn.__module__}); "
                    f"pick another name")
            doc = (inspect.getdoc(fn) or "").split("\n")[0]
            self._entries[key] = Entry(name=key, fn=fn, doc=doc, **meta)
            return fn

        return decorator

    def _check_signature(self, key, fn):
        if not callable(fn):
            raise UserError(f"{self.kind} '{key}' must be a function, got {type(fn).__name__}")
        parameters = inspect.signature(fn).parameters
        args = list(parameters)
        unknown = [a for a in args if a not in self._allowed and not (
            self._others_with_default and parameters[a].default is not inspect.Parameter.empty)]
        missing = [a for a in self._required if a not in args]
        if unknown or missing:
            others = ", others only with a default" if self._others_with_default else ""
            fix = (f"add {', '.join(missing)}" if missing else "") + \
                  ("; " if missing and unknown else "") + \
                  (f"rename or drop {', '.join(unknown)}" if unknown else "")
            raise UserError(
                f"{self.kind} '{key}' has arguments ({', '.join(args)}); allowed: "
                f"({', '.join(self._allowed)}){others}, required: "
                f"({', '.join(self._required) or 'none'}); {fix}")

    def get(self, key: str) -> Entry:
        """The entry for `key`, or a UserError listing what is registered."""
        if key in self._entries:
            return self._entries[key]
        names = sorted(self._entries)
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UserError(
            f"unknown {self.kind} '{key}'; registered: {', '.join(names) or 'none'}{hint} "
            f"(register your own with --import my.module)")

    def names(self):
        return sorted(self._entries)

    def __contains__(self, key):
        return key in self._entries

    def unregister(self, key: str):
        """Remove an entry (tests register throwaway functions)."""
        self._entries.pop(key, None)


MODELS = Registry("model", MODEL_FN_ARGS, ("features",))
INPUTS = Registry("input", INPUT_FN_ARGS, (), others_with_default=True)


def check_serving_input(kind: str, name, serving_input):
    """serving_input at registration: None, {feature: [shape without batch, dtype]} or a
    function returning a tf.estimator.export.ServingInputReceiver."""
    if serving_input is None or callable(serving_input):
        return
    from estimator_dist.serving import serving_features  # TensorFlow: imported only when used

    serving_features.check_serving_features(serving_input, f"{kind} '{name}': serving_input")


def register_model(name=None, hparams=None, default_input=None, run_defaults=None,
                   serving_input=None):
    """Register an Estimator model_fn: `features` and any of `labels, mode, params, config`.

    A model_fn without `params` builds its train op with `estimator_dist.minimize(loss)`,
    which reads the run's params.

    Args:
      name: registry key; defaults to the function's snake_case name.
      hparams: default hyperparameters; `--set key=value` may override only these keys.
      default_input: the registered input used when `--input` is not given.
      run_defaults: this model's defaults for run settings such as batch_size and
        train_steps; a config file or flag still wins.
      serving_input: what its SavedModels take, when not what the input yields:
        {feature: [shape without batch, dtype]} (e.g. {"image": [[28, 28], "float32"]}) or
        a serving_input_receiver_fn. It wins over the input's.
    """
    hparams = dict(hparams or {})
    register = MODELS.register(name, hparams=hparams, default_input=default_input,
                               run_defaults=dict(run_defaults or {}),
                               serving_input=serving_input)

    def decorator(fn):
        check_hparams(name or snake_case(fn.__name__), hparams)
        check_serving_input("model", name or snake_case(fn.__name__), serving_input)
        return register(fn)

    return decorator


def check_hparams(model: str, hparams: Mapping[str, Any]):
    """Refuse hparams the run would silently replace (RUN_PARAMS) or could not save into
    config.yaml (anything but numbers, strings, booleans, None, and lists of them)."""
    clash = sorted(k for k in hparams if k in RUN_PARAMS)
    if clash:
        raise UserError(f"model '{model}': an hparam may not be named {', '.join(clash)}: "
                        f"the run puts its own setting of that name into params, replacing "
                        f"it; rename it, or set a run default with register_model(run_defaults=...)")
    for key, value in hparams.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        if not isinstance(key, str) or not all(isinstance(v, PLAIN_TYPES) for v in values):
            raise UserError(f"model '{model}': hparam {key!r} = {value!r:.60} is not a plain "
                            f"value; hparams are numbers, strings, booleans, None or lists of "
                            f"them (saved in config.yaml, set with --set)")


def register_input(name=None, prepare=None, data_flags=None, serving_input=None):
    """Register an input function -> tf.data.Dataset of (features, labels).

    It takes any of `mode, params, config, input_context` (none included), as Estimator
    accepts; features are a dict of tensors or one tensor.

    Args:
      name: registry key; defaults to the function's snake_case name.
      prepare: `prepare(params) -> dict`, run once before training: checks the data
        exists (raise UserError if not) and returns extra params, which must include
        `serving_features`: {feature name: (shape without batch, dtype name)}.
      data_flags: which of DATA_FLAGS (--data_dir, --data_path, --label_column,
        --synthetic, --reader_nice) the input reads, e.g. ("data_dir", "synthetic"); a run
        setting another is refused instead of silently ignored. Name "reader_nice" only if
        the input runs reader threads that take params["reader_nice"] (-1 when not given:
        pass it to reader_priority.lowered / lower_this_thread, which use 19 then); an input
        without them leaves it out, and an explicit --reader_nice (0 too) is refused. None
        (the default): not declared, not checked.
      serving_input: what SavedModels of models trained on it take, as for register_model
        (the model's wins); else prepare()'s serving_features, else read off its data.
    """
    check_serving_input("input", name, serving_input)
    if data_flags is not None:
        unknown = [f for f in data_flags if f not in DATA_FLAGS]
        if unknown or isinstance(data_flags, str):
            raise UserError(f"input '{name}': data_flags {data_flags!r} must be a tuple of "
                            f"{', '.join(DATA_FLAGS)}")
        data_flags = tuple(data_flags)
    return INPUTS.register(name, prepare=prepare, data_flags=data_flags,
                           serving_input=serving_input)


def check_data_flags(entry: Entry, settings: Mapping[str, Any]):
    """Refuse a data setting (DATA_FLAGS, given in `settings`) that the input declared it
    does not read: it would be silently ignored."""
    if entry.data_flags is None:
        return
    for flag in DATA_FLAGS:
        value = settings.get(flag)
        if value is None or value == DATA_FLAGS[flag] or flag in entry.data_flags:
            continue
        readers = [n for n in INPUTS.names() if flag in (INPUTS.get(n).data_flags or ())]
        reads = ("it reads only " + ", ".join(f"--{f}" for f in entry.data_flags)
                 if entry.data_flags else "it reads none of " +
                 ", ".join(f"--{f}" for f in DATA_FLAGS))
        shown = f"--{flag}" if value is True else f"--{flag} {value!r}"
        raise UserError(f"{shown}: input '{entry.name}' does not read it ({reads}); drop it" +
                        (f", or use --input {' or '.join(readers)}" if readers else ""))
