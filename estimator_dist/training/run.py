"""A run, built from small steps: plan -> strategy -> RunConfig -> Estimator -> specs -> run.

`plan()` resolves and validates everything (registry lookups, devices, batch
split, the input's data) before anything is written, so bad input leaves
model_dir untouched.
"""
import contextlib
import glob
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf

from estimator_dist.training import checkpoints as checkpoints_lib
from estimator_dist.distribute import tf_config as cluster_lib
from estimator_dist.training import config as config_lib
from estimator_dist.distribute import devices as devices_lib
from estimator_dist.training import early_stopping
from estimator_dist.training import evaluator as evaluator_lib
from estimator_dist.serving import export as export_lib
from estimator_dist import files
from estimator_dist.guards import training_guard as guards
from estimator_dist.distribute import horovod as hvd_lib
from estimator_dist.distribute import horovod_train
from estimator_dist.guards import memory
from estimator_dist.guards import model_dir_lock
from estimator_dist.training import model_fn_wrap
from estimator_dist.graph import numerics
from estimator_dist.graph import precision
from estimator_dist.guards import preemption
from estimator_dist import quiet
from estimator_dist.graph import replica_collections
from estimator_dist.training import saver_hook
from estimator_dist.guards import storage
from estimator_dist.distribute import strategies
from estimator_dist.graph import sync_replicas
from estimator_dist.graph import towers
from estimator_dist.graph import xla
from estimator_dist.errors import (OutOfMemory, ReportedError, TrainingFailed,
                                   UntrainableTrainOp, UserError, first_line, op_error_line)
from estimator_dist.training.hooks import ProgressHook, TrainOpCheckHook
from estimator_dist.training.registry import INPUTS, MODELS, Entry, check_data_flags


def load_builtins():
    """Import the built-in model_fns and input_fns (imports force registration)."""
    importlib.import_module("model_fns")
    importlib.import_module("input_fns")


def import_user_modules(modules):
    """`--import my.module`: import modules that register more models and inputs.

    The working directory comes first on sys.path, as under `python -m`: the console
    script does not put it there, and a module beside the user failed to import.
    """
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            if e.name and e.name != name and not name.startswith(e.name + "."):
                raise UserError(f"--import {name}: it imports '{e.name}', which is missing "
                                f"({e}); install that package") from None
            raise UserError(f"--import {name}: cannot import it ({e}); run from the directory "
                            f"that holds it ({name.replace('.', '/')}.py or its package), add that "
                            f"directory to PYTHONPATH, or pip install it") from None
        except UserError as e:  # a registration the registry refused: its message says the fix
            raise UserError(f"--import {name}: {e}") from None
        except SystemExit as e:  # would end the command, exit 0 included, having run nothing
            raise UserError(f"--import {name}: importing it called sys.exit({e.code!r}); a module "
                            f"given to --import must only define and register (guard its script "
                            f"part with if __name__ == '__main__':)") from None
        except Exception as e:  # noqa: BLE001 - the module's own code failed on import
            raise UserError(f"--import {name}: importing it failed: {type(e).__name__}: "
                            f"{first_line(e)}; fix the "
                            f"module (run 'python -c \"import {name}\"' to see the traceback)") from None


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
    cluster: Optional[cluster_lib.ClusterSpec] = None
    ranks: Optional[hvd_lib.Ranks] = None  # --strategy horovod

    @property
    def role(self) -> str:
        """local, chief, worker, ps or evaluator (Horovod: rank 0 is the chief)."""
        if self.cluster:
            return self.cluster.task_type
        if self.ranks and self.ranks.size > 1:
            return "chief" if self.ranks.is_root else "worker"
        return "local"

    @property
    def num_workers(self) -> int:
        """Training processes: the cluster's workers, or the Horovod ranks."""
        if self.cluster:
            return self.cluster.num_workers
        return self.ranks.size if self.ranks else 1

    @property
    def writes_run_files(self) -> bool:
        return self.role in ("local", "chief")

    @property
    def evaluates(self) -> bool:
        """This task evaluates (local, the evaluator, Horovod's rank 0), or it is the chief of
        a cluster whose evaluator does: a run it would fail is refused by the chief first."""
        if self.role == "chief":
            return bool(self.ranks) or self.cluster.has_evaluator
        return self.role in ("local", "evaluator")

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
               if k not in ("serving_features", "plain_features", SERVING_INFERRED)},
            "global_batch_size": self.global_batch,
            "num_replicas": self.replicas,
            "lr_scale": float(self.replicas) if c.distribute.scale_lr else 1.0,
            "gradient_compression": c.distribute.gradient_compression,
        }


def default_model_dir(config) -> str:
    return config.train.model_dir or os.path.join("runs", config.model)


def input_params(config, per_replica_batch) -> Dict[str, Any]:
    return {**config.hparams, "batch_size": per_replica_batch, "data_dir": config.data.data_dir,
            "data_path": config.data.data_path, "label_column": config.data.label_column,
            "synthetic": config.data.synthetic, "reader_nice": config.data.reader_nice,
            "train_steps": config.train.train_steps,
            "seed": config.train.seed if config.train.seed >= 0 else None}


def users_code(call, what: str, fix):
    """call(), with an exception of the user's code as one line naming it (`fix`: the advice,
    or a function of the exception giving it); --verbose keeps the traceback. Our own
    one-line errors pass unchanged, among them Preempted, which SIGTERM raises wherever the
    main thread is (a graph build included)."""
    try:
        return call()
    except ReportedError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of a model_fn's or input's own code
        reported = reported_cause(e)
        if reported is not None:
            raise reported from None
        if not quiet.is_quiet():
            raise
        fix = fix(e) if callable(fix) else fix
        raise UserError(f"{what}: {type(e).__name__}: {first_line(e)}; {fix}; --verbose shows "
                        f"the traceback") from None


