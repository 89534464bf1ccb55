"""Strategy factory: a name -> the tf.distribute strategy Estimator runs under.

`none` and `tower` return no strategy: `none` is a plain single-device Estimator
(or, with ps tasks in TF_CONFIG, classic asynchronous between-graph training),
`tower` replicates the model_fn itself (see towers.py). The cluster strategies
read TF_CONFIG (checked first by cluster.py). `horovod` has no strategy object
either: each process is one rank, and the model_fn's optimizer averages the
gradients over the ranks (horovod.py, horovod_train.py).
"""
from typing import Callable, Dict, Optional, Tuple

import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist.distribute import sparse_gradients
from estimator_dist.distribute.devices import Devices
from estimator_dist.distribute.specs import SPECS, StrategySpec, check_name, names, spec, with_feature  # noqa: F401
from estimator_dist.errors import UserError


def _none(devices: Devices):
    return None


def _one_device(devices: Devices):
    return tf.distribute.OneDeviceStrategy(devices.names[0])


def _mirrored(devices: Devices):
    return sparse_gradients.reduce_exactly(
        tf.distribute.MirroredStrategy(devices=list(devices.names)), across_workers=False)


def _tower(devices: Devices):
    # No tf.distribute strategy: towers.py replicates the model_fn itself, and the
    # session config declares the devices.
    return None


def _multi_worker_mirrored(devices: Devices):
    """Estimator's graph session connects the workers, releasing the GIL as it waits, where
    SIGTERM is handled (guards.py). Left to itself, the strategy also starts TensorFlow's
    coordination service and a health-check barrier, and both wait for every peer inside
    TensorFlow's C++ holding the GIL (no Python thread runs), the service with a SIGTERM
    handler of its own that only sets a flag: a worker still connecting ignored SIGTERM
    until SIGKILL (35-60 s, measured). Estimator needs neither: both are left out."""
    strategy = internals.multi_worker_mirrored_without_health_check(
        lambda: tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=communication(devices)))
    return sparse_gradients.reduce_exactly(strategy, across_workers=True)


def communication(devices: Devices) -> tf.distribute.experimental.CommunicationOptions:
    """NCCL between GPUs; left at AUTO, TF 2.15's collectives under Estimator use the ring
    over gRPC (through host memory) for GPU tensors too."""
    implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL
                      if devices.kind == "GPU" else
                      tf.distribute.experimental.CommunicationImplementation.AUTO)
    return tf.distribute.experimental.CommunicationOptions(implementation=implementation)


def _parameter_server(devices: Devices):
    # The v2 ParameterServerStrategy is rejected by Estimator's RunConfig.
    return tf.compat.v1.distribute.experimental.ParameterServerStrategy()


def _horovod(devices: Devices):
    # One process per rank; hvd.DistributedOptimizer (through minimize) all-reduces.
    return None


def _central_storage(devices: Devices):
    return tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=list(devices.names), parameter_device=parameter_device(devices))


def parameter_device(devices: Devices) -> str:
    """central_storage's variables: on the one GPU when there is one (on the CPU they crossed
    PCIe twice a step for nothing), else on the CPU between the devices."""
    return devices.names[0] if devices.kind == "GPU" and devices.count == 1 else "/cpu:0"


_BUILDERS: Dict[str, Callable[[Devices], Optional[tf.distribute.Strategy]]] = {
    "none": _none,
    "one_device": _one_device,
    "mirrored": _mirrored,
    "central_storage": _central_storage,
    "tower": _tower,
    "multi_worker_mirrored": _multi_worker_mirrored,
    "parameter_server": _parameter_server,
    "horovod": _horovod,
}


def spec(name: str) -> StrategySpec:
    """The table entry of a --strategy; refuses an unknown name."""
    check_name(name)
    return SPECS[name]


# Where a model_fn's own tf.compat.v1.train.SyncReplicasOptimizer can run: between-graph
# replication, one graph per process (ps tasks in TF_CONFIG, or one local process). The
# tf.distribute strategies fail inside its apply_gradients; tower, accumulation and Horovod
# apply the gradients themselves (sync_replicas.py).


def sync_replicas_refused_by(name: str, accumulate_steps: int = 1) -> Optional[str]:
    """The setting under which SyncReplicasOptimizer cannot run ('--strategy mirrored'), or
    None where it can."""
    if not spec(name).sync_replicas:
        return f"--strategy {name}"
    if accumulate_steps > 1:
        return f"--accumulate_steps {accumulate_steps}"
    return None


def runs_one_device(name: str) -> bool:
    """`--num_devices 0` (auto) means one device, not every GPU."""
    return spec(name).one_device


# Strategies that hand Estimator no strategy object (the towers are the model_fn's): an
# input_fn may return (features, labels) tensors there, as plain Estimator allows.
TAKE_INPUT_TENSORS = ("none", "tower")


def takes_input_tensors(name: str) -> bool:
    """Whether an input_fn may return tensors instead of a tf.data.Dataset: Estimator's
    distributed path and Horovod's input take datasets only."""
    return spec(name) is not None and name in TAKE_INPUT_TENSORS


def gpus_to_claim(name: str, devices: Devices) -> Tuple[int, ...]:
    """The GPUs this process keeps visible (claim_gpus): the ones it computes on. A cluster
    strategy would otherwise use every visible GPU while the batch split counts
    --num_devices (8 GPUs, --num_devices 2: a global batch 4x what was asked)."""
    if devices.kind != "GPU" or spec(name).pins_own_gpu:  # a Horovod rank pins its own GPU
        return ()
    return tuple(range(devices.count))


