"""Which devices a run uses, and the session config that makes them visible.

On a CPU-only machine `--num_devices N` means N logical CPU devices. Estimator
sessions see one CPU unless the session config declares the count; without it
MirroredStrategy over /cpu:0,/cpu:1 hangs forever (TF 2.15, measured).
"""
import os
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from estimator_dist.distribute import xla
from estimator_dist.errors import UserError

MAX_LOGICAL_CPUS = max(8, os.cpu_count() or 1)


@dataclass(frozen=True)
class Devices:
    """The compute devices of one process and how to configure its session."""

    names: Tuple[str, ...]
    kind: str  # "GPU" or "CPU"

    @property
    def count(self) -> int:
        return len(self.names)

    def session_config(self, jit: bool = False) -> tf.compat.v1.ConfigProto:
        """Devices, thread pools, grappler once; with `jit` XLA auto-clustering (--jit)."""
        cpus = self.count if self.kind == "CPU" else 1
        config = tf.compat.v1.ConfigProto(
            device_count={"CPU": cpus}, allow_soft_placement=True)
        if self.count == 1:
            # Estimator's own default session config runs grappler once; a config of our
            # own would silently run it twice, adding seconds before the first step. Over
            # several devices the second pass pays: ResNet-20 mirrored N=2 ran 5% faster.
            config.graph_options.rewrite_options.meta_optimizer_iterations = \
                rewriter_config_pb2.RewriterConfig.ONE
        if self.kind == "CPU" and self.count > 1:
            # N logical CPUs share the cores: each replica's ops get cores / N threads and
            # the N replicas run side by side, rather than N ops each using every core
            # (2 cores, ResNet-20: tower 1.2x, mirrored 1.03-1.09x in A/B runs; noisy).
            config.intra_op_parallelism_threads = max(1, available_cores() // self.count)
            config.inter_op_parallelism_threads = max(2, self.count)
        if self.kind == "GPU":
            config.gpu_options.allow_growth = True
        return xla.enable(config) if jit else config


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. a container's CPU set)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# TensorFlow's device configuration; tests hand in a recorder (no GPU exists here).
TF_CONFIG_API = tf.config


def physical_gpus() -> list:
    """The machine's GPUs (listing them does not start TensorFlow's runtime)."""
    return TF_CONFIG_API.list_physical_devices("GPU")


def gpu_count() -> int:
    return len(physical_gpus())


def claim_gpus(indices: Sequence[int], gpus: Optional[list] = None):
    """Make only these GPUs visible to this process, each growing its memory as needed.

    Must run before TensorFlow's runtime starts (its first eager op or session): the
    runtime maps every GPU once and builds each allocator once, after which neither
    visibility nor `allow_growth` in a session config takes effect (a Horovod rank with
    local_rank >= 1 then failed: "GPU:0 is being mapped to multiple devices", TF #60810;
    chief, workers and evaluator on one host each took every GPU's memory).
    """
    gpus = physical_gpus() if gpus is None else gpus
    chosen = [gpus[i] for i in indices]
    try:
        TF_CONFIG_API.set_visible_devices(chosen, "GPU")
        for gpu in chosen:
            TF_CONFIG_API.experimental.set_memory_growth(gpu, True)
    except RuntimeError as e:  # the same settings again are no error; others are
        raise UserError(f"this process started TensorFlow's GPU runtime with other GPUs "
                        f"visible before asking for {', '.join(g.name for g in chosen)} "
                        f"({e}); run each configuration in a process of its own") from None


def resolve(num_devices: int, gpus: int = None, single_device: bool = False) -> Devices:
    """Devices for `--num_devices` (0 = auto: every GPU, one for a single-device strategy;
    else one CPU)."""
    gpus = gpu_count() if gpus is None else gpus
    if gpus:
        n = num_devices or (1 if single_device else gpus)
        if n > gpus:
            raise UserError(f"--num_devices {n}: this machine has {gpus} GPU(s); "
                            f"ask for at most {gpus} (or 0 for all)")
        return Devices(tuple(f"/gpu:{i}" for i in range(n)), "GPU")
    n = num_devices or 1
    if n > MAX_LOGICAL_CPUS:
        raise UserError(f"--num_devices {n}: this machine has no GPU and allows at most "
                        f"{MAX_LOGICAL_CPUS} logical CPU devices; ask for fewer")
    return Devices(tuple(f"/cpu:{i}" for i in range(n)), "CPU")
