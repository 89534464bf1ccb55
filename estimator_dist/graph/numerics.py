"""Non-finite guard: a NaN or Inf loss or gradient fails its step before any variable changes.

TF 2.15 fails silently here (measured): a NaN gradient with a finite loss is
applied and a checkpoint full of NaN weights is saved before Estimator's
NanTensorHook fires, and an Inf loss is never caught (it checks isnan only).

`guard()` is the one place gradients are checked; every path that applies
gradients goes through it (`minimize`, `--strategy tower`, `--accumulate_steps`).
The gradients handed to the optimizer are the outputs of the check (a vectorized
all-finite test; on failure `check_numerics`, which names the bad gradient), so
the update cannot run unless every check passed; the failing session run
raises InvalidArgumentError, no hook's after_run/end runs, so no checkpoint of
the poisoned step is written. `non_finite_error()` turns that error into a
one-line NonFiniteError naming the step (see guards.StepTracker).
"""
import contextlib
import re
from typing import Optional

import tensorflow as tf

from estimator_dist.errors import NonFiniteError, UserError

MARKER = "estimator_dist non-finite"
_FOUND = re.compile(re.escape(MARKER) + r" (?P<what>[^:]+?)\s*: Tensor had (?P<kind>NaN|Inf) values")
_AFTER_LAST_GRADIENT = [False]
CONVOLUTIONS = ("Conv", "DepthwiseConv")  # op type prefixes: Conv2D, Conv3D, their gradients


@contextlib.contextmanager
def checks_after_last_gradient(enabled: bool = True):
    """guard() calls inside, in a graph with convolutions, run their finite checks
    only once every gradient exists.

    For a replica whose kernels run on several threads of a CPU (one device per
    process; the runner decides). A check run beside a convolution's backward
    kernels holds a core one of the kernel's threads wanted, and the kernel waits
    for its slowest thread; elsewhere the checks fill idle time beside the backward
    pass and are better left there. Measured (docs/speed.md), against the
    checks beside the backward pass: ResNet-20 N=1 1.02-1.07 (mirrored N=2, one
    thread per replica, 0.97: so not there), ResNet-8 1.02; a 2- and an 8-layer MLP
    0.97 and 0.95 (so not without convolutions).
    """
    _AFTER_LAST_GRADIENT.append(enabled)
    try:
        yield
    finally:
        _AFTER_LAST_GRADIENT.pop()


def guard(loss, grads_and_vars, num_examples=None, note: str = "", overflow_ok=None):
    """(grad, var) pairs whose gradients only exist when the loss and all gradients are finite.

    Args:
      loss: the step's scalar loss (None: gradients only).
      grads_and_vars: what the optimizer will apply.
      num_examples: optional scalar; with 0 examples the loss (a mean over none,
        NaN) is not checked, as the strategies give an empty batch zero weight.
      note: said after a bad gradient's name (what was done to it; no ':').
      overflow_ok: optional scalar bool (--mixed_precision float16: the loss scale is > 1):
        non-finite gradients pass unchecked, for the loss scaling optimizer to skip the
        step and halve its scale; at scale 1 they fail the step as always.
    Returns:
      grads_and_vars with each gradient replaced by its checked value.
    """
    checks = []
    if loss is not None:
        if num_examples is not None:
            empty = tf.equal(tf.cast(num_examples, tf.float32), 0.0)
            loss = tf.where(empty, tf.zeros_like(loss), loss)
        checks.append(tf.debugging.check_numerics(loss, f"{MARKER} loss"))
    require_gradients(grads_and_vars)
    present = [(grad, var) for grad, var in grads_and_vars if grad is not None]
    if not present:
        return list(grads_and_vars)
    with tf.control_dependencies(checks):
        checked = iter(_checked([_values(grad) for grad, _ in present],
                                [var for _, var in present], note, overflow_ok))
    out = []
    for grad, var in grads_and_vars:
        out.append((None if grad is None else _rebuild(grad, next(checked)), var))
    return out


def require_gradients(grads_and_vars):
    """UserError when variables are to be trained but the loss has a gradient to none of them:
    nothing could ever change (under mirrored TensorFlow failed in its all-reduce with an
    AttributeError traceback)."""
    pairs = list(grads_and_vars)
    if pairs and all(grad is None for grad, _ in pairs):
        names = ", ".join(var.op.name for _, var in pairs[:5]) + (", ..." if len(pairs) > 5 else "")
        raise UserError(f"the loss has no gradient to any trainable variable ({names}): a "
                        f"tf.stop_gradient or a non-differentiable op (argmax, a cast to int) "
                        f"cuts it off; training could never change them")


def _checked(values, variables, note="", overflow_ok=None):
    """`values` passed through when all are finite, else check_numerics names the first bad one.

    check_numerics scans with one thread, element by element: on every gradient of
    every step that cost the MLP benchmark ~15% of its step time (docs/speed.md). `is_finite` + `reduce_all` run vectorized on the step's
    threads; only a failing step pays for the per-gradient scan and its message.
    """
    with tf.control_dependencies(values if _checks_wait(values) else []):
        finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in values]))
    if overflow_ok is not None:
        finite = tf.logical_or(finite, overflow_ok)
    messages = [f"{MARKER} gradient of '{var.op.name}'{note}" for var in variables]

    def as_they_are():
        return [tf.identity(v) for v in values]

    def name_the_bad_one():
        return [tf.debugging.check_numerics(v, m) for v, m in zip(values, messages)]

    return tf.cond(finite, as_they_are, name_the_bad_one)


def _checks_wait(values) -> bool:
    return _AFTER_LAST_GRADIENT[-1] and any(
        op.type.startswith(CONVOLUTIONS) for op in values[0].graph.get_operations())


def _values(grad):
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _rebuild(grad, values):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return values


def is_non_finite(error: BaseException) -> bool:
    return isinstance(error, tf.errors.InvalidArgumentError) and MARKER in str(error)


def non_finite_error(error: BaseException, step: Optional[int], last_checkpoint: Optional[str],
                     model_dir: str) -> NonFiniteError:
    """The one-line error for a failed check: which value, NaN or Inf, at which step."""
    found = _FOUND.search(str(error))
    what = found.group("what").strip() if found else "the loss or a gradient"
    kind = found.group("kind") if found else "NaN or Inf"
    where = f"at step {step}" if step is not None else "at an unknown step"
    if last_checkpoint:
        kept = (f"nothing of that step was saved; the last good checkpoint is "
                f"{last_checkpoint}")
    else:
        kept = f"nothing of that step was saved; {model_dir} holds no checkpoint yet"
    if " all-reduce (" in what:  # finite in float32, not after the 16-bit reduction
        fix = ("the gradient overflowed the 16-bit --gradient_compression: use "
               "--gradient_compression bf16 (float32's range) or none, or scale the loss down")
    else:
        fix = ("lower the learning rate, check the input data or the model for log(0)/division "
               "by zero")
    return NonFiniteError(f"training stopped {where}: the {what} is {kind}; {kept}; {fix}, then "
                          f"rerun to resume from that checkpoint")
