"""The StrategySpec table: one entry per --strategy, the one place that knows what each needs.

Imports no TensorFlow (the launcher reads it); the strategy objects themselves are
built in strategies.py.
"""
import difflib
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

from estimator_dist.errors import UserError


# StrategySpec.restarts
RESTART_TASK, RESTART_CLUSTER = "task", "cluster"
# StrategySpec.wraps_model_fn
TOWERS = "towers"
HOROVOD_OPTIMIZER = "horovod_optimizer"


# StrategySpec.cluster_ps: what a TF_CONFIG cluster must hold for a strategy.
PS_NEEDED, PS_REFUSED, PS_FOR_WORKERS, ONE_MACHINE = (
    "ps_needed", "ps_refused", "ps_for_workers", "one_machine")


@dataclass(frozen=True)
class StrategySpec:
    """Everything the rest of the package needs to know about one --strategy.

    (Model Garden keeps its strategy knowledge in one place, official/common/
    distribute_utils.py; this is that table for Estimator.)
    """

    name: str
    # Processes: "one" (this process), "tf_config" (a TF_CONFIG cluster), "horovod" (ranks).
    processes: str = "one"
    one_device: bool = False  # runs one device however many are asked for
    # Estimator calls the model_fn once per device, all in one graph (tower does it itself).
    in_graph_replicas: bool = False
    # The input_fn yields the GLOBAL batch (tower splits it) instead of a replica's.
    input_gets_global_batch: bool = False
    # Who wraps the model_fn around the user's: TOWERS (towers.py), HOROVOD_OPTIMIZER
    # (horovod_train.py) or "" (Estimator's strategy, or nothing).
    wraps_model_fn: str = ""
    accumulates: bool = False  # --accumulate_steps K > 1 works with it
    compressions: Tuple[str, ...] = ()  # --gradient_compression settings its all-reduce takes
    sync_replicas: bool = False  # a model_fn's own SyncReplicasOptimizer can run under it
    every_worker_saves: bool = False  # each worker writes checkpoints (MWMS), not the chief alone
    # What the local launcher restarts when a task dies: "task" (that one) or "cluster"
    # (every task: the collective ops of the survivors cannot take a new peer).
    restarts: str = RESTART_TASK  # or RESTART_CLUSTER
    variable_device_flag: bool = False  # --variable_device applies
    pins_own_gpu: bool = False  # sets its devices itself (one GPU per Horovod rank)
    # minimize() applies its gradients, so --mixed_precision float16 can scale the loss
    # (tower, accumulation and Horovod apply gradients in their own handlers).
    loss_scaled: bool = True
    # Its workers take every step together (collective all-reduce): an early stop is
    # all-reduced, so that all stop at one step (TensorFlow's multi-worker stop hook).
    stops_together: bool = False
    # Its Saver runs inside the strategy (every worker saves): no checkpoint hook of ours.
    saves_itself: bool = False
    # What a TF_CONFIG cluster needs for it (tf_config.check_strategy): PS_NEEDED, PS_REFUSED,
    # PS_FOR_WORKERS (between-graph training: ps tasks once there are two workers) or
    # ONE_MACHINE (no multi-task cluster at all).
    cluster_ps: str = ONE_MACHINE
    chief_may_be_master: bool = True  # ParameterServerStrategy knows the chief as 'chief' only

    @property
    def needs_tf_config(self) -> bool:
        return self.processes == "tf_config"

    @property
    def uses_horovod(self) -> bool:
        return self.processes == "horovod"


SPECS: Dict[str, StrategySpec] = {s.name: s for s in (
    StrategySpec("none", one_device=True, accumulates=True, sync_replicas=True,
                 cluster_ps=PS_FOR_WORKERS),
    StrategySpec("one_device", one_device=True, accumulates=True),
    StrategySpec("mirrored", in_graph_replicas=True, accumulates=True,
                 compressions=("fp16", "bf16")),
    # central_storage's variables cannot hold the per-replica accumulators.
    StrategySpec("central_storage", in_graph_replicas=True),
    StrategySpec("tower", input_gets_global_batch=True, wraps_model_fn=TOWERS,
                 accumulates=True, variable_device_flag=True, loss_scaled=False),
    StrategySpec("multi_worker_mirrored", processes="tf_config",
                 in_graph_replicas=True, compressions=("fp16", "bf16"),
                 every_worker_saves=True, restarts=RESTART_CLUSTER, stops_together=True,
                 saves_itself=True, cluster_ps=PS_REFUSED),
    StrategySpec("parameter_server", processes="tf_config",
                 in_graph_replicas=True, cluster_ps=PS_NEEDED, chief_may_be_master=False),
    # Horovod's all-reduce compresses to float16 only (hvd.Compression.fp16).
    StrategySpec("horovod", processes="horovod", wraps_model_fn=HOROVOD_OPTIMIZER,
                 compressions=("fp16",), pins_own_gpu=True, loss_scaled=False),
)}

# The strategy a local TF_CONFIG cluster runs when none is named: asynchronous
# between-graph training with ps tasks, else synchronous all-reduce.
CLUSTER_DEFAULT = {True: "parameter_server", False: "multi_worker_mirrored"}
# The strategy of a Horovod launch (`cluster --launcher horovod`).
HOROVOD = "horovod"
# The one-process strategy a TFJob with one replica runs (a one-task TF_CONFIG cluster
# is refused by TF's cluster strategies).
ONE_PROCESS_MULTI_DEVICE = "mirrored"


def names():
    return sorted(SPECS)


def check_name(name: str):
    if name not in SPECS:
        close = difflib.get_close_matches(name, names(), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UserError(f"--strategy {name}: unknown; choose one of {', '.join(names())}{hint}")


def spec(name: str) -> StrategySpec:
    """The table entry of a --strategy; refuses an unknown name."""
    check_name(name)
    return SPECS[name]


def with_feature(test: Callable[[StrategySpec], bool]) -> Tuple[str, ...]:
    """The strategies whose entry passes `test`, for the lines that list what works."""
    return tuple(name for name, s in SPECS.items() if test(s))


def is_horovod(name) -> bool:
    """A --strategy (or None, or an unknown name: False) that runs Horovod ranks."""
    return name in SPECS and SPECS[name].uses_horovod


def restarts_whole_cluster(name) -> bool:
    """A local cluster restarts every task when one of this strategy's tasks dies."""
    return name in SPECS and SPECS[name].restarts == RESTART_CLUSTER


def tf_config_strategies() -> Tuple[str, ...]:
    """The strategies that span a TF_CONFIG cluster."""
    return with_feature(lambda s: s.needs_tf_config)


def spans_tf_config(name) -> bool:
    """A --strategy (or another name: False) whose processes form a TF_CONFIG cluster."""
    return name in SPECS and SPECS[name].needs_tf_config
