"""Range checks of model hparams, for model_fns: one-line UserErrors before TensorFlow sees them.

TensorFlow's own refusals of such values are tracebacks from deep in the layer
code, and some are worse: a zero-width dense layer aborts the process inside
oneDNN (SIGABRT, measured). NaN and Inf pass every comparison they should fail
(nan >= 0 is False but so is nan < 0; inf >= 0 is True), so they are refused apart.
"""
import math

from estimator_dist.errors import UserError

_MISSING = object()


def _checked(params, key, example, allowed: str, ok, kinds=(int, float), default=_MISSING):
    """params[key] (or `default` when absent) if it is a finite number of `kinds` that is `ok`.

    `allowed` names what is wanted without its article ("number >= 0").
    """
    if key not in params and default is not _MISSING:
        return default
    value = params[key]
    fix = f"; fix it with --set {key}={example}"
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise UserError(f"{key} {value!r}: must be a {allowed}{fix}")
    if not math.isfinite(value):
        raise UserError(f"{key} {value!r}: must be a finite {allowed}{fix}")
    if not ok(value):
        raise UserError(f"{key} {value!r}: must be a {allowed}{fix}")
    return value


def positive_int(params, key: str, example: int) -> int:
    return _checked(params, key, example, "positive integer", lambda v: v >= 1, kinds=(int,))


def non_negative_number(params, key: str, example: float, default=_MISSING) -> float:
    """A finite number >= 0 (a learning rate or weight decay of 0 is allowed: it switches off)."""
    return float(_checked(params, key, example, "number >= 0", lambda v: v >= 0,
                          default=default))


def fraction(params, key: str, example: float, default=_MISSING) -> float:
    """A number in [0, 1) (dropout rate, momentum)."""
    return float(_checked(params, key, example, "number in [0, 1)", lambda v: 0 <= v < 1,
                          default=default))
