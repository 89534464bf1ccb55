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

from estimator_dist.graph import train_op
from estimator_dist.errors import UserError

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


def estimator_call(model_fn):
    """`model_fn` behind the full signature `(features, labels, mode, params, config)`.

    Estimator passes a model_fn only the arguments it names, and refuses one without
    `params` when it has params to give (the runner always has). Every wrapper of the run
    takes the full signature; the user's function gets what it takes, as from Estimator,
    and the run's params stay reachable for `estimator_dist.minimize(loss)` while it runs.
    """
    takes = set(inspect.signature(model_fn).parameters)

    def call(features, labels, mode, params, config=None):
        if labels is not None and "labels" not in takes:
            raise UserError("model_fn does not take labels, but its input_fn returns "
                            "(features, labels); add a labels argument or return features only")
        given = {"features": features, "labels": labels, "mode": mode, "params": params,
                 "config": config}
        with train_op.run_params(params):
            return model_fn(**{k: v for k, v in given.items() if k in takes})

    return call


def input_call(input_fn):
    """`input_fn` behind `(mode, params, config=None, input_context=None)`, passing only the
    arguments it names, as Estimator's `_call_input_fn` does (`input_context` None when
    no strategy gives one; a default RunConfig where the caller has none: a graph built
    before the Estimator, to check or infer something)."""
    takes = set(inspect.signature(input_fn).parameters)

    def call(mode, params, config=None, input_context=None):
        if config is None and "config" in takes:
            config = tf.estimator.RunConfig()
        given = {"mode": mode, "params": params, "config": config,
                 "input_context": input_context}
        return input_fn(**{k: v for k, v in given.items() if k in takes})

    call.takes_context = "input_context" in takes
    return call
