"""Range checks of model hparams, for model_fns: one-line UserErrors before TensorFlow sees them.

TensorFlow's own refusals of such values are tracebacks from deep in the layer
code, and some are worse: a zero-width dense layer aborts the process inside
oneDNN (SIGABRT, measured).
"""
from estimator_dist.errors import UserError

_MISSING = object()


def _checked(params, key, example, allowed: str, ok, kinds=(int, float), default=_MISSING):
    """params[key] (or `default` when absent) if it is a number of `kinds` that is `ok`."""
    if key not in params and default is not _MISSING:
        return default
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, kinds) or not ok(value):
        raise UserError(f"{key} {value!r}: must be {allowed}; fix it with --set {key}={example}")
    return value


def positive_int(params, key: str, example: int) -> int:
    return _checked(params, key, example, "a positive integer", lambda v: v >= 1, kinds=(int,))


def non_negative_number(params, key: str, example: float, default=_MISSING) -> float:
    """A number >= 0 (a learning rate of 0 freezes the model: allowed)."""
    return float(_checked(params, key, example, "a number >= 0", lambda v: v >= 0,
                          default=default))


def fraction(params, key: str, example: float, default=_MISSING) -> float:
    """A number in [0, 1) (dropout rate, momentum)."""
    return float(_checked(params, key, example, "a number in [0, 1)", lambda v: 0 <= v < 1,
                          default=default))
