"""The Estimator of a plan: its RunConfig, the model_fn wrapped as the strategy asks
(towers, accumulation, Horovod, per-replica collections, checks), and the input_fn."""
import re
from typing import Optional

import tensorflow as tf

from estimator_dist.training import config as config_lib
from estimator_dist.distribute import devices as devices_lib
from estimator_dist.serving import canned
from estimator_dist.serving.serving_features import check_training_features
from estimator_dist.distribute import horovod as hvd_lib
from estimator_dist.training import horovod_train
from estimator_dist.guards import identical_batches
from estimator_dist.guards import memory
from estimator_dist.graph import model_fn_wrap
from estimator_dist.graph import numerics
from estimator_dist.graph import precision
from estimator_dist.graph import reported_loss
from estimator_dist import quiet
from estimator_dist.graph import replica_collections
from estimator_dist.training import saver_hook
from estimator_dist.distribute import specs
from estimator_dist.distribute import strategies
from estimator_dist.graph import sync_replicas
from estimator_dist.graph import towers
from estimator_dist.distribute import xla
from estimator_dist.errors import UserError
from estimator_dist.training.plan import SERVING_NAMED, Plan, log_every

from estimator_dist.training.user_code import checked_input, users_code


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
    if p.role.horovod:
        return hvd_lib.session_config(config, p.devices, p.role.ranks,
                                      devices_lib.available_cores())
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
                               None if p.input_meta.get(SERVING_NAMED) else
                               p.input_meta["serving_features"], p.input.name,
                               plain=bool(p.input_meta.get("plain_features")))
    model_fn = canned.with_example_signatures(model_fn)
    if p.strategy.wraps_model_fn == specs.HOROVOD_OPTIMIZER:
        model_fn = horovod_train.wrap_model_fn(model_fn, p.model.name)
    elif p.strategy.wraps_model_fn == specs.TOWERS or d.accumulate_steps > 1:
        tower_devices = p.devices.names if p.strategy.wraps_model_fn == specs.TOWERS else ()
        model_fn = towers.tower_model_fn(
            model_fn, p.model.name, devices=tower_devices,
            variable_device=strategies.variable_device(d.strategy, d.variable_device, p.devices),
            accumulate_steps=d.accumulate_steps)
    if strategies.calls_model_fn_per_device(d.strategy, p.devices):
        model_fn = replica_collections.per_replica(model_fn)
    if compares_first_batches(p):  # each replica's whole batch, as the input gave it
        model_fn = identical_batches.fingerprinted(model_fn)
    model_fn = ordered_checks(model_fn, checks_after_last_gradient(p))
    model_fn = memory_checked(model_fn, p.role.checks_memory)
    model_fn = precision.wrap_model_fn(model_fn, p.config.compute.mixed_precision, p.model.name)
    return reported_build_errors(model_fn, p.model.name, p.input.name)


def compares_first_batches(p: Plan) -> bool:
    """Whether the workers compare their first batches (guards/identical_batches.py)."""
    return p.role.compares_first_batches and not p.config.distribute.allow_identical_batches


def serving_checked(model_fn, serving_features, input_name: str, plain: bool = False):
    """A TRAIN graph's features must be what the input's serving_features promise
    (serving/serving_features.py): refused before the first step, not in predict.
    With plain features (one tensor) the serving receiver's one-entry dict is handed to
    the model_fn as the tensor it takes in training.

    Innermost: it sees exactly what the model_fn is given (a replica's, a tower's slice).
    model_fn: with the full signature (model_fn_wrap.estimator_call).
    """
    def checked_model_fn(features, labels, mode, params, config=None):
        if mode == model_fn_wrap.TRAIN and serving_features is not None:
            check_training_features(features, serving_features, input_name, plain)
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
        if mode == tf.estimator.ModeKeys.TRAIN:
            reported_loss.record_spec_loss(spec.loss)  # the progress line and weights check read it
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
    moved = tf2_moved_name(error)
    if moved:
        return moved
    if arguments.get("mode") in (tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL) and \
            "labels" in arguments and arguments["labels"] is None:
        return (f"it was given labels=None: input '{input_name}' gives features without labels; "
                f"an input_fn returns a tf.data.Dataset of (features, labels), e.g. "
                f"tf.data.Dataset.from_tensor_slices((features, labels))")
    return ("check its hparams (--set, config.yaml; 'estimator-dist list') and that the input "
            "gives the features it reads (--input)")


# TF1 code's tf.losses / tf.metrics / tf.layers ... are Keras modules (or gone) in TF 2:
# "module 'keras.api._v2.keras.losses' has no attribute 'sparse_softmax_cross_entropy'".
_MISSING_ATTRIBUTE = re.compile(r"module '(?:[\w.]*\.)?(\w+)' has no attribute '(\w+)'")


def tf2_moved_name(error: Optional[BaseException]) -> Optional[str]:
    """The fix for a TF1 name TensorFlow 2 moved, when `error` is that AttributeError."""
    found = _MISSING_ATTRIBUTE.search(str(error)) if isinstance(error, AttributeError) else None
    if not found:
        return None
    module, name = found.groups()
    if not hasattr(getattr(tf.compat.v1, module, None), name):
        return None
    return (f"TensorFlow 2 has no tf.{module}.{name} (its tf.{module} is another module); "
            f"spell it tf.compat.v1.{module}.{name}, as TF1 code runs here")


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


def build_estimator(p: Plan, run_config, warm_start=None) -> tf.estimator.Estimator:
    model_fn = saver_hook.with_saver_hook(build_model_fn(p), run_config,
                                          strategy_saves=p.strategy.saves_itself)
    return tf.estimator.Estimator(model_fn=model_fn, config=run_config,
                                  params=p.params(), warm_start_from=warm_start)


def make_input_fn(p: Plan, mode):
    """An Estimator input_fn `(config, input_context)` calling the registered one as
    Estimator would (model_fn_wrap.input_call), checked."""
    params = p.params()
    fn = checked_input(p.input.fn, p.input.name, p.config.train.eval_steps)
    if p.role.horovod and mode == tf.estimator.ModeKeys.TRAIN:
        return horovod_train.train_input_fn(fn, params, p.role.index, p.role.num_workers,
                                            p.input.name)
    if p.role.horovod:  # rank 0 evaluates alone, on one device: --eval_steps counts global batches
        params = {**params, "batch_size": p.global_batch}

    def input_fn(config=None, input_context=None):
        data = fn(mode, params, config, input_context)
        check_input_kind(data, p, mode)
        if mode == tf.estimator.ModeKeys.TRAIN:
            memory.check_batch_fits(data, params, p.input.name)
        return data

    return input_fn


def check_input_kind(data, p: Plan, mode):
    """(features, labels) tensors instead of a tf.data.Dataset: Estimator takes them without a
    strategy (none, tower); under the others it failed with a traceback mid-run."""
    name = p.config.distribute.strategy
    if isinstance(data, tf.data.Dataset) or strategies.takes_input_tensors(name):
        return
    raise UserError(f"input '{p.input.name}' returned tensors, not a tf.data.Dataset, from its "
                    f"{mode} call: --strategy {name} distributes datasets only; return the "
                    f"dataset itself (not make_one_shot_iterator(dataset).get_next()), or use "
                    f"--strategy {' or '.join(strategies.TAKE_INPUT_TENSORS)}")


def single_device_estimator(p: Plan) -> tf.estimator.Estimator:
    """An Estimator on one device: checkpoints from any strategy restore into it."""
    return build_estimator(p, build_run_config(p, strategy=None))