def reported_cause(error: BaseException) -> Optional[ReportedError]:
    """A ReportedError that `error` was raised from or during: code that turns every exception
    into its own (inspect.getfullargspec: TypeError 'unsupported callable') hid the
    Preempted that SIGTERM raised inside it (an `export` stopped that way exited 2)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ReportedError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def run_prepare(entry: Entry, params) -> Dict[str, Any]:
    """The input's prepare() metadata, checked: a dict of plain data with serving_features,
    overriding none of the run's settings or hparams."""
    if entry.prepare is None:
        return inferred_input_meta(entry, params)
    where = f"input '{entry.name}': its prepare()"
    meta = users_code(lambda: entry.prepare(params), f"{where} failed", "fix the input")
    if not isinstance(meta, dict):
        raise UserError(f"{where} returned {type(meta).__name__}; it must return a dict with "
                        f"serving_features (see README, Bring your own model)")
    if "serving_features" not in meta:  # read them off its data, as without a prepare()
        meta = {**meta, **inferred_input_meta(entry, params)}
    # prepare() may resolve what the run left open ('' / 'auto' / None: a label column, a
    # task) or make a path absolute (data_dir); it may not replace a value the run sets.
    clash = sorted(k for k in meta if k in params and k != "data_dir" and
                   params[k] not in ("", "auto", None) and meta[k] != params[k])
    if clash:
        raise UserError(f"{where} returned {', '.join(clash)}, which the run already sets "
                        f"(flags, hparams); it would silently replace them: rename those keys")
    try:
        json.dumps(meta)  # saved into model_dir; must be plain data
    except (TypeError, ValueError) as e:
        raise UserError(f"{where} returned data that is not plain JSON ({e}); return lists, "
                        f"numbers and strings") from None
    export_lib.check_serving_features(meta["serving_features"], where)
    return meta


# input_meta key: serving_features were read off the training dataset (said at the start).
SERVING_INFERRED = "serving_features_inferred"


def inferred_input_meta(entry: Entry, params) -> Dict[str, Any]:
    """An input without serving_features from a prepare(): they are what its TRAIN dataset
    yields, read from a scratch graph (export.inferred_serving_features)."""
    fn = checked_input(entry.fn, entry.name, eval_steps=1)
    with tf.Graph().as_default():
        data = fn(tf.estimator.ModeKeys.TRAIN, params)
        return {**export_lib.inferred_serving_features(data, entry.name), SERVING_INFERRED: True}


def plan(config: config_lib.Config, input_meta: Optional[Dict[str, Any]] = None) -> Plan:
    """Resolve and check everything a run needs; raises UserError, writes nothing."""
    model, input_entry = _entries(config)
    name = config.distribute.strategy
    spec = cluster_lib.from_env(name)
    ranks = hvd_lib.init() if name == "horovod" else None
    workers = spec.num_workers if spec and spec.is_distributed else ranks.size if ranks else 1
    devices = (hvd_lib.devices(config.distribute.num_devices) if ranks
               else devices_lib.resolve(config.distribute.num_devices,
                                        single_device=strategies.runs_one_device(name)))
    claimed = strategies.gpus_to_claim(name, devices)
    if claimed:
        devices_lib.claim_gpus(claimed)
    per_replica = _per_replica_batch(config, devices, workers)
    if input_meta is None:
        input_meta = run_prepare(input_entry, input_params(config, per_replica))
    return Plan(config=config, model=model, input=input_entry, devices=devices,
                replicas=strategies.num_replicas(name, devices, workers),
                per_replica_batch=per_replica, input_meta=input_meta,
                model_dir=default_model_dir(config), cluster=spec, ranks=ranks)


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
    if config.distribute.strategy == "horovod":
        devices = hvd_lib.devices(n, gpus=None if local else n)
    else:
        devices = devices_lib.resolve(n, gpus=None if local else n,
                                      single_device=strategies.runs_one_device(
                                          config.distribute.strategy))
    per_replica = _per_replica_batch(config, devices, workers)
    if local:
        run_prepare(input_entry, input_params(config, per_replica))


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


def build_run_config(p: Plan, strategy,
                     scratch_dir: Optional[str] = None) -> tf.estimator.RunConfig:
    """RunConfig for this task; it also reads TF_CONFIG, so cluster.apply() comes first.

    scratch_dir: a Horovod rank > 0 trains there and saves no checkpoints or
    summaries; rank 0 owns model_dir.
    """
    t = p.config.train
    own = scratch_dir is None
    return tf.estimator.RunConfig(
        model_dir=p.model_dir if own else scratch_dir,
        tf_random_seed=t.seed if t.seed >= 0 else None,
        save_checkpoints_steps=(config_lib.checkpoint_every(p.config) or None) if own else None,
        save_checkpoints_secs=(t.eval_every_secs or None) if own else None,
        keep_checkpoint_max=t.keep_checkpoint_max,
        log_step_count_steps=None,
        save_summary_steps=log_every(t.train_steps) if own else 0,
        session_config=session_config(p),
        train_distribute=strategy,
        eval_distribute=strategy,
    )


def session_config(p: Plan) -> tf.compat.v1.ConfigProto:
    config = p.devices.session_config(jit=p.config.compute.jit)
    if p.config.compute.jit and quiet.is_quiet():
        xla.compile_once_quietly()
    if p.ranks:
        return hvd_lib.session_config(config, p.devices, p.ranks, devices_lib.available_cores())
    return config


