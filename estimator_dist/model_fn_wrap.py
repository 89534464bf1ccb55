"""Wrapping a model_fn without hiding its arguments from Estimator.

Estimator inspects a model_fn's signature and passes only the arguments it
names (registry.MODEL_FN_ARGS); a plain `*args, **kwargs` wrapper would be
given none of them. The wrapper here keeps the wrapped function's signature
and hands each call's mode to the code around it.
"""
import functools
import inspect
from typing import Callable

import tensorflow as tf

TRAIN = tf.estimator.ModeKeys.TRAIN


def around(model_fn, call: Callable):
    """A model_fn whose every call is `call(mode, build)`; `build()` calls `model_fn`.

    mode: the call's mode, or None for a model_fn that does not take one.
    """
    return around_arguments(model_fn, lambda arguments, build: call(arguments.get("mode"), build))


def around_arguments(model_fn, call: Callable):
    """Like `around`, but `call(arguments, build)` gets the call's arguments by name
    (features, labels, mode, ...: those the model_fn takes)."""
    signature = inspect.signature(model_fn)

    @functools.wraps(model_fn)
    def wrapper(*args, **kwargs):
        arguments = signature.bind_partial(*args, **kwargs).arguments
        return call(arguments, lambda: model_fn(*args, **kwargs))

    wrapper.__signature__ = signature
    return wrapper
