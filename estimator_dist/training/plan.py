"""A run's plan: everything resolved and checked before anything is written.

`plan()` resolves the registry entries, this process's Role, its devices, the batch
split and the input's data (its prepare()), so bad input leaves model_dir untouched.
"""
import os
import types
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, List, Optional


from estimator_dist.distribute import tf_config as cluster_lib
from estimator_dist.errors import UserError
from estimator_dist.training import config as config_lib
from estimator_dist.distribute import devices as devices_lib
from estimator_dist.distribute import horovod as hvd_lib
from estimator_dist.distribute import strategies
from estimator_dist.distribute.specs import StrategySpec
from estimator_dist.distribute.role import Role
from estimator_dist.serving import export as export_lib
from estimator_dist.training.registry import INPUTS, MODELS, Entry, check_data_flags
from estimator_dist.training.user_code import SERVING_INFERRED, run_prepare


@dataclass(frozen=True)
class Plan:
    """A validated run: nothing here has touched the disk yet."""

    config: config_lib.Config
    model: Entry
    input: Entry
    devices: devices_lib.Devices
    replicas: int
    per_replica_batch: int
    input_meta: Dict[str, Any]
    model_dir: str
    role: Role  # which process this is, and what it does (roles.py)
    # The global step the training input starts at: the checkpoint's on a resume
    # (run.py sets it once it has read it; position.py).
    start_step: int = 0

    @property
    def strategy(self) -> StrategySpec:
        return self.role.strategy

    @property
    def num_workers(self) -> int:
        return self.role.num_workers

    @property
    def writes_run_files(self) -> bool:
        return self.role.writes_run_files

    @property
    def serving_input(self):
        """The export's serving input: a receiver fn named at registration, else the
        serving_features (export.receiver_fn takes either)."""
        for entry in (self.model, self.input):
            if callable(entry.serving_input):
                return entry.serving_input
        return self.input_meta["serving_features"]

    @property
    def global_batch(self) -> int:
        return self.config.train.batch_size

    def params(self) -> Dict[str, Any]:
        """What the model_fn and input_fn receive as `params`."""
        c = self.config
        # What the input's prepare() resolved (e.g. the real data_dir) wins.
        return {
            **input_params(c, self.per_replica_batch),
            **{k: v for k, v in self.input_meta.items()
               if k not in ("serving_features", "plain_features", "image_files",
                            SERVING_INFERRED, SERVING_NAMED)},
            **stream_params(c, self.strategy, self.replicas, self.start_step),
        }

    def prepared(self) -> "Plan":
        """This plan with the input's prepare() metadata (or its serving features read off
        its training data). A training task calls it once its strategy exists: reading a
        dataset that uses map() or a TFRecordDataset starts TensorFlow's eager runtime,
        after which multi_worker_mirrored can no longer configure its collective ops."""
        if self.input_meta is not DEFERRED:
            return self
        params = {**input_params(self.config, self.per_replica_batch),
                  **stream_params(self.config, self.strategy, self.replicas, self.start_step)}
        return replace(self, input_meta=named_serving_input(
            self.model, self.input, run_prepare(self.input, params)))


# Plan.input_meta until Plan.prepared() runs the input's prepare().
DEFERRED = types.MappingProxyType({})


def stream_params(config, strategy: StrategySpec, replicas: int, start_step: int = 0):
    """The run's own keys of params (docs/elastic.md): the global batch and how it is sliced,
    where the stream starts, the learning-rate scale, the gradient compression."""
    d = config.distribute
    return {
        "global_batch_size": config.train.batch_size,
        "num_replicas": replicas,
        # Exact data position (training/position.py): where the stream starts and
        # how many slices each global batch is cut into.
        "start_step": start_step,
        "batch_slices": 1 if strategy.input_gets_global_batch else replicas,
        "batches_per_step": max(1, d.accumulate_steps),
        "lr_scale": float(replicas) if d.scale_lr else 1.0,
        "gradient_compression": d.gradient_compression,
    }


def default_model_dir(config) -> str:
    return config.train.model_dir or os.path.join("runs", config.model)


def input_params(config, per_replica_batch) -> Dict[str, Any]:
    return {**config.hparams, "batch_size": per_replica_batch, "data_dir": config.data.data_dir,
            "data_path": config.data.data_path, "label_column": config.data.label_column,
            "synthetic": config.data.synthetic, "reader_nice": config.data.reader_nice,
            "train_steps": config.train.train_steps,
            "seed": config.train.seed if config.train.seed >= 0 else None}


def plan(config: config_lib.Config, input_meta: Optional[Dict[str, Any]] = None,
         defer_prepare: bool = False) -> Plan:
    """Resolve and check everything a run needs; raises UserError, writes nothing.

    defer_prepare: leave the input's prepare() to Plan.prepared() (a training task runs it
    once its strategy is built)."""
    model, input_entry = _entries(config)
    name = config.distribute.strategy
    cluster = cluster_lib.from_env(name, ps=config.distribute.ps,
                                   evaluator=config.distribute.evaluator)
    role = Role.of(name, cluster, hvd_lib.init() if strategies.spec(name).uses_horovod else None)
    workers = role.num_workers if role.horovod or (cluster and cluster.is_distributed) else 1
    devices = (hvd_lib.devices(config.distribute.num_devices) if role.horovod
               else devices_lib.resolve(config.distribute.num_devices,
                                        single_device=strategies.runs_one_device(name)))
    claimed = strategies.gpus_to_claim(name, devices) if role.computes else ()
    if claimed or (not role.computes and devices.kind == "GPU"):
        devices_lib.claim_gpus(claimed)  # a ps keeps none: its variables stay on its CPU
    per_replica = _per_replica_batch(config, devices, workers)
    p = Plan(config=config, model=model, input=input_entry, devices=devices,
             replicas=strategies.num_replicas(name, devices, workers),
             per_replica_batch=per_replica, input_meta=DEFERRED if input_meta is None
             else input_meta, model_dir=default_model_dir(config), role=role)
    return p if defer_prepare else p.prepared()


