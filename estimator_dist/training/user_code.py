"""The user's code, called and checked: imports (--import), an input's prepare(), its
input_fn's result, any exception of a model_fn or input_fn as one line."""
import importlib
import json
import os
import sys
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf

from estimator_dist.serving import serving_features
from estimator_dist.training import hints
from estimator_dist.graph import model_fn_wrap
from estimator_dist import quiet
from estimator_dist.errors import ReportedError, UserError, first_line
from estimator_dist.training.registry import Entry


def load_builtins():
    """Import the built-in model_fns and input_fns (imports force registration)."""
    importlib.import_module("model_fns")
    importlib.import_module("input_fns")


def import_user_modules(modules):
    """`--import my.module`: import modules that register more models and inputs.

    The working directory comes first on sys.path, as under `python -m`: the console
    script does not put it there, and a module beside the user failed to import.
    """
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            if e.name and e.name != name and not name.startswith(e.name + "."):
                raise UserError(f"--import {name}: it imports '{e.name}', which is missing "
                                f"({e}); install that package") from None
            raise UserError(f"--import {name}: cannot import it ({e}); run from the directory "
                            f"that holds it ({name.replace('.', '/')}.py or its package), add that "
                            f"directory to PYTHONPATH, or pip install it") from None
        except UserError as e:  # a registration the registry refused: its message says the fix
            raise UserError(f"--import {name}: {e}") from None
        except SystemExit as e:  # would end the command, exit 0 included, having run nothing
            raise UserError(f"--import {name}: importing it called sys.exit({e.code!r}); a module "
                            f"given to --import must only define and register (guard its script "
                            f"part with if __name__ == '__main__':)") from None
        except Exception as e:  # noqa: BLE001 - the module's own code failed on import
            hint = hints.for_error(e)
            raise UserError(f"--import {name}: importing it failed: {type(e).__name__}: "
                            f"{first_line(e)}; " + (f"{hint}" if hint else f"fix the module") +
                            f" (run 'python -c \"import {name}\"' to see the traceback)") from None


def users_code(call, what: str, fix):
    """call(), with an exception of the user's code as one line naming it (`fix`: the advice,
    or a function of the exception giving it); --verbose keeps the traceback. Our own
    one-line errors pass unchanged, among them Preempted, which SIGTERM raises wherever the
    main thread is (a graph build included)."""
    try:
        return call()
    except ReportedError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of a model_fn's or input's own code
        reported = reported_cause(e)
        if reported is not None:
            raise reported from None
        if not quiet.is_quiet():
            raise
        # What fits this error (a TF1-only name, params used as an object) comes first.
        fix = hints.for_error(e) or (fix(e) if callable(fix) else fix)
        raise UserError(f"{what}: {type(e).__name__}: {first_line(e)}; {fix}; --verbose shows "
                        f"the traceback") from None


def reported_cause(error: BaseException) -> Optional[ReportedError]:
    """A ReportedError that `error` was raised from or during: code that turns every exception
    into its own (inspect.getfullargspec: TypeError 'unsupported callable') hid the
    Preempted that SIGTERM raised inside it (an `export` stopped that way exited 2)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ReportedError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def run_prepare(entry: Entry, params) -> Dict[str, Any]:
    """The input's prepare() metadata, checked: a dict of plain data with serving_features,
    overriding none of the run's settings or hparams."""
    if entry.prepare is None:
        return inferred_input_meta(entry, params)
    where = f"input '{entry.name}': its prepare()"
    meta = users_code(lambda: entry.prepare(params), f"{where} failed", "fix the input")
    if not isinstance(meta, dict):
        raise UserError(f"{where} returned {type(meta).__name__}; it must return a dict with "
                        f"serving_features (see docs/own-model.md)")
    if "serving_features" not in meta:  # read them off its data, as without a prepare()
        meta = {**meta, **inferred_input_meta(entry, params)}
    # prepare() may resolve what the run left open ('' / 'auto' / None: a label column, a
    # task) or make a path absolute (data_dir); it may not replace a value the run sets.
    clash = sorted(k for k in meta if k in params and k != "data_dir" and
                   params[k] not in ("", "auto", None) and meta[k] != params[k])
    if clash:
        raise UserError(f"{where} returned {', '.join(clash)}, which the run already sets "
                        f"(flags, hparams); it would silently replace them: rename those keys")
    try:
        json.dumps(meta)  # saved into model_dir; must be plain data
    except (TypeError, ValueError) as e:
        raise UserError(f"{where} returned data that is not plain JSON ({e}); return lists, "
                        f"numbers and strings") from None
    serving_features.check_serving_features(meta["serving_features"], where)
    return meta


