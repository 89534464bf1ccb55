"""The steps the procedures of training/roles.py are made of, in the order they run:
start-up (cluster, strategy, checks, run files), the Estimator, the hooks, training, what
follows it, the summary."""
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import tensorflow as tf

from estimator_dist.checkpoint_files import complete_checkpoints, latest_step
from estimator_dist.distribute import horovod as hvd_lib
from estimator_dist.distribute import strategies
from estimator_dist.distribute import tf_config as cluster_lib
from estimator_dist.errors import (Interrupted, OutOfMemory, Preempted, RunFinished,
                                   StorageError, UntrainableTrainOp, UserError)
from estimator_dist.graph import precision
from estimator_dist.graph.distinct_variables import DistinctVariablesHook
from estimator_dist.graph.train_op_checks import TrainOpCheckHook
from estimator_dist.guards import checkpoints as checkpoints_lib
from estimator_dist.guards import identical_batches
from estimator_dist.guards import model_dir_lock
from estimator_dist.guards import peers
from estimator_dist.guards import signals
from estimator_dist.guards import stop_messages
from estimator_dist.guards import storage
from estimator_dist.guards import training_guard as guards
from estimator_dist.launch.step_file import note_stop
from estimator_dist.serving import export as export_lib
from estimator_dist.serving.serving_features import describe_serving_features
from estimator_dist.training import config as config_lib
from estimator_dist.training import early_stopping
from estimator_dist.training import evaluator as evaluator_lib
from estimator_dist.training import horovod_train
from estimator_dist.training.estimator import (build_estimator, build_model_fn,
                                               build_run_config, compares_first_batches,
                                               make_input_fn)
from estimator_dist.training.final import (evaluate_final_checkpoint, export_after_early_stop,
                                          export_from_chief, export_when_already_trained,
                                          stopped_early)
from estimator_dist.training.plan import (SERVING_NAMED, Plan, describe, log_every,
                                          plain_features_note)
from estimator_dist.training.preflight import (check_eval_input_ends, check_eval_metric_names,
                                               check_predict_graph, own_server_checked,
                                               warm_start_settings)
from estimator_dist.training.progress import ProgressHook
from estimator_dist.training.step_file_hook import step_file_hooks
from estimator_dist.training.summary import (final_eval_metrics, format_result, plain,
                                             save_run_files, silent, write_summary)
from estimator_dist.training.user_code import SERVING_INFERRED

__all__ = ["export_after_early_stop", "final_eval_metrics", "silent"]  # for the procedures


# -- around the whole run --------------------------------------------------------------
@contextlib.contextmanager
def owning_model_dir(p: Plan):
    """model_dir's lock while inside. A run refused (UserError) or out of memory before its
    first checkpoint leaves no model_dir it created; so does a train_op refused after its
    first updates (UntrainableTrainOp), which trained nothing: its only checkpoint holds
    step 0's initial weights. A stop notes its step for an elastic launcher."""
    created = not os.path.exists(p.model_dir)
    try:
        with model_dir_lock.held(p.model_dir), signals.on_exit_now(noting_the_stop):
            yield
    except (Preempted, Interrupted) as e:
        note_stop(e.step)
        raise
    except (UserError, OutOfMemory, StorageError) as e:
        steps = complete_checkpoints(p.model_dir)
        untrained = not steps or (isinstance(e, UntrainableTrainOp) and set(steps) == {0})
        if created and os.path.isdir(p.model_dir) and untrained:
            shutil.rmtree(p.model_dir, ignore_errors=True)
        raise


@contextlib.contextmanager
def finishing_with_the_chief(p: Plan):
    """A worker or ps stopped (SIGTERM) once the chief marked the run's end after this task
    started: its normal end (RunFinished: `done`, exit 0), not a preemption."""
    started = time.time()

    def finished() -> Optional[RunFinished]:
        step = evaluator_lib.end_step(p.model_dir, started)
        return None if step is None else RunFinished(p.role.task, step)

    stop_messages.when_run_finished(finished)
    try:
        with signals.on_exit_now(noting_the_stop):
            yield
    except (Preempted, Interrupted) as e:
        done = stop_messages.finished_instead(e)
        if done is not e:
            raise done from None
        note_stop(e.step)
        raise


def noting_the_stop(error):
    """A stop's step for an elastic launcher, when a task exits at once (signals.exit_now)."""
    if isinstance(error, (Preempted, Interrupted)):
        note_stop(error.step)


