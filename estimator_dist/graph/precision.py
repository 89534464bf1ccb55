"""`--mixed_precision bfloat16|float16`: Keras layers compute in 16 bits, variables and the loss
stay float32. float16 (for GPUs) adds dynamic loss scaling in minimize() (train_op.py).

How, and why this way (TF 2.15 pip wheel, measured):
- Grappler's `auto_mixed_precision_onednn_bfloat16` rewrite is compiled only
  under INTEL_MKL, so the stock wheel ignores it: it cannot be the mechanism.
- The Keras global policy `mixed_bfloat16` works in graph mode for tf.keras
  layers built inside a model_fn (bfloat16 outputs, float32 variables). The
  wrapper sets it around every model_fn call, in every mode, so evaluation and
  the exported SavedModel compute what was trained; the heads cast the logits
  back to float32 for softmax, loss, metrics and predictions.
- tf.compat.v1.layers (dense, conv2d, batch_normalization) ignore the policy and
  stay float32. A TRAIN graph with no bfloat16 op is refused rather than
  silently trained in float32.
- The policy is process-global, not per thread, and MirroredStrategy builds its
  replicas in threads that interleave (each pauses in a merge_call while the
  next one builds). Save/restore per call would let the last replica restore
  the policy another replica set; a depth count restores it once, after the
  last call ends.
- CPUs without avx512_bf16 / amx_bf16 emulate bfloat16: a ResNet step took
  ~14x the CPU time of float32 on a 2-core AMD EPYC. `cpu_note` says so.
- float16 (`mixed_float16`): the same mechanism, and minimize() wraps the optimizer in
  tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer with a dynamic loss
  scale (float16 gradients underflow without it). TF 2.15 runs float16 Keras layers on a
  CPU too (measured: digits trains, finite loss, the loss scale in the checkpoint), only
  slowly: it is meant for GPUs, and `cpu_note` says so on a CPU.
"""
import os
import threading
from typing import Iterable, Optional

import tensorflow as tf

from estimator_dist.distribute import devices as devices_lib
from estimator_dist.graph import model_fn_wrap
from estimator_dist.errors import UserError

POLICY = "mixed_bfloat16"
POLICIES = {"bfloat16": POLICY, "float16": "mixed_float16"}
DTYPES = {"bfloat16": tf.bfloat16, "float16": tf.float16}
CPUINFO = "/proc/cpuinfo"
# x86 (AVX512-BF16, AMX) and ARM (FEAT_BF16, "bf16" in /proc/cpuinfo Features).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")

FLOAT16_CPU_NOTE = ("note: no GPU: float16 runs on this CPU without fast float16 kernels, "
                    "slower than float32; it is meant for GPUs (on a CPU use bfloat16)")

_lock = threading.Lock()
_depth = 0
_outer_policy = None


def wrap_model_fn(model_fn, mixed_precision: str, model_name: str):
    """`model_fn` built under the mixed_bfloat16 / mixed_float16 Keras policy; unchanged for "none".

    Raises (from the wrapper, TRAIN mode): UserError when the graph has no
    16-bit op after the call, i.e. the model builds no Keras layers.
    """
    if mixed_precision == "none":
        return model_fn

    def call(mode, build):
        with mixed_policy(POLICIES[mixed_precision]):
            spec = build()
        if mode == model_fn_wrap.TRAIN and not has_op_of(tf.compat.v1.get_default_graph(),
                                                         DTYPES[mixed_precision]):
            raise UserError(
                f"--mixed_precision {mixed_precision}: model {model_name} builds no Keras layers "
                f"(tf.compat.v1.layers ignore the mixed precision policy), so nothing would "
                f"compute in {mixed_precision}; drop the flag or build the model_fn from "
                f"tf.keras.layers")
        return spec

    return model_fn_wrap.around(model_fn, call)


class mixed_policy:  # noqa: N801 - a context manager that reads like a function
    """The Keras global policy is `policy` inside; the outer one comes back after the last exit.
    (One run uses one policy: nested calls keep the outermost's.)"""

    def __init__(self, policy: str = POLICY):
        self._policy = policy

    def __enter__(self):
        global _depth, _outer_policy
        with _lock:
            if _depth == 0:
                _outer_policy = tf.keras.mixed_precision.global_policy()
                tf.keras.mixed_precision.set_global_policy(self._policy)
            _depth += 1
        return self

    def __exit__(self, *exc):
        global _depth, _outer_policy
        with _lock:
            _depth -= 1
            if _depth == 0:
                tf.keras.mixed_precision.set_global_policy(_outer_policy)
                _outer_policy = None
        return False


def bfloat16_policy():
    return mixed_policy(POLICY)


def has_op_of(graph: tf.Graph, dtype) -> bool:
    return any(t.dtype == dtype for op in graph.get_operations() for t in op.outputs)


def has_bfloat16_op(graph: tf.Graph) -> bool:
    return has_op_of(graph, tf.bfloat16)


def cpu_note(mixed_precision: str, cpuinfo_path: str = CPUINFO,
             has_gpu: Optional[bool] = None) -> Optional[str]:
    """A one-line warning when bfloat16 runs on a CPU without native bfloat16, or float16 on
    a CPU; else None.

    None also when there is a GPU or when `cpuinfo_path` is missing or lists no flags.
    """
    if mixed_precision not in DTYPES:
        return None
    if has_gpu is None:
        has_gpu = devices_lib.gpu_count() > 0
    if mixed_precision == "float16":
        return None if has_gpu else FLOAT16_CPU_NOTE
    flags = None if has_gpu else cpu_flags(cpuinfo_path)
    if not flags or any(f in flags for f in NATIVE_BF16_FLAGS):
        return None
    return ("note: this CPU has no native bfloat16 (no avx512_bf16/amx_bf16): bfloat16 is "
            "emulated and slower than float32")


def cpu_flags(cpuinfo_path: str = CPUINFO) -> Optional[frozenset]:
    """The CPU feature flags of /proc/cpuinfo (x86 "flags", ARM "Features"); None if unknown."""
    if not os.path.exists(cpuinfo_path):
        return None
    with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
        return _flags(f) or None


def _flags(lines: Iterable[str]) -> frozenset:
    found = set()
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            found.update(value.split())
    return frozenset(found)
