"""A run, driven by its Role: plan -> checks -> Estimator -> train_and_evaluate (or the
evaluator loop, or a Horovod rank's training) -> summary; evaluate and export commands."""
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, Optional

import tensorflow as tf

from estimator_dist.guards import checkpoints as checkpoints_lib
from estimator_dist.distribute import tf_config as cluster_lib
from estimator_dist.training import config as config_lib
from estimator_dist.training import early_stopping
from estimator_dist.training import evaluator as evaluator_lib
from estimator_dist.training.final import (evaluate_final_checkpoint, export_after_early_stop,
                                          export_from_chief, export_when_already_trained,
                                          stopped_early)
from estimator_dist.serving import export as export_lib
from estimator_dist.serving.serving_features import describe_serving_features
from estimator_dist.guards import training_guard as guards
from estimator_dist.distribute import horovod as hvd_lib
from estimator_dist.training import horovod_train
from estimator_dist.guards import identical_batches
from estimator_dist.guards import model_dir_lock
from estimator_dist.graph import precision
from estimator_dist.graph.distinct_variables import DistinctVariablesHook
from estimator_dist.guards import signals
from estimator_dist.guards import stop_messages
from estimator_dist import files
from estimator_dist.checkpoint_files import complete_checkpoints, latest_step
from estimator_dist import quiet
from estimator_dist.guards import storage
from estimator_dist.distribute import strategies
from estimator_dist.errors import (Interrupted, OutOfMemory, Preempted, RunFinished, StorageError,
                                   TrainingFailed, UntrainableTrainOp, UserError, op_error_line)
from estimator_dist.distribute import roles
from estimator_dist.graph.train_op_checks import TrainOpCheckHook
from estimator_dist.launch.step_file import note_stop
from estimator_dist.training.progress import ProgressHook
from estimator_dist.training.step_file_hook import step_file_hooks
from estimator_dist.training.estimator import build_estimator, build_model_fn, build_run_config, compares_first_batches, make_input_fn, single_device_estimator
from estimator_dist.training.plan import SERVING_NAMED, Plan, describe, log_every, plain_features_note, plan
from estimator_dist.training.preflight import check_eval_input_ends, check_eval_metric_names, check_predict_graph, own_server_checked, restorable_checkpoint, warm_start_settings
from estimator_dist.training.summary import final_eval_metrics, format_result, plain, save_run_files, silent, write_summary
from estimator_dist.training.user_code import SERVING_INFERRED