# input_meta key: serving_features were read off the training dataset (said at the start).
SERVING_INFERRED = "serving_features_inferred"


def inferred_input_meta(entry: Entry, params) -> Dict[str, Any]:
    """An input without serving_features from a prepare(): they are what its TRAIN dataset
    yields, read from a scratch graph (serving_features.inferred_serving_features)."""
    fn = checked_input(entry.fn, entry.name, eval_steps=1)
    with tf.Graph().as_default():
        data = fn(tf.estimator.ModeKeys.TRAIN, params)
        inferred = serving_features.inferred_serving_features(data, entry.name)
        return {**inferred, SERVING_INFERRED: True}


def checked_input(fn, name: str, eval_steps: int):
    """The registered input_fn as `(mode, params, config=None, input_context=None)`
    (model_fn_wrap.input_call), its failures one line, its result checked
    (check_input_result)."""
    fn = model_fn_wrap.input_call(fn)

    def call(mode, params, config=None, input_context=None):
        data = users_code(lambda: fn(mode, params, config, input_context),
                          f"input '{name}' failed in its {mode} call",
                          "fix its input_fn (it returns a tf.data.Dataset of (features, labels))")
        check_input_result(data, name, mode, eval_steps)
        return data

    call.takes_context = fn.takes_context
    return call


def check_input_result(data, name: str, mode, eval_steps: int):
    """What Estimator would fail on with a traceback, or hang on, as one line: elements that
    are not (features, labels) pairs; an evaluation of the whole eval set (--eval_steps 0)
    from tensors that never end (no tf.data.Dataset and no queue runner to end them);
    numpy arrays or Python values, not tensors (the model_fn failed on them deep inside a
    layer: "AttributeError: ... has no attribute 'base_dtype'")."""
    spec = data.element_spec if isinstance(data, tf.data.Dataset) else data
    if isinstance(spec, (tuple, list)) and len(spec) != 2:
        what = (f"a tf.data.Dataset of {len(spec)}-item {type(spec).__name__}s"
                if isinstance(data, tf.data.Dataset) else
                f"a {type(spec).__name__} of {len(spec)} items")
        raise UserError(f"input '{name}' returned {what} from its {mode} call; an input_fn "
                        f"returns (features, labels) pairs, features a dict of tensors")
    plain = [] if isinstance(data, tf.data.Dataset) else \
        [leaf for leaf in tf.nest.flatten(data) if not tf.is_tensor(leaf)]
    if plain:
        kind = "numpy arrays" if isinstance(plain[0], np.ndarray) else \
            f"{type(plain[0]).__name__} values"
        raise UserError(f"input '{name}' returned {kind}, not tensors, from its {mode} call; an "
                        f"input_fn returns a tf.data.Dataset of (features, labels), e.g. "
                        f"tf.data.Dataset.from_tensor_slices((features, labels))"
                        f".batch(params['batch_size'])")
    if mode == tf.estimator.ModeKeys.EVAL and not eval_steps and \
            not isinstance(data, tf.data.Dataset) and \
            not tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
        raise UserError(f"input '{name}' returned tensors, not a tf.data.Dataset, from its "
                        f"eval call: with --eval_steps 0 (the whole eval set) the evaluation "
                        f"would never end; return a tf.data.Dataset, or give --eval_steps N")