def check_devices(name: str, devices: Devices):
    if spec(name).one_device and devices.count > 1:
        raise UserError(f"--strategy {name} runs on one device, got --num_devices {devices.count}; "
                        f"use --strategy mirrored for several")
    if spec(name).needs_tf_config and devices.kind == "CPU" and devices.count > 1:
        # MultiWorkerMirrored ignores logical CPUs (one replica on CPU:0, measured).
        raise UserError(f"--strategy {name} runs one replica per CPU worker, got --num_devices "
                        f"{devices.count}; add workers instead (--num_devices counts GPUs)")


def check_accumulate(name: str, accumulate_steps: int):
    if accumulate_steps > 1 and not spec(name).accumulates:
        raise UserError(f"--accumulate_steps {accumulate_steps} does not work with --strategy "
                        f"{name}; use one of {', '.join(with_feature(lambda s: s.accumulates))}")


def check_compression(name: str, setting: str, accumulate_steps: int):
    """--gradient_compression only where an all-reduce carries the gradients."""
    if setting == "none":
        return
    allowed = spec(name).compressions
    if not allowed:
        raise UserError(f"--gradient_compression {setting} means nothing with --strategy {name} "
                        f"(no all-reduce of gradients); use it with "
                        f"{', '.join(with_feature(lambda s: bool(s.compressions)))}, or leave "
                        f"it out")
    if setting not in allowed:
        raise UserError(f"--gradient_compression {setting}: --strategy {name} compresses to "
                        f"{' or '.join(allowed)} only (Horovod's "
                        f"hvd.Compression.fp16); use --gradient_compression fp16")
    if accumulate_steps > 1:
        raise UserError(f"--gradient_compression {setting} does not work with --accumulate_steps "
                        f"{accumulate_steps} (the accumulated sums are all-reduced in float32); "
                        f"drop one of them")


def check_precision(name: str, mixed_precision: str, accumulate_steps: int = 1,
                    compression: str = "none"):
    """float16 needs loss scaling, which only minimize()'s own update path has."""
    if mixed_precision != "float16":
        return
    if not spec(name).loss_scaled:
        raise UserError(f"--mixed_precision float16 does not work with --strategy {name} yet "
                        f"(no loss scaling there: float16 gradients would underflow); use one "
                        f"of {', '.join(with_feature(lambda s: s.loss_scaled))}, or "
                        f"--mixed_precision bfloat16")
    if accumulate_steps > 1:
        raise UserError(f"--mixed_precision float16 does not work with --accumulate_steps "
                        f"{accumulate_steps} yet (no loss scaling there); drop one of them")
    if compression != "none":
        raise UserError(f"--mixed_precision float16 does not work with --gradient_compression "
                        f"{compression} yet; drop one of them")


def num_replicas(name: str, devices: Devices, workers: int = 1) -> int:
    """Model replicas: tf.distribute replicas (over every worker), or the towers of `tower`."""
    return (1 if spec(name).one_device else devices.count) * workers


def calls_model_fn_per_device(name: str, devices: Devices) -> bool:
    """Whether Estimator builds several replicas' model_fn calls into one graph."""
    return spec(name).in_graph_replicas and devices.count > 1


def per_replica_batch(name: str, global_batch: int, devices: Devices, workers: int = 1) -> int:
    """The batch each replica's input_fn must produce for a GLOBAL batch.

    Under a tf.distribute strategy Estimator calls input_fn once per replica, so
    global = per-replica x replicas, and it must divide evenly. Under `tower`
    input_fn yields the whole global batch, which the towers split (any size).
    In a cluster the replicas of every worker count.
    """
    if spec(name).input_gets_global_batch:
        return global_batch
    replicas = num_replicas(name, devices, workers)
    if global_batch % replicas:
        raise UserError(
            f"--batch_size {global_batch} is not divisible by the {replicas} replicas of "
            f"--strategy {name}; use a multiple of {replicas} (e.g. "
            f"{(global_batch // replicas + 1) * replicas})" +
            (_worker_counts_note(global_batch, replicas // workers) if workers > 1 else ""))
    return global_batch // replicas


MAX_WORKERS_NAMED = 16


def _worker_counts_note(global_batch: int, per_worker: int) -> str:
    """The --workers that keep a global batch (a resume on another worker count keeps the
    run's --batch_size: docs/elastic.md)."""
    fits = [w for w in range(1, MAX_WORKERS_NAMED + 1) if global_batch % (w * per_worker) == 0]
    if not fits:
        return ""
    counts = ", ".join(map(str, fits[:-1])) + (" or " if len(fits) > 1 else "") + str(fits[-1])
    return f", or keep --batch_size {global_batch} with --workers {counts}"


def variable_device(name: str, setting: str, devices: Devices) -> Optional[str]:
    """Where `tower` keeps its variables (`--variable_device auto|cpu|device0`); None otherwise.

    `auto` (the default) is the first tower's GPU when the towers are GPUs (the field's
    default: tf_cnn_benchmarks' replicated / parameter_server on the GPU; on /cpu:0 every
    gradient and variable crosses PCIe each step) and /cpu:0 between logical CPUs.
    """
    if not spec(name).variable_device_flag:
        return None
    if setting == "auto":
        setting = "device0" if devices.kind == "GPU" else "cpu"
    return "/cpu:0" if setting == "cpu" else devices.names[0]


def make(name: str, devices: Devices):
    """The strategy object for `name` over `devices` (None for none and tower)."""
    check_name(name)
    check_devices(name, devices)
    if devices.kind == "CPU" and devices.count > 1:
        # The eager context knows one CPU; Mirrored creates a token variable per
        # device in it. After an in-process SavedModel export that creation fails
        # unless soft placement is (re)asserted; Estimator's graphs still get N CPUs
        # from the session config.
        tf.config.set_soft_device_placement(True)
    return _BUILDERS[name](devices)
