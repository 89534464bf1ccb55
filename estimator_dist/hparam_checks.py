"""Range checks of model hparams, for model_fns: one-line UserErrors before TensorFlow sees them.

TensorFlow's own refusals of such values are tracebacks from deep in the layer
code, and some are worse: a zero-width dense layer aborts the process inside
oneDNN (SIGABRT, measured).
"""
from estimator_dist.errors import UserError


def positive_int(params, key: str, example: int) -> int:
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{key} {value!r}: must be a positive integer; fix it with "
                        f"--set {key}={example}")
    return value


def non_negative_number(params, key: str, example: float) -> float:
    """A number >= 0 (a learning rate of 0 freezes the model: allowed)."""
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise UserError(f"{key} {value!r}: must be a number >= 0; fix it with --set {key}={example}")
    return float(value)


def fraction(params, key: str, example: float) -> float:
    """A number in [0, 1) (dropout rate, momentum)."""
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise UserError(f"{key} {value!r}: must be a number in [0, 1); fix it with "
                        f"--set {key}={example}")
    return float(value)
