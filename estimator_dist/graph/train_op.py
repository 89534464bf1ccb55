"""`minimize(loss, params)`: the one public way a model_fn builds its train op.

The optimizer, learning-rate schedule and update ops come from params, so every
strategy (including `tower`, which must see each tower's loss rather than a
finished train op) can take over how the step is applied.
"""
import contextlib
import math

import tensorflow as tf

from estimator_dist.graph import compression
from estimator_dist.graph import hparam_checks
from estimator_dist.graph import numerics
from estimator_dist.errors import UserError

OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop")
LR_SCHEDULES = ("constant", "cosine", "step")

# The params of the model_fn call in progress (model_fn_wrap.estimator_call): what
# minimize(loss) reads when a model_fn takes no params argument.
_RUN_PARAMS = []

# Strategies that apply gradients themselves (towers, accumulation) push a handler
# here; minimize() then hands the loss over instead of building the update.
_HANDLERS = []


class minimize_handler:  # noqa: N801 - used as a context manager, reads like a function
    """Context manager: route minimize() calls to
    `handler(loss, params, update_ops, var_list, optimizer)` (optimizer: the model_fn's own, or
    None: build it from params with optimizer_for)."""

    def __init__(self, handler):
        self._handler = handler

    def __enter__(self):
        _HANDLERS.append(self._handler)
        return self._handler

    def __exit__(self, *exc):
        _HANDLERS.pop()
        return False


@contextlib.contextmanager
def run_params(params):
    """While a model_fn runs: its run's params, for minimize() called without them."""
    _RUN_PARAMS.append(params)
    try:
        yield
    finally:
        _RUN_PARAMS.pop()


def _params_of_run(params):
    if params is not None:
        return params
    if not _RUN_PARAMS:
        raise UserError("estimator_dist.minimize(loss) without params works only in a model_fn "
                        "that estimator-dist runs; elsewhere pass the model_fn's params: "
                        "minimize(loss, params)")
    return _RUN_PARAMS[-1]


def learning_rate(params, global_step=None):
    """The learning-rate tensor for this step from params.

    params["warmup_steps"] > 0 ramps it linearly from base / warmup_steps up to base
    over those steps (Goyal et al. 2017); the schedule then runs over the steps left.
    """
    base = hparam_checks.non_negative_number(params, "learning_rate", 0.1, default=0.1) * \
        float(params.get("lr_scale", 1.0))
    schedule = params.get("lr_schedule", "constant")
    if schedule not in LR_SCHEDULES:
        raise UserError(f"lr_schedule '{schedule}' is not one of {', '.join(LR_SCHEDULES)}; "
                        f"fix it with --set lr_schedule=constant")
    warmup = int(hparam_checks.non_negative_number(params, "warmup_steps", 500, default=0))
    if schedule == "constant" and not warmup:
        return tf.constant(base, tf.float32)
    step = global_step if global_step is not None else tf.compat.v1.train.get_or_create_global_step()
    total = max(int(params.get("train_steps") or 1) - warmup, 1)
    after = step - warmup if warmup else step
    if schedule == "constant":
        lr = tf.constant(base, tf.float32)
    elif schedule == "cosine":
        lr = tf.compat.v1.train.cosine_decay(base, tf.maximum(after, 0), total)
    else:
        bounds = [int(math.ceil(total * 0.5)), int(math.ceil(total * 0.75))]
        lr = tf.compat.v1.train.piecewise_constant(
            after, bounds, [base, base * 0.1, base * 0.01])
    if not warmup:
        return lr
    ramp = base * tf.cast(step + 1, tf.float32) / float(warmup)
    return tf.where(step < warmup, ramp, lr)


def make_optimizer(params, lr=None):
    """A tf.compat.v1.train optimizer from params["optimizer"].

    Keras optimizers are deliberately not offered: in graph mode the new ones never
    update weights and neither steps global_step (see docs/own-model.md, "The model_fn").
    """
    name = params.get("optimizer", "sgd")
    lr = learning_rate(params) if lr is None else lr
    if name == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(lr)
    if name == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(
            lr, hparam_checks.fraction(params, "momentum", 0.9, default=0.9))
    if name == "adam":
        return tf.compat.v1.train.AdamOptimizer(lr)
    if name == "rmsprop":
        return tf.compat.v1.train.RMSPropOptimizer(lr)
    raise UserError(f"optimizer '{name}' is not one of {', '.join(OPTIMIZERS)}; "
                    f"fix it with --set optimizer=sgd")


def checked_optimizer(optimizer, params):
    """The model_fn's own optimizer given to minimize(optimizer=...): a tf.compat.v1.train
    optimizer (a Keras one never steps global_step, and in graph mode never updates)."""
    if optimizer is None:
        return None
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise UserError(f"estimator_dist.minimize(optimizer=...) got a {type(optimizer).__name__}; "
                        f"it takes a tf.compat.v1.train optimizer (e.g. "
                        f"tf.compat.v1.train.MomentumOptimizer(learning_rate, 0.9)), not a "
                        f"tf.keras one")
    if float(params.get("lr_scale", 1.0)) != 1.0:
        raise UserError("--scale_lr scales the learning rate minimize() builds from params; "
                        "this model_fn gives its own optimizer: drop --scale_lr and multiply "
                        "its learning rate by params['num_replicas'] in the model_fn")
    return optimizer