def build_model_fn(p: Plan):
    """The registered model_fn, wrapped into towers, gradient accumulation or Horovod if asked.

    Outermost, --mixed_precision: the whole graph build runs under its Keras policy.
    """
    d = p.config.distribute
    user_fn = sync_replicas.checked(
        model_fn_wrap.estimator_call(p.model.fn),
        refused_by=strategies.sync_replicas_refused_by(d.strategy, d.accumulate_steps))
    model_fn = serving_checked(seeded(user_fn, p.config.train.seed),
                               p.input_meta["serving_features"], p.input.name,
                               plain=bool(p.input_meta.get("plain_features")))
    if d.strategy == "horovod":
        model_fn = horovod_train.wrap_model_fn(model_fn, p.model.name)
    elif d.strategy == "tower" or d.accumulate_steps > 1:
        tower_devices = p.devices.names if d.strategy == "tower" else ()
        model_fn = towers.tower_model_fn(
            model_fn, p.model.name, devices=tower_devices,
            variable_device=strategies.variable_device(d.strategy, d.variable_device, p.devices),
            accumulate_steps=d.accumulate_steps)
    if strategies.calls_model_fn_per_device(d.strategy, p.devices):
        model_fn = replica_collections.per_replica(model_fn)
    model_fn = ordered_checks(model_fn, checks_after_last_gradient(p))
    model_fn = memory_checked(model_fn, p.role == "local")
    model_fn = precision.wrap_model_fn(model_fn, p.config.compute.mixed_precision, p.model.name)
    return reported_build_errors(model_fn, p.model.name, p.input.name)


def serving_checked(model_fn, serving_features, input_name: str, plain: bool = False):
    """A TRAIN graph's features must be what the input's serving_features promise
    (export.check_training_features): refused before the first step, not in predict.
    With plain features (one tensor) the serving receiver's one-entry dict is handed to
    the model_fn as the tensor it takes in training.

    Innermost: it sees exactly what the model_fn is given (a replica's, a tower's slice).
    model_fn: with the full signature (model_fn_wrap.estimator_call).
    """
    def checked_model_fn(features, labels, mode, params, config=None):
        if mode == model_fn_wrap.TRAIN:
            export_lib.check_training_features(features, serving_features, input_name, plain)
        if plain and isinstance(features, dict) and len(features) == 1:
            features = next(iter(features.values()))
        return model_fn(features, labels, mode, params, config)

    return checked_model_fn


def memory_checked(model_fn, enabled: bool):
    """Refuse a TRAIN graph whose variables cannot fit in memory (memory.variables_checked).

    Only a local run: in a cluster they may live on parameter servers elsewhere.
    """
    if not enabled:
        return model_fn

    def call(mode, build):
        if mode != model_fn_wrap.TRAIN:
            return build()
        with memory.variables_checked():
            return build()

    return model_fn_wrap.around(model_fn, call)


def checks_after_last_gradient(p: Plan) -> bool:
    """One CPU replica whose kernels use several threads: see numerics.checks_after_last_gradient."""
    threads = session_config(p).intra_op_parallelism_threads or devices_lib.available_cores()
    return p.devices.kind == "CPU" and p.devices.count == 1 and threads > 1


def ordered_checks(model_fn, after_last_gradient: bool):
    def call(mode, build):
        with numerics.checks_after_last_gradient(after_last_gradient):
            return build()

    return model_fn_wrap.around(model_fn, call)


def reported_build_errors(model_fn, name: str, input_name: str):
    """A model_fn whose graph build fails (a bad hparam value TF refuses, a feature the input
    does not give, any exception of its own) or returns no EstimatorSpec is one line;
    --verbose keeps the traceback."""
    def call(arguments, build):
        mode = arguments.get("mode")
        spec = users_code(build, f"model '{name}' could not build its {mode or ''} graph",
                          lambda error: build_fix(arguments, input_name, error))
        if not isinstance(spec, tf.estimator.EstimatorSpec):
            raise UserError(f"model '{name}' returned {type(spec).__name__} from its "
                            f"{mode or ''} call; a model_fn must return a "
                            f"tf.estimator.EstimatorSpec (e.g. estimator_dist.classification_spec)")
        return spec

    return model_fn_wrap.around_arguments(model_fn, call)


def build_fix(arguments, input_name: str, error: Optional[BaseException] = None) -> str:
    """What to check when a model_fn's build fails. Given labels=None in TRAIN or EVAL, the
    input gave features alone: the hparams advice of other failures misled there. In
    PREDICT (export, serving) labels=None is Estimator's rule: said when the error is about
    a None (a model_fn broken in every mode fails its PREDICT build first, for other
    reasons)."""
    if arguments.get("mode") == tf.estimator.ModeKeys.PREDICT and "None" in str(error):
        return ("PREDICT mode (the export, serving) passes labels=None and only the serving "
                "features: return the PREDICT EstimatorSpec (predictions, export_outputs) "
                "before using labels")
    if arguments.get("mode") in (tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL) and \
            "labels" in arguments and arguments["labels"] is None:
        return (f"it was given labels=None: input '{input_name}' gives features without labels; "
                f"an input_fn returns a tf.data.Dataset of (features, labels), e.g. "
                f"tf.data.Dataset.from_tensor_slices((features, labels))")
    return ("check its hparams (--set, config.yaml; 'estimator-dist list') and that the input "
            "gives the features it reads (--input)")


def seeded(model_fn, seed: int):
    """With --seed, every graph build starts from the same Python/NumPy/TF seeds.

    RunConfig's tf_random_seed alone does not fix Keras initialisers, which draw
    their op seeds from Python's `random`: two seeded runs then start from
    different weights (measured).
    """
    if seed < 0:
        return model_fn

    def call(mode, build):
        tf.keras.utils.set_random_seed(seed)
        return build()

    return model_fn_wrap.around(model_fn, call)


def check_eval_metric_names(p: Plan):
    """--early_stop and --export best's --best_metric must name a metric evaluation reports.

    Checked on a scratch EVAL graph (only when one of them is asked for): otherwise a
    typo shows only at the first evaluation, after checkpoints are written, or never.
    """
    t = p.config.train
    asked = [(flag, metric) for flag, metric in (("--early_stop", t.early_stop),
                                                 ("--best_metric", t.best_metric))
             if metric and (flag == "--early_stop" or t.export == "best")]
    if not asked:
        return
    known = checkpoints_lib.in_scratch_graph(
        build_model_fn(p), make_input_fn(p, tf.estimator.ModeKeys.EVAL), p.params(),
        tf.estimator.ModeKeys.EVAL, None, lambda spec: sorted({"loss", *spec.eval_metric_ops}))
    for flag, metric in asked:
        if metric not in known:
            raise UserError(f"{flag} {metric}: not an eval metric of this model; it reports "
                            f"{', '.join(known)}")