def build_specs(p: Plan, hooks):
    t = p.config.train
    train_spec = tf.estimator.TrainSpec(
        make_input_fn(p, tf.estimator.ModeKeys.TRAIN), max_steps=t.train_steps, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(
        make_input_fn(p, tf.estimator.ModeKeys.EVAL), steps=t.eval_steps or None,
        # A chief that exports the final checkpoint itself runs no FinalExporter: Estimator's
        # `master` ran it twice in an asynchronous run (at steps 30 and 31 of 30).
        exporters=export_lib.make_exporters(
            "none" if t.export == "final" and p.role.exports_final_itself else t.export,
            p.serving_input, t.keep_checkpoint_max, t.best_metric,
            config_lib.higher_is_better(t.best_metric, t.higher_is_better)),
        start_delay_secs=0, throttle_secs=t.eval_every_secs)
    return train_spec, eval_spec


def training_hooks(p: Plan, estimator, progress: ProgressHook, say):
    """The progress hook, plus early stopping when asked (every task runs it)."""
    t = p.config.train
    if p.role.horovod:
        return horovod_hooks(p, estimator, progress, say)
    hooks = [progress]
    if compares_first_batches(p):
        hooks.append(identical_batches.FirstBatchHook(p.role.num_workers, p.input.name,
                                                      p.params()["batch_size"]))
    if t.early_stop and p.role.runs_early_stop_hook:
        hooks.append(early_stopping.make_hook(
            estimator, t.early_stop, config_lib.higher_is_better(t.early_stop, t.higher_is_better),
            t.patience, t.min_delta, every_steps=config_lib.checkpoint_every(p.config) or
            log_every(t.train_steps), say=say, stops_together=p.strategy.stops_together,
            owns_the_run=p.role.writes_run_files))
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
    if t.early_stop and p.role.decides_early_stop:
        should_stop = early_stopping.make_should_stop(
            estimator.eval_dir(), t.early_stop,
            config_lib.higher_is_better(t.early_stop, t.higher_is_better), t.patience,
            t.min_delta, say)
    every = config_lib.checkpoint_every(p.config) or log_every(t.train_steps)
    return [horovod_train.BroadcastHook(),
            horovod_train.StopTogetherHook(should_stop, every, say), progress]


def rotated_away(error: Exception) -> bool:
    """The evaluator lost the race with keep_checkpoint_max: its checkpoint was deleted."""
    return isinstance(error, tf.errors.NotFoundError) or (
        isinstance(error, ValueError) and "not a valid checkpoint" in str(error))


def resume_step(p: Plan) -> Optional[int]:
    """The checkpoint step this run resumes from; under Horovod rank 0's, on every rank. A
    damaged state file reads as None (check_resume repairs it; it is read again after)."""
    if not p.role.horovod:
        return latest_step(p.model_dir)
    return hvd_lib.agree_on(latest_step(p.model_dir) if p.role.writes_run_files else None)


class scratch_dir:  # noqa: N801 - a context manager that reads like a function
    """A Horovod rank > 0's private model_dir (None elsewhere), removed afterwards."""

    def __init__(self, p: Plan):
        self._tmp = (tempfile.TemporaryDirectory(prefix=f"estimator-dist-rank{p.role.index}-")
                     if p.role.horovod_follower else None)

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
    """tf.estimator.train_and_evaluate (for a ps, roles.SERVE, it runs the server), or the
    evaluator's loop; an evaluator outpaced by checkpoint rotation retries.

    In a cluster the chief may delete the checkpoint the evaluator is about to
    restore (keep_checkpoint_max); the evaluator then simply moves on to the newest.
    """
    while True:
        try:
            if p.role.run == roles.EVALUATE_LOOP:
                return evaluator_lib.run(estimator, train_spec, eval_spec, say)
            return tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
        except (ValueError, tf.errors.NotFoundError) as e:
            if p.role.run != roles.EVALUATE_LOOP or not rotated_away(e):
                raise
            say("the checkpoint under evaluation was deleted by checkpoint rotation; "
                "evaluating the newest one")


def train(config: config_lib.Config, out=print, extra_hooks=()) -> Dict[str, Any]:
    """Train and evaluate as configured (this process's part of a cluster); returns the summary.

    extra_hooks: SessionRunHooks added to training's (the bench's step clock).

    A run refused (UserError) or out of memory (OutOfMemory: a model or batch too large for
    the machine) before its first checkpoint leaves no model_dir it created; so does a
    train_op refused after its first updates (UntrainableTrainOp), which trained nothing:
    its only checkpoint holds step 0's initial weights.
    """
    p = plan(config, defer_prepare=True)
    created = p.writes_run_files and not os.path.exists(p.model_dir)
    if p.role.ends_with_the_chief:
        started = time.time()
        stop_messages.when_run_finished(lambda: finished_by_chief(p, started))
    try:
        with model_dir_lock.held(p.model_dir) if p.writes_run_files else \
                contextlib.nullcontext():
            return _train(p, out, extra_hooks)
    except (Preempted, Interrupted) as e:
        done = stop_messages.finished_instead(e)
        if done is not e:
            raise done from None
        note_stop(e.step)
        raise
    except (UserError, OutOfMemory, StorageError) as e:
        steps = complete_checkpoints(p.model_dir)
        untrained = not steps or (isinstance(e, UntrainableTrainOp) and set(steps) == {0})
        if created and os.path.isdir(p.model_dir) and untrained:
            shutil.rmtree(p.model_dir, ignore_errors=True)
        raise


def finished_by_chief(p: Plan, started: float) -> Optional[RunFinished]:
    """For a worker or ps stopped by SIGTERM: RunFinished when the chief marked the run's end
    after this task started (the launcher then stops the tasks still running)."""
    step = evaluator_lib.end_step(p.model_dir, started)
    return None if step is None else RunFinished(p.role.task, step)


def _train(p: Plan, out, extra_hooks=()) -> Dict[str, Any]:
    config = p.config
    if p.role.tensorflow_cluster:
        cluster_lib.check_own_port(p.role.tensorflow_cluster)
    cluster_lib.apply(p.role.tensorflow_cluster)
    say = out if p.role.speaks else silent
    # The evaluator runs without a strategy: MultiWorkerMirrored cannot be copied
    # into the evaluator's RunConfig and evaluation needs no replicas. Made before any
    # model graph is built: MultiWorkerMirrored must configure the collective ops before
    # TensorFlow's context starts, and building a graph with tf.cond (cond_v2) starts it.
    with own_server_checked(p):
        strategy = None if not p.role.builds_strategy else strategies.make(
            config.distribute.strategy, p.devices)
    # The input's own code runs only now, with the checkpoint's step in its params.
    p = dataclasses.replace(p, start_step=resume_step(p) or 0).prepared()
    say(describe(p))  # once prepare() has run: what follows the header is the run itself
    note = precision.cpu_note(config.compute.mixed_precision)
    if note:
        say(note)
    say_serving_input(p, say)
    if p.writes_run_files:  # before anything is written; PREDICT first, as the export needs it
        check_predict_graph(p)
        check_eval_metric_names(p)
    if p.role.evaluates:
        check_eval_input_ends(p)
    if p.writes_run_files:  # before anything is written: refuse a damaged or mismatched checkpoint
        guards.check_resume(p.model_dir, build_model_fn(p),
                            make_input_fn(p, tf.estimator.ModeKeys.TRAIN), p.params(), say=out)
        checkpoints_lib.check_same_lr_scale(p.model_dir, config.distribute.scale_lr,
                                            p.replicas)
    start_step = resume_step(p)  # again: check_resume may have repaired the state file
    # The input continues the data stream at the checkpoint's step (position.py).
    p = dataclasses.replace(p, start_step=start_step or 0)
    if start_step is not None and p.writes_run_files:
        out(f"resuming from the checkpoint at step {start_step} in {p.model_dir}")
    if p.writes_run_files:
        save_run_files(p, say=out)
        evaluator_lib.clear_end(p.model_dir)
    # A Horovod rank > 0 gets every variable from rank 0: no warm start of its own.
    warm_start = warm_start_settings(p) if p.role.warm_starts else None
    if warm_start and start_step is None and p.writes_run_files:
        out(f"warm-starting variables matching {config.train.warm_start_vars!r} from "
            f"{warm_start.ckpt_to_initialize_from}")
    with scratch_dir(p) as scratch, shadow_dirs_removed(p):
        estimator = build_estimator(p, build_run_config(p, strategy, scratch), warm_start)
        return run_and_summarize(p, estimator, start_step, out, say, extra_hooks)


def say_serving_input(p: Plan, say):
    """The serving input when the run chose it: one tensor, or read off the training data."""
    if p.input_meta.get(SERVING_NAMED):
        say(f"serving input named by {p.input_meta[SERVING_NAMED]}: "
            f"{describe_serving_features(p.input_meta['serving_features'])}")
    elif p.input_meta.get("plain_features"):
        say(plain_features_note(p))
    elif p.input_meta.get(SERVING_INFERRED):
        say(f"serving input read off input '{p.input.name}''s training data: "
            f"{describe_serving_features(p.input_meta['serving_features'])} "
            f"(return serving_features from a prepare() to choose it)")


@contextlib.contextmanager
def shadow_dirs_removed(p: Plan):
    """The copies TensorFlow makes a multi_worker_mirrored worker save under model_dir
    (roles.Role.shadow_dir, e.g. 18 MB of tmp_worker_0 after a restart), removed when the
    task starts (a killed run's) and ends."""
    def remove():
        names = os.listdir(p.model_dir) if os.path.isdir(p.model_dir) else []
        storage.remove(os.path.join(p.model_dir, n) for n in p.role.shadow_dirs_to_remove(names))

    remove()
    try:
        yield
    finally:
        remove()


def check_trained(p: Plan, start_step: Optional[int]):
    """A run that took no step although --train_steps asked for more: its input gave no batch
    (Estimator ends training at the input's end without a word, and exited 0)."""
    step, start = latest_step(p.model_dir) or 0, start_step or 0
    if step == start < p.config.train.train_steps:
        raise UserError(f"input '{p.input.name}' gave no training batch: the run ended at step "
                        f"{step} of --train_steps {p.config.train.train_steps}; its input_fn must "
                        f"return a non-empty dataset (repeat() it to train past one pass)")


def input_end_note(p: Plan, hooks) -> Optional[str]:
    """Training that ended before --train_steps with no early stop: the input ran out
    (Estimator ends training at its input's end, and said nothing)."""
    step, target = latest_step(p.model_dir) or 0, p.config.train.train_steps
    if step >= target or stopped_early(hooks):
        return None
    return (f"input '{p.input.name}' ran out at step {step} of --train_steps {target}, which "
            f"ends training as Estimator does; repeat() its dataset to train all {target} steps")


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
    hooks = (training_hooks(p, estimator, progress, say) + [train_op_check(p)] + step_file_hooks()
             + [DistinctVariablesHook()] + list(extra_hooks))
    train_spec, eval_spec = build_specs(p, hooks)
    # Only this run's exports are reported: a resumed chief printed an earlier run's.
    earlier_exports = set(export_lib.export_paths(p.model_dir))
    started = time.perf_counter()
    with guards.TrainingGuard(p.model_dir, config.distribute.accumulate_steps, p.role) as guard:
        if p.role.run == roles.TRAIN_ONLY:
            result = train_rank(estimator, guard.attach(train_spec), start_step)
        else:
            with own_server_checked(p):
                result = train_and_evaluate(p, estimator, guard.attach(train_spec),
                                            guard.attach_eval(eval_spec), say)
            export_after_early_stop(p, estimator, hooks, say)
    if p.role.checks_it_trained:
        check_trained(p, start_step)
    if p.role.notes_input_end:
        note = input_end_note(p, hooks)
        if note:
            say(note)
    if p.role.marks_end_for_evaluator:
        evaluator_lib.mark_end(p.model_dir, latest_step(p.model_dir))
    if result and result[0] is None and p.role.evaluates_when_already_trained:
        # Already at --train_steps: Estimator skipped training, and with it the
        # evaluation that follows a checkpoint; evaluate the final one here.
        result = (estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps), None)
        export_when_already_trained(p, estimator, eval_spec, result[0])
    if p.role.evaluates_final_itself:
        result = (evaluate_final_checkpoint(p, eval_spec), None)
    metrics = {k: plain(v) for k, v in (result[0] if result else {}).items()}
    if p.role.metrics_from_eval_dir:
        metrics = final_eval_metrics(p.model_dir)
    if p.role.exports_final_itself and config.train.export != "none":
        with signals.raise_on_sigterm(
                lambda: stop_messages.export_stopped(tf.train.latest_checkpoint(p.model_dir))):
            exported = export_from_chief(p)
        out("no evaluator task: the chief exported the final checkpoint" if exported else
            "no evaluator task: the final checkpoint is exported already")
    summary = {
        "model": config.model,
        "strategy": config.distribute.strategy,
        "role": p.role.kind,
        "num_workers": p.num_workers,
        "num_devices": p.devices.count,
        "global_batch_size": p.global_batch,
        "accumulate_steps": config.distribute.accumulate_steps,
        "global_step": latest_step(p.model_dir),
        "start_step": start_step or 0,
        "metrics": metrics,
        # The evaluator task's export, when it finished first, is its to name, not ours.
        "exports": [] if p.role.evaluated_elsewhere else [
            e for e in export_lib.export_paths(p.model_dir) if e not in earlier_exports],
        "examples_per_sec": progress.examples_per_sec,
        "wall_seconds": round(time.perf_counter() - started, 2),
        "model_dir": p.model_dir,
    }
    say(format_result(summary, p.role.evaluated_elsewhere))
    if config.train.summary_json and p.role.writes_summary:
        write_summary(config.train.summary_json, summary)
    return summary