# -- start-up --------------------------------------------------------------------------
def set_tf_config(p: Plan):
    """Hand TensorFlow this task's normalised TF_CONFIG, or none when it runs alone; a
    port another process holds is refused first (one line, not TensorFlow's failure)."""
    if p.role.tensorflow_cluster:
        cluster_lib.check_own_port(p.role.tensorflow_cluster)
    cluster_lib.apply(p.role.tensorflow_cluster)


def build_strategy(p: Plan):
    """The tf.distribute strategy, made before any model graph: MultiWorkerMirrored must set
    up the collective ops before TensorFlow's context starts (a graph with tf.cond starts it)."""
    with own_server_checked(p):
        return strategies.make(p.config.distribute.strategy, p.devices)


def resume_step(p: Plan) -> Optional[int]:
    """The checkpoint step this run resumes from; under Horovod rank 0's, on every rank. A
    damaged state file reads as None (check_resume repairs it; it is read again after)."""
    if not p.role.horovod:
        return latest_step(p.model_dir)
    try:
        return hvd_lib.agree_on(latest_step(p.model_dir) if p.role.writes_run_files else None)
    except tf.errors.OpError as error:  # rank 0 ended first, e.g. refusing the model
        if peers.is_horovod_shut_down(error):
            raise peers.rank_ended(error, None, tf.train.latest_checkpoint(p.model_dir)) from None
        raise


def start(p: Plan, out, say, owner: bool, evaluates: bool):
    """(the prepared plan, the step it resumes from or None): the input's prepare() run with
    the checkpoint's step, the header said, and what would fail later refused now.

    owner: the run's owner (local, chief, Horovod rank 0) checks the PREDICT and EVAL graphs
    and the checkpoint it resumes from, then writes config.yaml. evaluates: it (or its
    evaluator) evaluates, so an eval input that never ends is refused.
    """
    p = dataclasses.replace(p, start_step=resume_step(p) or 0).prepared()
    say(describe(p))  # once prepare() has run: what follows the header is the run itself
    note = precision.cpu_note(p.config.compute.mixed_precision)
    if note:
        say(note)
    say_serving_input(p, say)
    if owner:  # before anything is written; PREDICT first, as the export needs it
        check_predict_graph(p)
        check_eval_metric_names(p)
    if evaluates:
        check_eval_input_ends(p)
    if owner:  # before anything is written: refuse a damaged or mismatched checkpoint
        guards.check_resume(p.model_dir, build_model_fn(p),
                            make_input_fn(p, tf.estimator.ModeKeys.TRAIN), p.params(), say=out)
        checkpoints_lib.check_same_lr_scale(p.model_dir, p.config.distribute.scale_lr,
                                            p.replicas)
    start_step = resume_step(p)  # again: check_resume may have repaired the state file
    # The input continues the data stream at the checkpoint's step (position.py).
    p = dataclasses.replace(p, start_step=start_step or 0)
    if owner and start_step is not None:
        out(f"resuming from the checkpoint at step {start_step} in {p.model_dir}")
    if owner:
        save_run_files(p, say=out)
        evaluator_lib.clear_end(p.model_dir)
    return p, start_step


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


# -- the Estimator and its hooks ---------------------------------------------------------
@contextlib.contextmanager
def estimator_for(p: Plan, strategy, start_step: Optional[int], out, owner: bool):
    """The Estimator, warm-started when asked (a Horovod rank > 0 gets every variable from
    rank 0 instead); a Horovod rank > 0 trains in a scratch dir, removed afterwards, and a
    multi_worker_mirrored task's shadow dirs are removed at its start and end."""
    warm_start = warm_start_settings(p) if p.role.warm_starts else None
    if warm_start and start_step is None and owner:
        out(f"warm-starting variables matching {p.config.train.warm_start_vars!r} from "
            f"{warm_start.ckpt_to_initialize_from}")
    scratch = (tempfile.TemporaryDirectory(prefix=f"estimator-dist-rank{p.role.index}-")
               if p.role.horovod_follower else contextlib.nullcontext())
    with scratch as scratch_dir, shadow_dirs_removed(p):
        yield build_estimator(p, build_run_config(p, strategy, scratch_dir), warm_start)


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
        with signals.on_exit_now(lambda _error: remove()):
            yield
    finally:
        remove()


@dataclasses.dataclass
class Training:
    """What a procedure trains with: the hooks (progress first), the specs, and what the
    summary compares with afterwards."""

    hooks: List[Any]
    train_spec: Any
    eval_spec: Any
    earlier_exports: set
    started: float

    @property
    def progress(self) -> ProgressHook:
        return self.hooks[0]

    @property
    def horovod_vote(self):
        """Horovod's stop-together hook, which also votes on SIGTERM (VOTE), or None."""
        return next((h for h in self.hooks if isinstance(h, horovod_train.StopTogetherHook)),
                    None)