def check_predict_graph(p: Plan):
    """A model_fn that cannot build its PREDICT graph (it uses labels whatever the mode)
    trained the whole run and failed at the final export: built first in a scratch graph,
    as export builds it (serving placeholders, labels=None), when the run exports."""
    if p.config.train.export == "none":
        return
    checkpoints_lib.in_scratch_graph(
        build_model_fn(p), export_lib.serving_input_fn(p.input_meta["serving_features"]),
        p.params(), tf.estimator.ModeKeys.PREDICT, None, lambda spec: None)


def check_eval_input_ends(p: Plan):
    """With --eval_steps 0 an evaluation runs until its input ends: an eval dataset that
    repeat()s forever (TF1 code often repeats in every mode) hung after training, silently.

    Its tf.data cardinality, read in a scratch graph before anything is written.
    """
    if p.config.train.eval_steps:
        return
    input_fn = make_input_fn(p, tf.estimator.ModeKeys.EVAL)
    with tf.Graph().as_default() as graph:
        data = input_fn()
        if not isinstance(data, tf.data.Dataset):
            return  # tensors: check_input_result refuses them with --eval_steps 0
        cardinality = tf.data.experimental.cardinality(data)
        try:
            with tf.compat.v1.Session(graph=graph) as session:
                value = session.run(cardinality)
        except tf.errors.OpError:
            return  # cannot tell here; Estimator runs the input as it is
    if value == tf.data.experimental.INFINITE_CARDINALITY:
        raise UserError(f"input '{p.input.name}' repeats forever in its eval call (its "
                        f"dataset's cardinality is infinite): with --eval_steps 0 (the whole "
                        f"eval set) the evaluation would never end; give --eval_steps N, or "
                        f"repeat() only in TRAIN mode")


def warm_start_settings(p: Plan):
    """--warm_start_from: a checkpoint, or a model_dir's latest; used only by a new run."""
    source = p.config.train.warm_start_from
    if not source:
        return None
    if os.path.isdir(source):
        latest = tf.train.latest_checkpoint(source)
        if not latest:
            raise UserError(f"--warm_start_from {source}: the directory holds no checkpoint")
        source = latest
    pattern = p.config.train.warm_start_vars
    try:
        stored = dict(tf.train.list_variables(source))
    except (tf.errors.OpError, ValueError) as e:
        raise UserError(f"--warm_start_from {source}: not a readable checkpoint "
                        f"({first_line(e)}); give a model_dir or a checkpoint prefix such as "
                        f"DIR/model.ckpt-1000 (no .index/.data suffix)") from None
    if not stored:
        raise UserError(f"--warm_start_from {source}: no checkpoint there; give a model_dir or a "
                        f"checkpoint prefix such as DIR/model.ckpt-1000 (no .index/.data suffix)")
    if not any(re.match(pattern, name) for name in stored):
        raise UserError(f"--warm_start_vars {pattern!r} matches none of the {len(stored)} variables "
                        f"of {source} (e.g. {', '.join(sorted(stored)[:3])}); the run would start "
                        f"from scratch: fix the regex (matched from the start of the name)")
    check_warm_start_fits(p, source, pattern, stored)
    return tf.estimator.WarmStartSettings(source, vars_to_warm_start=pattern)


def check_warm_start_fits(p: Plan, source: str, pattern: str, stored):
    """Every trainable variable the regex picks must be in the checkpoint with its shape
    (Estimator's warm start raises a ValueError deep in graph building otherwise)."""
    picked = checkpoints_lib.in_scratch_graph(
        build_model_fn(p), make_input_fn(p, tf.estimator.ModeKeys.TRAIN), p.params(),
        tf.estimator.ModeKeys.TRAIN, None, lambda spec: {
            v.op.name: v.shape.as_list() for v in tf.compat.v1.trainable_variables()
            if re.match(pattern, v.op.name)})
    problems = checkpoints_lib.compare(picked, {k: list(v) for k, v in stored.items()},
                                       extras=False)
    if problems:
        raise UserError(f"--warm_start_from {source}: {'; '.join(problems)}; narrow "
                        f"--warm_start_vars (now {pattern!r}) to the variables that still fit")


def build_estimator(p: Plan, run_config, warm_start=None) -> tf.estimator.Estimator:
    model_fn = saver_hook.with_saver_hook(build_model_fn(p), run_config)
    return tf.estimator.Estimator(model_fn=model_fn, config=run_config,
                                  params=p.params(), warm_start_from=warm_start)


def make_input_fn(p: Plan, mode):
    """An Estimator input_fn `(config, input_context)` calling the registered one as
    Estimator would (model_fn_wrap.input_call), checked."""
    params = p.params()
    fn = checked_input(p.input.fn, p.input.name, p.config.train.eval_steps)
    if p.ranks and mode == tf.estimator.ModeKeys.TRAIN:
        return horovod_train.train_input_fn(fn, params, p.ranks.rank, p.ranks.size, p.input.name)
    if p.ranks:  # rank 0 evaluates alone, on one device: --eval_steps counts global batches
        params = {**params, "batch_size": p.global_batch}

    def input_fn(config=None, input_context=None):
        data = fn(mode, params, config, input_context)
        if mode == tf.estimator.ModeKeys.TRAIN:
            memory.check_batch_fits(data, params, p.input.name)
        return data

    return input_fn