# input_meta key: who named the serving input (registration's serving_input), e.g. "model
# 'mnist'"; its shapes are the model's to choose, so training's are not compared with them.
SERVING_NAMED = "serving_input_named_by"


def named_serving_input(model: Entry, input_entry: Entry, input_meta: Dict[str, Any]):
    """input_meta with the serving input a model (first) or input named at registration."""
    owner, named = next(((f"{kind} '{e.name}'", e.serving_input)
                         for kind, e in (("model", model), ("input", input_entry))
                         if e.serving_input is not None), (None, None))
    if named is None:
        return input_meta
    meta = {k: v for k, v in input_meta.items() if k != SERVING_INFERRED}
    if callable(named):
        named = export_lib.receiver_features(named, owner)
    return {**meta, "serving_features": named, SERVING_NAMED: owner}


def check_cluster_run(config: config_lib.Config, workers: int, local: bool):
    """What every training task of a cluster of `workers` (the chief counted) would refuse at
    its start, checked once: by `cluster` before it launches, by `tfjob` before it writes.

    local: the tasks run on this machine, whose devices and data they use (devices
    resolved here, the input's prepare() run here); else (a TFJob's pods) the devices
    are what --num_devices asks for, one when auto, so the batch check there is the
    part every pod shape must pass.
    """
    _, input_entry = _entries(config)
    n = config.distribute.num_devices
    if strategies.spec(config.distribute.strategy).uses_horovod:
        devices = hvd_lib.devices(n, gpus=None if local else n)
    else:
        devices = devices_lib.resolve(n, gpus=None if local else n,
                                      single_device=strategies.runs_one_device(
                                          config.distribute.strategy))
    per_replica = _per_replica_batch(config, devices, workers)
    if local:
        name = config.distribute.strategy
        run_prepare(input_entry, {
            **input_params(config, per_replica),
            **stream_params(config, strategies.spec(name),
                            strategies.num_replicas(name, devices, workers))})


def cluster_sizes(config: config_lib.Config, low: int, high: int) -> List[int]:
    """The worker counts in low..high whose replicas split the global batch: the sizes of an
    elastic cluster on this machine (none: what the first would refuse, raised)."""
    _entries(config)
    devices = devices_lib.resolve(config.distribute.num_devices, gpus=None,
                                  single_device=strategies.runs_one_device(
                                      config.distribute.strategy))
    sizes, refusal = [], None
    for workers in range(low, high + 1):
        try:
            _per_replica_batch(config, devices, workers)
            sizes.append(workers)
        except UserError as e:
            refusal = refusal or e
    if not sizes:
        raise refusal
    return sizes


def _entries(config: config_lib.Config):
    """(model entry, input entry) of a validated config."""
    config_lib.validate(config)
    model = MODELS.get(config.model)
    input_entry = INPUTS.get(config.data.input or model.default_input or config.model)
    check_data_flags(input_entry, asdict(config.data))
    strategies.check_name(config.distribute.strategy)
    return model, input_entry


def _per_replica_batch(config: config_lib.Config, devices, workers: int) -> int:
    name = config.distribute.strategy
    strategies.check_devices(name, devices)
    strategies.check_accumulate(name, config.distribute.accumulate_steps)
    strategies.check_compression(name, config.distribute.gradient_compression,
                                 config.distribute.accumulate_steps)
    strategies.check_precision(name, config.compute.mixed_precision,
                               config.distribute.accumulate_steps,
                               config.distribute.gradient_compression)
    return strategies.per_replica_batch(name, config.train.batch_size, devices, workers)


def log_every(train_steps: int) -> int:
    """Steps between progress lines and loss summaries: ~10 per run, at most every 100."""
    return max(1, min(100, train_steps // 10))


def plain_features_note(p: Plan) -> str:
    """Where a model's one-tensor features go in a SavedModel (export.PLAIN_FEATURE)."""
    (name, (shape, dtype)), = p.input_meta["serving_features"].items()
    return (f"features are one tensor, not a dict: SavedModels take it as serving input "
            f"'{name}' {shape} {dtype} (predict --input: one .npy array or CSV column '{name}')")


def describe(p: Plan) -> str:
    c = p.config
    d = c.distribute
    if p.strategy.input_gets_global_batch:  # tower: the towers split the global batch
        big, small = -(-p.global_batch // p.replicas), p.global_batch // p.replicas
        split = f"{big}" if big == small else f"{big} or {small}"
        batch = (f"global batch {p.global_batch} split into {p.replicas} tower(s) of {split}, "
                 f"variables on "
                 f"{strategies.variable_device(d.strategy, d.variable_device, p.devices)}")
    else:
        batch = (f"global batch {p.global_batch} = {p.per_replica_batch} x {p.replicas} "
                 f"replica(s)")
    if d.accumulate_steps > 1:
        batch += (f", {d.accumulate_steps} batches per update "
                  f"({p.global_batch * d.accumulate_steps} examples)")
    if d.gradient_compression != "none":
        batch += (f", gradients all-reduced in {d.gradient_compression} "
                  f"(--gradient_compression; applied in float32)")
    where = p.role.where(f"{p.devices.count} {p.devices.kind}(s)")
    return (f"model {c.model} | input {p.input.name} | strategy {d.strategy} on {where} | "
            f"{batch} | model_dir {p.model_dir}")