def training(p: Plan, estimator, out, say, extra_hooks=(), owner: bool = False) -> Training:
    """The hooks and specs of this task's training: progress (printed by the owner), its
    role's hooks (their lines said by `say`), the train-op check, the elastic step file, the
    distinct-variables fix and `extra_hooks`."""
    t = p.config.train
    progress = ProgressHook(p.global_batch, t.train_steps, every_n=log_every(t.train_steps),
                            emit=out if owner else silent,
                            runs_per_step=p.config.distribute.accumulate_steps,
                            bar_stream=sys.stdout if out is print and sys.stdout.isatty()
                            and owner else None,
                            summary_dir=p.model_dir if owner else None)
    hooks = ([progress] + role_hooks(p, estimator, say) + [train_op_check(p)]
             + step_file_hooks() + [DistinctVariablesHook()] + list(extra_hooks))
    train_spec = tf.estimator.TrainSpec(make_input_fn(p, tf.estimator.ModeKeys.TRAIN),
                                        max_steps=t.train_steps, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(
        make_input_fn(p, tf.estimator.ModeKeys.EVAL), steps=t.eval_steps or None,
        # A chief that exports the final checkpoint itself runs no FinalExporter: Estimator's
        # `master` ran it twice in an asynchronous run (at steps 30 and 31 of 30).
        exporters=export_lib.make_exporters(
            "none" if t.export == "final" and p.role.exports_final_itself else t.export,
            p.serving_input, t.keep_checkpoint_max, t.best_metric,
            config_lib.higher_is_better(t.best_metric, t.higher_is_better)),
        start_delay_secs=0, throttle_secs=t.eval_every_secs)
    # Only this run's exports are reported: a resumed chief printed an earlier run's.
    return Training(hooks, train_spec, eval_spec, set(export_lib.export_paths(p.model_dir)),
                    time.perf_counter())


def role_hooks(p: Plan, estimator, say) -> List[Any]:
    """Early stopping when asked (every task but the evaluator runs it), the first-batch
    comparison of multi_worker_mirrored workers; Horovod's broadcast and stop-together."""
    t = p.config.train
    if p.role.horovod:
        should_stop = None
        if t.early_stop and p.role.decides_early_stop:
            should_stop = early_stopping.make_should_stop(
                estimator.eval_dir(), t.early_stop,
                config_lib.higher_is_better(t.early_stop, t.higher_is_better), t.patience,
                t.min_delta, say)
        every = config_lib.checkpoint_every(p.config) or log_every(t.train_steps)
        # Broadcast first (before anything reads the step); rank 0's early stop is voted.
        return [horovod_train.BroadcastHook(),
                horovod_train.StopTogetherHook(should_stop, every, say)]
    hooks = []
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


# -- training ----------------------------------------------------------------------------
def guarded(p: Plan, sigterm: str, sigint: Optional[str] = None,
            vote=None) -> guards.TrainingGuard:
    """The training guard with this procedure's reaction to SIGTERM (SIGUSR1, SIGUSR2) and
    to Ctrl-C (guards/training_guard.py: SAVE, VOTE, EXIT, SERVE_UNTIL_SAVED); `vote`: a
    training hook that votes inside the step (Training.horovod_vote)."""
    return guards.TrainingGuard(p.model_dir, p.config.distribute.accumulate_steps, p.role,
                                sigterm=sigterm, sigint=sigint, vote=vote)


def train_and_evaluate(p: Plan, estimator, guard, t: Training, say):
    """tf.estimator.train_and_evaluate (a ps: its server, until the run ends)."""
    with own_server_checked(p):
        return tf.estimator.train_and_evaluate(estimator, guard.attach(t.train_spec),
                                               guard.attach_eval(t.eval_spec))


def evaluate_each_checkpoint(p: Plan, estimator, guard, t: Training, say):
    """The evaluator's loop; an evaluator outpaced by checkpoint rotation retries.

    In a cluster the chief may delete the checkpoint the evaluator is about to restore
    (keep_checkpoint_max); the evaluator then simply moves on to the newest.
    """
    while True:
        try:
            return evaluator_lib.run(estimator, guard.attach(t.train_spec),
                                     guard.attach_eval(t.eval_spec), say)
        except (ValueError, tf.errors.NotFoundError) as e:
            if not rotated_away(e):
                raise
            say("the checkpoint under evaluation was deleted by checkpoint rotation; "
                "evaluating the newest one")


def rotated_away(error: Exception) -> bool:
    """The evaluator lost the race with keep_checkpoint_max: its checkpoint was deleted."""
    return isinstance(error, tf.errors.NotFoundError) or (
        isinstance(error, ValueError) and "not a valid checkpoint" in str(error))


def train_only(estimator, guard, t: Training, start_step: Optional[int]):
    """Estimator.train: a chief training alone beside its evaluator, or a Horovod rank > 0.

    A Horovod rank > 0 skips training exactly when rank 0 does (rank 0's checkpoint already
    at --train_steps): entering it alone, it would wait in the first broadcast for rank 0,
    which never comes (horovod#346, #1581; measured: it fails once rank 0 exits).
    """
    spec = guard.attach(t.train_spec)
    if start_step is not None and start_step >= spec.max_steps:
        return None
    estimator.train(spec.input_fn, max_steps=spec.max_steps, hooks=spec.hooks)
    return None


# -- after training ----------------------------------------------------------------------
def check_trained(p: Plan, start_step: Optional[int]):
    """A run that took no step although --train_steps asked for more: its input gave no batch
    (Estimator ends training at the input's end without a word, and exited 0)."""
    step, start = latest_step(p.model_dir) or 0, start_step or 0
    if step == start < p.config.train.train_steps:
        raise UserError(f"input '{p.input.name}' gave no training batch: the run ended at step "
                        f"{step} of --train_steps {p.config.train.train_steps}; its input_fn must "
                        f"return a non-empty dataset (repeat() it to train past one pass)")


def say_input_end(p: Plan, t: Training, say):
    """Training that ended before --train_steps with no early stop: the input ran out
    (Estimator ends training at its input's end, and said nothing)."""
    step, target = latest_step(p.model_dir) or 0, p.config.train.train_steps
    if step < target and not stopped_early(t.hooks):
        say(f"input '{p.input.name}' ran out at step {step} of --train_steps {target}, which "
            f"ends training as Estimator does; repeat() its dataset to train all {target} steps")


def mark_end_for_evaluator(p: Plan):
    """The chief's end marker: the evaluator evaluates the last checkpoint and exports."""
    evaluator_lib.mark_end(p.model_dir, latest_step(p.model_dir))


def metrics_of(result) -> Dict[str, Any]:
    """train_and_evaluate's (eval result, export results), as plain numbers."""
    return {k: plain(v) for k, v in (result[0] if result else {}).items()}


def metrics_when_already_trained(p: Plan, estimator, t: Training, result) -> Dict[str, Any]:
    """Already at --train_steps, Estimator skipped training and the evaluation that follows a
    checkpoint: the final one is evaluated (and exported, when not yet) here."""
    if result and result[0] is None:
        result = (estimator.evaluate(t.eval_spec.input_fn, steps=t.eval_spec.steps), None)
        export_when_already_trained(p, estimator, t.eval_spec, result[0])
    return metrics_of(result)


def evaluate_and_export_final(p: Plan, t: Training, out, evaluate: bool,
                              metrics: Dict[str, Any]) -> Dict[str, Any]:
    """A cluster's chief with no evaluator task: nothing evaluated while it trained (unless
    Estimator's `master` did), so it evaluates the final checkpoint, and exports it once."""
    if evaluate:
        metrics = metrics_of((evaluate_final_checkpoint(p, t.eval_spec), None))
    if p.config.train.export != "none":
        with signals.raise_on_sigterm(
                lambda: stop_messages.export_stopped(tf.train.latest_checkpoint(p.model_dir))):
            exported = export_from_chief(p)
        out("no evaluator task: the chief exported the final checkpoint" if exported else
            "no evaluator task: the final checkpoint is exported already")
    return metrics


def summarize(p: Plan, t: Training, start_step: Optional[int], metrics: Dict[str, Any], say,
              writes_summary: bool, evaluated_elsewhere: bool = False) -> Dict[str, Any]:
    """The run's result line and --summary_json (by the task that holds the final metrics)."""
    config = p.config
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
        "exports": [] if evaluated_elsewhere else [
            e for e in export_lib.export_paths(p.model_dir) if e not in t.earlier_exports],
        "examples_per_sec": t.progress.examples_per_sec,
        "wall_seconds": round(time.perf_counter() - t.started, 2),
        "model_dir": p.model_dir,
    }
    say(format_result(summary, evaluated_elsewhere))
    if config.train.summary_json and writes_summary:
        write_summary(config.train.summary_json, summary)
    return summary