def checked_input(fn, name: str, eval_steps: int):
    """The registered input_fn as `(mode, params, config=None, input_context=None)`
    (model_fn_wrap.input_call), its failures one line, its result checked
    (check_input_result)."""
    fn = model_fn_wrap.input_call(fn)

    def call(mode, params, config=None, input_context=None):
        data = users_code(lambda: fn(mode, params, config, input_context),
                          f"input '{name}' failed in its {mode} call",
                          "fix its input_fn (it returns a tf.data.Dataset of (features, labels))")
        check_input_result(data, name, mode, eval_steps)
        return data

    call.takes_context = fn.takes_context
    return call


def check_input_result(data, name: str, mode, eval_steps: int):
    """What Estimator would fail on with a traceback, or hang on, as one line: elements that
    are not (features, labels) pairs; an evaluation of the whole eval set (--eval_steps 0)
    from tensors that never end (no tf.data.Dataset and no queue runner to end them);
    numpy arrays or Python values, not tensors (the model_fn failed on them deep inside a
    layer: "AttributeError: ... has no attribute 'base_dtype'")."""
    spec = data.element_spec if isinstance(data, tf.data.Dataset) else data
    if isinstance(spec, (tuple, list)) and len(spec) != 2:
        what = (f"a tf.data.Dataset of {len(spec)}-item {type(spec).__name__}s"
                if isinstance(data, tf.data.Dataset) else
                f"a {type(spec).__name__} of {len(spec)} items")
        raise UserError(f"input '{name}' returned {what} from its {mode} call; an input_fn "
                        f"returns (features, labels) pairs, features a dict of tensors")
    plain = [] if isinstance(data, tf.data.Dataset) else \
        [leaf for leaf in tf.nest.flatten(data) if not tf.is_tensor(leaf)]
    if plain:
        kind = "numpy arrays" if isinstance(plain[0], np.ndarray) else \
            f"{type(plain[0]).__name__} values"
        raise UserError(f"input '{name}' returned {kind}, not tensors, from its {mode} call; an "
                        f"input_fn returns a tf.data.Dataset of (features, labels), e.g. "
                        f"tf.data.Dataset.from_tensor_slices((features, labels))"
                        f".batch(params['batch_size'])")
    if mode == tf.estimator.ModeKeys.EVAL and not eval_steps and \
            not isinstance(data, tf.data.Dataset) and \
            not tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
        raise UserError(f"input '{name}' returned tensors, not a tf.data.Dataset, from its "
                        f"eval call: with --eval_steps 0 (the whole eval set) the evaluation "
                        f"would never end; return a tf.data.Dataset, or give --eval_steps N")