def evaluate(config: config_lib.Config, checkpoint: str = "") -> Dict[str, Any]:
    """Evaluate a named or the latest checkpoint; refuses when there is none or it does not fit."""
    p = plan(config)
    path = restorable_checkpoint(p, checkpoint)
    estimator = single_device_estimator(p)
    eval_dir = estimator.eval_dir("cli")
    created, before = files.missing_dirs(eval_dir), set(storage.event_files(eval_dir))
    try:
        metrics = estimator.evaluate(make_input_fn(p, tf.estimator.ModeKeys.EVAL),
                                     steps=config.train.eval_steps or None, checkpoint_path=path,
                                     name="cli")
    except (tf.errors.OpError, RuntimeError, IndexError) as e:
        if storage.storage_reason(e):  # its metrics go to model_dir/eval_cli: not the labels
            # The events file its writer began (0 bytes on a full disk) holds no result.
            storage.remove(set(storage.event_files(eval_dir)) - before)
            files.remove_empty_dirs(created)
            raise storage.storage_error(e, f"evaluating {path} (writing its metrics)",
                                        "the checkpoints are unchanged; no partial events file "
                                        "was left") from None
        if not isinstance(e, tf.errors.OpError):
            raise
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
    return export_lib.export_saved_model(single_device_estimator(p), p.serving_input,
                                         export_base, path)