def optimizer_for(params, optimizer=None):
    """The optimizer a step applies with: the model_fn's own (its learning rate and schedule
    as it built them), else the one params name (make_optimizer)."""
    return optimizer if optimizer is not None else make_optimizer(params)


def gradients(optimizer, loss, var_list=None):
    """`optimizer.compute_gradients` without TF1's default per-op gating (GATE_OP).

    GATE_OP holds each op's input gradients back until all of them exist (a tuple
    of identities per op), so, e.g., a conv's input gradient waits for its filter
    gradient; GATE_NONE, what tf.gradients and Keras' GradientTape do, lets the
    backward pass run on. The guard (numerics.py) still applies nothing before
    every gradient exists. ResNet-20, N=1, in-process alternating bursts: 2-3%
    faster; the MLP 1% (docs/speed.md).
    """
    return optimizer.compute_gradients(loss, var_list=var_list,
                                       gate_gradients=tf.compat.v1.train.Optimizer.GATE_NONE)


def collect_update_ops(update_ops=None):
    """UPDATE_OPS (tf.compat.v1.layers batch norm) plus explicitly given Keras updates.

    Keras layers called inside a model_fn leave UPDATE_OPS empty; pass
    `model.updates` (or `layer.updates`) as `update_ops` or their moving
    statistics never change.
    """
    ops = list(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
    for op in update_ops or []:
        if op not in ops:
            ops.append(op)
    return ops


FLOAT16_POLICY = "mixed_float16"
LOSS_SCALE = "estimator_dist_loss_scale"  # graph collection: the graph's one DynamicLossScale


def loss_scaling_active() -> bool:
    """--mixed_precision float16 (precision.py sets the Keras policy around the model_fn):
    float16 gradients underflow to 0 without loss scaling."""
    return tf.keras.mixed_precision.global_policy().name == FLOAT16_POLICY


def loss_scale():
    """The graph's dynamic loss scale (2**15 at first; halved on a step with an Inf/NaN
    gradient, which is skipped; doubled after 2000 good steps). One per graph: every replica
    of a MirroredStrategy model_fn call reads the same variables (current_loss_scale,
    good_steps), which are saved in the checkpoint."""
    graph = tf.compat.v1.get_default_graph()
    found = graph.get_collection(LOSS_SCALE)
    if found:
        return found[0]
    scale = tf.compat.v1.mixed_precision.DynamicLossScale()
    graph.add_to_collection(LOSS_SCALE, scale)
    return scale


def minimize(loss, params=None, update_ops=None, var_list=None, optimizer=None):
    """Build the train op for `loss` from params; call it from a model_fn in TRAIN mode.

    Args:
      loss: scalar loss tensor (mean over this replica's / tower's batch).
      params: the params dict Estimator passed to the model_fn; None (a model_fn
        that takes no params) reads the run's params.
      update_ops: extra ops to run each step, e.g. `model.updates` of Keras layers.
      var_list: variables to train (default: all trainable).
      optimizer: the model_fn's own tf.compat.v1.train optimizer, with any learning rate
        or schedule it was built with (e.g. MomentumOptimizer over
        tf.compat.v1.train.piecewise_constant of the global step); None: the one
        params["optimizer"] names. Towers, accumulation, compression, the NaN guard and
        loss scaling apply it as they apply their own.
    Returns:
      The train op; it steps the global step. Its session run fails, changing
      no variable, when the loss or a gradient is NaN or Inf (numerics.py).
      Under `--strategy tower` or `--accumulate_steps K > 1` the run's wrapper
      takes the loss over instead and returns a placeholder op: return it as
      the EstimatorSpec's train_op.
      With --mixed_precision float16 the optimizer is TF's MixedPrecisionLossScaleOptimizer
      with a dynamic loss scale: a step whose scaled gradients overflow is skipped (no
      update, the global step does not move) and the scale halves; at scale 1 a non-finite
      gradient fails the step as in float32.
    """
    params = _params_of_run(params)
    optimizer = checked_optimizer(optimizer, params)
    if _HANDLERS:
        return _HANDLERS[-1](loss, params, update_ops, var_list, optimizer)
    optimizer = optimizer_for(params, optimizer)
    scale = loss_scale() if loss_scaling_active() else None
    if scale is not None:
        optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, scale)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    setting = params.get("gradient_compression", "none")
    with tf.control_dependencies(collect_update_ops(update_ops)):
        grads_and_vars = gradients(optimizer, loss, var_list)
        # optimizer.minimize() without the guard would apply NaN/Inf gradients.
        checked = numerics.guard(loss, grads_and_vars,
                                 overflow_ok=None if scale is None else scale() > 1.0)
        if not compression.active(setting):
            return optimizer.apply_gradients(checked, global_step=global_step)
        reduced = numerics.guard(None, compression.all_reduce(checked, setting),
                                 note=f" after its {setting} all-reduce ({compression.RANGE_NOTE[setting]})")
        return compression.apply_reduced(optimizer, reduced, global_step)