def build_specs(p: Plan, hooks):
    t = p.config.train
    train_spec = tf.estimator.TrainSpec(
        make_input_fn(p, tf.estimator.ModeKeys.TRAIN), max_steps=t.train_steps, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(
        make_input_fn(p, tf.estimator.ModeKeys.EVAL), steps=t.eval_steps or None,
        exporters=export_lib.make_exporters(
            t.export, p.input_meta["serving_features"], t.keep_checkpoint_max, t.best_metric,
            config_lib.higher_is_better(t.best_metric, t.higher_is_better)),
        start_delay_secs=0, throttle_secs=t.eval_every_secs)
    return train_spec, eval_spec


def training_hooks(p: Plan, estimator, progress: ProgressHook, say):
    """The progress hook, plus early stopping when asked (every task runs it)."""
    t = p.config.train
    if p.ranks:
        return horovod_hooks(p, estimator, progress, say)
    hooks = [progress]
    if t.early_stop and p.role != "evaluator":
        hooks.append(early_stopping.make_hook(
            estimator, t.early_stop, config_lib.higher_is_better(t.early_stop, t.higher_is_better),
            t.patience, t.min_delta, every_steps=config_lib.checkpoint_every(p.config) or
            log_every(t.train_steps), say=say))
    return hooks


def train_op_check(p: Plan) -> TrainOpCheckHook:
    """The hook that stops a train_op that cannot train (global step or weights that never
    move) after its first few updates."""
    return TrainOpCheckHook(p.model.name, runs_per_step=p.config.distribute.accumulate_steps,
                            weights_check_steps=p.config.train.weights_check_steps,
                            learning_rate=p.params().get("learning_rate"))


def horovod_hooks(p: Plan, estimator, progress: ProgressHook, say):
    """Broadcast first (before anything reads the step), then stop-together, then progress.

    Early stopping is rank 0's decision (it alone evaluates), voted to every rank.
    """
    t = p.config.train
    should_stop = None
    if t.early_stop and p.ranks.is_root:
        should_stop = early_stopping.make_should_stop(
            estimator.eval_dir(), t.early_stop,
            config_lib.higher_is_better(t.early_stop, t.higher_is_better), t.patience,
            t.min_delta, say)
    every = config_lib.checkpoint_every(p.config) or log_every(t.train_steps)
    return [horovod_train.BroadcastHook(),
            horovod_train.StopTogetherHook(should_stop, every, say), progress]


def checkpoint_step(model_dir: str) -> Optional[int]:
    latest = tf.train.latest_checkpoint(model_dir) if os.path.isdir(model_dir) else None
    return int(latest.rsplit("-", 1)[1]) if latest else None


def plain_features_note(p: Plan) -> str:
    """Where a model's one-tensor features go in a SavedModel (export.PLAIN_FEATURE)."""
    (name, (shape, dtype)), = p.input_meta["serving_features"].items()
    return (f"features are one tensor, not a dict: SavedModels take it as serving input "
            f"'{name}' {shape} {dtype} (predict --input: one .npy array or CSV column '{name}')")


def describe(p: Plan) -> str:
    c = p.config
    d = c.distribute
    if d.strategy == "tower":
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
    where = f"{p.devices.count} {p.devices.kind}(s)"
    if p.ranks:
        alone = "" if p.ranks.launched else " (not started by a Horovod launcher: one process)"
        where = f"rank {p.ranks.rank} of {p.ranks.size}{alone}, {where} each"
    if p.cluster:
        where = (f"{p.role}:{p.cluster.task_index} of {p.cluster.num_workers} worker(s), "
                 f"{p.cluster.num_ps} ps, {where} each")
    return (f"model {c.model} | input {p.input.name} | strategy {d.strategy} on {where} | "
            f"{batch} | model_dir {p.model_dir}")


def save_run_files(p: Plan):
    """Write the resolved config into model_dir (the chief's job)."""
    os.makedirs(p.model_dir, exist_ok=True)
    config_lib.save(p.config, p.model_dir, extra={
        "input": p.input.name,
        "devices": list(p.devices.names),
        "replicas": p.replicas,
        "per_replica_batch": p.per_replica_batch,
        "input_meta": p.input_meta,
    })


def write_summary(path: str, summary: Dict[str, Any]):
    files.write_text(path, json.dumps(summary, indent=2, sort_keys=True))


def plain(value):
    """numpy scalars -> Python numbers for JSON."""
    return value.item() if hasattr(value, "item") else value


def silent(*_):
    pass


def final_eval_metrics(model_dir: str) -> Dict[str, Any]:
    """The last evaluation's scalars from model_dir/eval (the evaluator task's result)."""
    latest: Dict[str, Any] = {}
    best_step = -1
    for path in sorted(glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            values = {v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")}
            if values and event.step >= best_step:
                best_step, latest = event.step, {**values, "global_step": event.step}
    return latest


def export_from_chief(p: Plan) -> Optional[str]:
    """With no evaluator task nobody runs the exporters: the chief exports the final checkpoint
    (once: None when a restart of the cluster finds it exported already)."""
    base = os.path.join(p.model_dir, export_lib.EXPORT_SUBDIR, "final")
    latest = tf.train.latest_checkpoint(p.model_dir)
    if latest and export_lib.export_of_step(base, checkpoints_lib.step_of(latest)):
        return None
    with cluster_lib.local_only():
        estimator = single_device_estimator(p)
    return export_lib.export_saved_model(estimator, p.input_meta["serving_features"], base,
                                         latest)


def rotated_away(error: Exception) -> bool:
    """The evaluator lost the race with keep_checkpoint_max: its checkpoint was deleted."""
    return isinstance(error, tf.errors.NotFoundError) or (
        isinstance(error, ValueError) and "not a valid checkpoint" in str(error))


def resume_step(p: Plan) -> Optional[int]:
    """The checkpoint step this run resumes from; under Horovod rank 0's, on every rank."""
    if not p.ranks:
        return checkpoint_step(p.model_dir)
    return hvd_lib.agree_on(checkpoint_step(p.model_dir) if p.ranks.is_root else None)


class scratch_dir:  # noqa: N801 - a context manager that reads like a function
    """A Horovod rank > 0's private model_dir (None elsewhere), removed afterwards."""

    def __init__(self, p: Plan):
        self._tmp = (tempfile.TemporaryDirectory(prefix=f"estimator-dist-rank{p.ranks.rank}-")
                     if p.ranks and not p.ranks.is_root else None)

    def __enter__(self) -> Optional[str]:
        return self._tmp.__enter__() if self._tmp else None

    def __exit__(self, *exc):
        if self._tmp:
            self._tmp.__exit__(*exc)
        return False


def train_rank(estimator, train_spec, start_step: Optional[int]):
    """A Horovod rank > 0: train only (rank 0 evaluates and exports).

    It skips training exactly when rank 0 does (rank 0's checkpoint already at
    --train_steps): entering it alone, it would wait in the first broadcast for
    rank 0, which never comes (horovod#346, #1581; measured: it fails once rank 0
    exits).
    """
    if start_step is not None and start_step >= train_spec.max_steps:
        return None
    estimator.train(train_spec.input_fn, max_steps=train_spec.max_steps, hooks=train_spec.hooks)
    return None


def train_and_evaluate(p: Plan, estimator, train_spec, eval_spec, say):
    """tf.estimator.train_and_evaluate; an evaluator outpaced by checkpoint rotation retries.

    In a cluster the chief may delete the checkpoint the evaluator is about to
    restore (keep_checkpoint_max); the evaluator then simply moves on to the newest.
    """
    while True:
        try:
            if p.role == "evaluator":
                return evaluator_lib.run(estimator, train_spec, eval_spec, say)
            return tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
        except (ValueError, tf.errors.NotFoundError) as e:
            if p.role != "evaluator" or not rotated_away(e):
                raise
            say("the checkpoint under evaluation was deleted by checkpoint rotation; "
                "evaluating the newest one")


def reports_summary(p: Plan) -> bool:
    """The task that holds the final metrics and exports writes --summary_json."""
    if p.role == "local" or p.role == "evaluator":
        return True
    return p.role == "chief" and (p.cluster is None or not p.cluster.has_evaluator)


def train(config: config_lib.Config, out=print, extra_hooks=()) -> Dict[str, Any]:
    """Train and evaluate as configured (this process's part of a cluster); returns the summary.

    extra_hooks: SessionRunHooks added to training's (the bench's step clock).

    A run refused (UserError) or out of memory (OutOfMemory: a model or batch too large for
    the machine) before its first checkpoint leaves no model_dir it created; so does a
    train_op refused after its first updates (UntrainableTrainOp), which trained nothing:
    its only checkpoint holds step 0's initial weights.
    """
    p = plan(config)
    created = p.writes_run_files and not os.path.exists(p.model_dir)
    try:
        with model_dir_lock.held(p.model_dir) if p.writes_run_files else \
                contextlib.nullcontext():
            return _train(p, out, extra_hooks)
    except (UserError, OutOfMemory) as e:
        steps = checkpoints_lib.complete_checkpoints(p.model_dir)
        untrained = not steps or (isinstance(e, UntrainableTrainOp) and set(steps) == {0})
        if created and os.path.isdir(p.model_dir) and untrained:
            shutil.rmtree(p.model_dir, ignore_errors=True)
        raise


def _train(p: Plan, out, extra_hooks=()) -> Dict[str, Any]:
    config = p.config
    if p.cluster:
        cluster_lib.check_own_port(p.cluster)
        cluster_lib.apply(p.cluster)
    say = out if p.role in ("local", "chief", "evaluator") else silent
    say(describe(p))
    if p.input_meta.get("plain_features"):
        say(plain_features_note(p))
    elif p.input_meta.get(SERVING_INFERRED):
        say(f"serving input read off input '{p.input.name}''s training data: "
            f"{export_lib.describe_serving_features(p.input_meta['serving_features'])} "
            f"(return serving_features from a prepare() to choose it)")
    note = precision.cpu_note(config.compute.mixed_precision)
    if note:
        say(note)
    # The evaluator runs without a strategy: MultiWorkerMirrored cannot be copied
    # into the evaluator's RunConfig and evaluation needs no replicas. Made before any
    # model graph is built: MultiWorkerMirrored must configure the collective ops before
    # TensorFlow's context starts, and building a graph with tf.cond (cond_v2) starts it.
    with own_server_checked(p):
        strategy = None if p.role == "evaluator" else strategies.make(
            config.distribute.strategy, p.devices)
    if p.writes_run_files:  # before anything is written
        check_eval_metric_names(p)
    if p.evaluates:
        check_eval_input_ends(p)
    if p.writes_run_files:  # before anything is written
        check_predict_graph(p)
    if p.writes_run_files:  # before anything is written: refuse a damaged or mismatched checkpoint
        guards.check_resume(p.model_dir, build_model_fn(p),
                            make_input_fn(p, tf.estimator.ModeKeys.TRAIN), p.params(), say=out)
    start_step = resume_step(p)
    if start_step is not None and p.writes_run_files:
        out(f"resuming from the checkpoint at step {start_step} in {p.model_dir}")
    if p.writes_run_files:
        save_run_files(p)
        evaluator_lib.clear_end(p.model_dir)
    # A Horovod rank > 0 gets every variable from rank 0: no warm start of its own.
    warm_start = warm_start_settings(p) if p.writes_run_files or not p.ranks else None
    if warm_start and start_step is None and p.writes_run_files:
        out(f"warm-starting variables matching {config.train.warm_start_vars!r} from "
            f"{warm_start.ckpt_to_initialize_from}")
    with scratch_dir(p) as scratch:
        estimator = build_estimator(p, build_run_config(p, strategy, scratch), warm_start)
        return run_and_summarize(p, estimator, start_step, out, say, extra_hooks)


GRPC_START_FAILED = "Could not start gRPC server"


@contextlib.contextmanager
def own_server_checked(p: Plan):
    """A cluster task whose own TensorFlow server cannot listen on its TF_CONFIG address
    (another process holds the port) is one line (a traceback, or "training failed")."""
    try:
        yield
    except tf.errors.UnknownError as e:
        if p.cluster is None or GRPC_START_FAILED not in str(e):
            raise
        task = f"{p.cluster.task_type}:{p.cluster.task_index}"
        address = p.cluster.cluster[p.cluster.task_type][p.cluster.task_index]
        raise UserError(f"TF_CONFIG task {task} could not listen on {address} "
                        f"({GRPC_START_FAILED}): another process may hold that port; give "
                        f"this task a free port in TF_CONFIG's cluster") from None


def check_trained(p: Plan, start_step: Optional[int]):
    """A run that took no step although --train_steps asked for more: its input gave no batch
    (Estimator ends training at the input's end without a word, and exited 0)."""
    step, start = checkpoint_step(p.model_dir) or 0, start_step or 0
    if step == start < p.config.train.train_steps:
        raise UserError(f"input '{p.input.name}' gave no training batch: the run ended at step "
                        f"{step} of --train_steps {p.config.train.train_steps}; its input_fn must "
                        f"return a non-empty dataset (repeat() it to train past one pass)")


def input_end_note(p: Plan, hooks) -> Optional[str]:
    """Training that ended before --train_steps with no early stop: the input ran out
    (Estimator ends training at its input's end, and said nothing)."""
    step, target = checkpoint_step(p.model_dir) or 0, p.config.train.train_steps
    if step >= target or stopped_early(hooks):
        return None
    return (f"input '{p.input.name}' ran out at step {step} of --train_steps {target}, which "
            f"ends training as Estimator does; repeat() its dataset to train all {target} steps")


def stopped_early(hooks) -> bool:
    return any(getattr(h, "stopped_early", False) for h in hooks)


def export_after_early_stop(p: Plan, estimator, hooks, say):
    """--export final after an early stop (local, Horovod rank 0): export the stopped step.

    Estimator runs the FinalExporter only for a checkpoint at --train_steps, which an
    early stop never writes: the run ended, exit 0, with no SavedModel. A cluster's
    evaluator exports on the chief's end marker (evaluator.py). Inside TrainingGuard:
    SIGTERM here removes the partial export.
    """
    step = checkpoint_step(p.model_dir)
    if p.config.train.export != "final" or p.cluster or not stopped_early(hooks) or \
            step is None or step >= p.config.train.train_steps:
        return
    base = os.path.join(p.model_dir, export_lib.EXPORT_SUBDIR, "final")
    export_lib.export_saved_model(estimator, p.input_meta["serving_features"], base,
                                  tf.train.latest_checkpoint(p.model_dir))
    say(f"early stop: exported the checkpoint at step {step} as the final export")


def run_and_summarize(p: Plan, estimator, start_step: Optional[int], out, say,
                      extra_hooks=()) -> Dict[str, Any]:
    """Train (and evaluate, export) with the progress and guard hooks; report the result."""
    config = p.config
    progress = ProgressHook(p.global_batch, config.train.train_steps,
                            every_n=log_every(config.train.train_steps),
                            emit=out if p.writes_run_files else silent,
                            runs_per_step=config.distribute.accumulate_steps,
                            bar_stream=sys.stdout if out is print and sys.stdout.isatty()
                            and p.writes_run_files else None,
                            summary_dir=p.model_dir if p.writes_run_files else None)
    hooks = training_hooks(p, estimator, progress, say) + [train_op_check(p)] + list(extra_hooks)
    train_spec, eval_spec = build_specs(p, hooks)
    # Only this run's exports are reported: a resumed chief printed an earlier run's.
    earlier_exports = set(export_lib.export_paths(p.model_dir))
    started = time.perf_counter()
    with guards.TrainingGuard(p.model_dir, config.distribute.accumulate_steps, p.role,
                              chief_saves_alone=config.distribute.strategy != "multi_worker_mirrored",
                              workers=p.num_workers) \
            as guard:
        if p.ranks and not p.ranks.is_root:
            result = train_rank(estimator, guard.attach(train_spec), start_step)
        else:
            with own_server_checked(p):
                result = train_and_evaluate(p, estimator, guard.attach(train_spec),
                                            guard.attach_eval(eval_spec), say)
            export_after_early_stop(p, estimator, hooks, say)
    if p.role == "local":
        check_trained(p, start_step)
    if p.role in ("local", "chief") and not p.ranks:
        note = input_end_note(p, hooks)
        if note:
            say(note)
    if p.role == "chief" and p.cluster:
        evaluator_lib.mark_end(p.model_dir, checkpoint_step(p.model_dir))
    if result and result[0] is None and p.writes_run_files and not p.cluster:
        # Already at --train_steps: Estimator skipped training, and with it the
        # evaluation that follows a checkpoint; evaluate the final one here.
        result = (estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps), None)
    metrics = {k: plain(v) for k, v in (result[0] if result else {}).items()}
    if p.role == "evaluator":
        metrics = final_eval_metrics(p.model_dir)
    if p.role == "chief" and p.cluster and not p.cluster.has_evaluator and \
            config.train.export != "none":
        with preemption.stop_on_sigterm(
                lambda: preemption.export_stopped(tf.train.latest_checkpoint(p.model_dir))):
            exported = export_from_chief(p)
        out("no evaluator task: the chief exported the final checkpoint" if exported else
            "no evaluator task: the final checkpoint is exported already")
    summary = {
        "model": config.model,
        "strategy": config.distribute.strategy,
        "role": p.role,
        "num_workers": p.num_workers,
        "num_devices": p.devices.count,
        "global_batch_size": p.global_batch,
        "accumulate_steps": config.distribute.accumulate_steps,
        "global_step": checkpoint_step(p.model_dir),
        "start_step": start_step or 0,
        "metrics": metrics,
        "exports": [e for e in export_lib.export_paths(p.model_dir)
                    if e not in earlier_exports],
        "examples_per_sec": progress.examples_per_sec,
        "wall_seconds": round(time.perf_counter() - started, 2),
        "model_dir": p.model_dir,
    }
    say(format_result(summary))
    if config.train.summary_json and reports_summary(p):
        write_summary(config.train.summary_json, summary)
    return summary


def format_result(summary: Dict[str, Any]) -> str:
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in sorted(summary["metrics"].items())
                        if k != "global_step" and isinstance(v, float))
    if not summary["metrics"] and summary.get("role") in ("chief", "worker") and \
            summary.get("strategy") != "horovod":
        metrics = "(the evaluator task evaluates and exports)"
    line = f"done: step {summary['global_step']}  {metrics}"
    if summary["exports"]:
        line += f"\nexported: {summary['exports'][-1]}"
    return line


def single_device_estimator(p: Plan) -> tf.estimator.Estimator:
    """An Estimator on one device: checkpoints from any strategy restore into it."""
    return build_estimator(p, build_run_config(p, strategy=None))


def restorable_checkpoint(p: Plan, checkpoint: str) -> str:
    """For evaluate/export: the named or latest checkpoint, read back whole, fitting the model."""
    variables = export_lib.predict_variables(build_model_fn(p), p.input_meta["serving_features"],
                                             p.params())
    return export_lib.resolve_checkpoint(p.model_dir, checkpoint, variables)


def evaluate(config: config_lib.Config, checkpoint: str = "") -> Dict[str, Any]:
    """Evaluate a named or the latest checkpoint; refuses when there is none or it does not fit."""
    p = plan(config)
    path = restorable_checkpoint(p, checkpoint)
    estimator = single_device_estimator(p)
    try:
        metrics = estimator.evaluate(make_input_fn(p, tf.estimator.ModeKeys.EVAL),
                                     steps=config.train.eval_steps or None, checkpoint_path=path,
                                     name="cli")
    except tf.errors.OpError as e:
        if storage.storage_reason(e):  # its metrics go to model_dir/eval_cli: not the labels
            raise storage.storage_error(e, f"evaluating {path} (writing its metrics)",
                                        "the checkpoints are unchanged") from None
        if not quiet.is_quiet():
            raise
        raise TrainingFailed(f"evaluating {path} failed: {op_error_line(e)} "
                             f"({type(e).__name__}); check the input's labels and features "
                             f"against the model; --verbose shows TensorFlow's traceback") from None
    return {k: plain(v) for k, v in metrics.items()}


def export(config: config_lib.Config, input_meta: Dict[str, Any], export_base: str,
           checkpoint: str = "") -> str:
    """Export a SavedModel from a checkpoint on one CPU; no data needed. Refuses as evaluate does."""
    p = plan(config, input_meta=input_meta)
    path = restorable_checkpoint(p, checkpoint)
    return export_lib.export_saved_model(single_device_estimator(p), input_meta["serving_features"],
                                         export_base, path)
