"""Guard rails around one training run: the runner's single entry to them.

- before: `check_resume` (checkpoints.py) refuses a checkpoint that is damaged
  or does not match the model and repairs a broken state file, before anything
  is written (variables that cannot fit in this machine's memory are refused
  while the TRAIN graph is built: runner.memory_checked, memory.py);
- during: `TrainingGuard` adds GuardHook to the TrainSpec, turns SIGTERM into a
  final checkpoint (signals.py), or, during an evaluation between training
  steps, into the end of that evaluation (EvaluationStopHook, on the EvalSpec),
  makes a failed checkpoint save an error (storage.py), never creates
  world-writable files;
- after a failure: removes the temp files the run left and turns TensorFlow's
  errors into one-line ReportedErrors: NonFiniteError naming the step
  (numerics.py), StorageError naming the file, OutOfMemory naming the tensor
  (memory.py).
"""
import contextlib
import os
import signal
import threading
from typing import List, Optional

import tensorflow as tf

from estimator_dist.guards import checkpoints
from estimator_dist.guards import memory
from estimator_dist.graph import numerics
from estimator_dist.guards import peers
from estimator_dist.guards import preemption_vote
from estimator_dist.guards import signals
from estimator_dist.guards import stop_messages
from estimator_dist import quiet
from estimator_dist import timers
from estimator_dist.guards import storage
from estimator_dist.errors import (ReportedError, StorageError, TrainingFailed, first_line,
                                   op_error_line)
from estimator_dist.guards import step_end
from estimator_dist.distribute.role import WORKER, Role

# A Slurm step's ps on SIGTERM outlives the chief's deadline (PEER_DEADLINE_S) by this much.
PS_MARGIN_S = 10.0
CHECKPOINT_BASENAME = "model.ckpt"  # Estimator's CheckpointSaverHook name


def save_final_checkpoint(session, saver, model_dir: str, step: int) -> str:
    """Save model_dir/model.ckpt-<step> with Estimator's saver (unless it just did)."""
    done = [p for p in saver.last_checkpoints if p.endswith(f"-{step}")]
    if done:
        return done[-1]
    path = saver.save(session, os.path.join(model_dir, CHECKPOINT_BASENAME), global_step=step)
    with contextlib.suppress(Exception):  # best effort: keep TensorBoard's last points
        tf.compat.v1.summary.FileWriterCache.get(model_dir).flush()
    return path


class GuardHook(tf.compat.v1.train.SessionRunHook):
    """Knows the global step; on a stop request saves a final checkpoint and exits 143.

    Steps are counted from the restored global step, one per `runs_per_step`
    session runs (--accumulate_steps; see accumulate.AccumulateHook), so the step
    a failing run was computing is `step + 1` with no extra fetch per run. A stop
    request ends training after the current session run, mid-update too: the
    update's partial sums (local, never saved) are dropped rather than waited for
    (--accumulate_steps 100000 ignored SIGTERM for minutes).
    """

    def __init__(self, model_dir: str, runs_per_step: int = 1, saves_on_stop: bool = True):
        self._model_dir = model_dir
        self._runs_per_step = max(1, runs_per_step)
        self._saves_on_stop = saves_on_stop
        self.step: Optional[int] = None
        self.session_created = False  # read by the SIGTERM watcher thread
        self.active = False
        self.stop_requested = False
        self.stop_signal = signal.SIGTERM  # or SIGINT: what the stop's line and exit code say
        self._runs = 0
        self._saver = None

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        savers = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS)
        self._saver = savers[0] if savers else None
        if self._saver is not None:
            storage.guard_saver(self._saver, self.kept)
        self.active = True

    def kept(self) -> str:
        latest = tf.train.latest_checkpoint(self._model_dir)
        return (f"the previous checkpoint {latest} is intact" if latest
                else "no earlier checkpoint exists") + "; the failed write's temp files were removed"

    def after_create_session(self, session, coord):
        self.step = int(session.run(self._global_step))
        self._runs = 0
        self.session_created = True

    def after_run(self, run_context, run_values):
        self._runs += 1
        if self._runs % self._runs_per_step == 0:
            self.step += 1
        if self.stop_requested and self._saves_on_stop:
            # Exit, not raise into TensorFlow's session close: its teardown of the input
            # waited for tf.data's autotuning thread (about 10 s in 2 of 4 local runs); a
            # parameter_server chief under Slurm ran past its deadline there, saying "no
            # final checkpoint" beside the one it had saved.
            signals.exit_from_main_thread(self._preempt(run_context.session))

    def end(self, session):
        self.active = False

    def _preempt(self, session):
        self.active = False
        step = int(session.run(self._global_step))
        if self._saver is None:  # a model_fn with a Scaffold saver of its own: cannot save
            return stop_messages.preempted(step, None,
                                           tf.train.latest_checkpoint(self._model_dir),
                                           self.stop_signal)
        path = save_final_checkpoint(session, self._saver, self._model_dir, step)
        return stop_messages.preempted(step, path, signum=self.stop_signal)


class EvaluationStopHook(tf.compat.v1.train.SessionRunHook):
    """Ends an evaluation that runs inside training once SIGTERM asked training to stop.

    Estimator evaluates between two training steps, right after a checkpoint save
    (its saving listener), so GuardHook only sees the signal when the whole evaluation
    is over, which can outlast the scheduler's grace period. This hook, on the
    EvalSpec, exits 143 before the next eval batch instead: the checkpoint
    just saved is the final one, and no metrics of the cut-off evaluation are
    written (Estimator writes them when an evaluation ends). Evaluations outside
    training (the final one, an evaluator task) never see a stop request here.
    """

    def __init__(self, guard_hook: GuardHook, model_dir: str, exit_after_vote=None):
        self._guard = guard_hook
        self._model_dir = model_dir
        self._exit_after_vote = exit_after_vote

    def before_run(self, run_context):
        if self._exit_after_vote is not None:
            # The voted step is saved and its save started this evaluation: exit 143 now,
            # the preemption's time is not the evaluation's.
            self._exit_after_vote.exit_if_voted()
        if self._guard.stop_requested and self._guard.active:
            self._guard.active = False
            signals.exit_from_main_thread(stop_messages.preempted_during_evaluation(
                tf.train.latest_checkpoint(self._model_dir), self._guard.stop_signal))


# What a process does on SIGTERM (SIGUSR1, SIGUSR2), as its procedure (training/roles.py)
# says: finish its step, save it and exit 143 (SAVE; Ctrl-C too, exit 130); vote with the
# other workers on one step and save it together (VOTE, multi_worker_mirrored); exit 143 at
# once, writing nothing (EXIT); a ps in an srun step serves until the chief has saved
# (SERVE_UNTIL_SAVED; elsewhere it exits at once).
SAVE, VOTE, EXIT, SERVE_UNTIL_SAVED = "save", "vote", "exit", "serve_until_saved"
SIGTERM_REACTIONS = (SAVE, VOTE, EXIT, SERVE_UNTIL_SAVED)


class TrainingGuard:
    """Context manager around `train_and_evaluate`; `attach(train_spec)` adds its hooks,
    `attach_eval(eval_spec)` the one that cuts an evaluation short on SIGTERM.

    role: this process's Role (roles.py), which says how it stops. A local run handles
    SIGTERM (a final checkpoint, exit 143), and so does a cluster's chief when it saves
    alone (parameter servers), within a deadline, as its step waits for peers
    that may be stopping too (signals.py). Under multi_worker_mirrored every worker
    takes part in a save (StrategySpec.every_worker_saves), so there every worker
    handles SIGTERM: the workers vote to stop at one
    step, save together and exit 143 (preemption_vote.py), within the same deadline; so
    do Horovod's ranks, with the vote their gradient all-reduce carries (`vote`).
    The evaluator, ps tasks and the workers of parameter-server training write no
    checkpoint: they exit 143 at once with one line (the evaluator removing an export it
    was writing), from the signal's watcher thread (signals.exit_now). After a failure
    a task removes only the temp files of what it writes: checkpoints (local, chief),
    exports (local, evaluator).
    """

    def __init__(self, model_dir: str, runs_per_step: int = 1, role: Optional[Role] = None,
                 sigterm: str = SAVE, sigint: Optional[str] = SAVE, vote=None):
        """vote: under VOTE, a hook of the training's own that votes inside its step (Horovod's
        StopTogetherHook: `signalled`, `stopped_at`, `signalled_workers`); by default
        preemption_vote.VoteHook, added to the hooks here."""
        self.model_dir = model_dir
        self.role = role = role or Role.local()
        if sigterm not in SIGTERM_REACTIONS or sigint not in (SAVE, None):
            raise ValueError(f"sigterm {sigterm!r}, sigint {sigint!r}: not a reaction")
        self.sigterm, self.sigint = sigterm, sigint
        votes = sigterm == VOTE
        self._own_vote = votes and vote is None
        self.vote = (preemption_vote.VoteHook(role.num_workers, runs_per_step)
                     if self._own_vote else vote if votes else None)
        # The same workers step together: one gone stalls the others (peers.py).
        self.stall = peers.StallHook(model_dir) if self._own_vote and role.num_workers > 1 \
            else None
        self._exit_after_vote = preemption_vote.ExitAfterTheVoteHook(
            self.vote, role.names_checkpoint_on_vote, model_dir) if self.vote else None
        # A parameter_server worker: its steps and its session wait for the ps tasks, which
        # may be gone (under Slurm nobody stops it then): step and session deadlines, 144.
        self.ps_worker = role.kind == WORKER and role.in_cluster and not votes and \
            role.cluster.num_ps > 0
        if self.ps_worker:
            self.stall = peers.StallHook(model_dir, lost=peers.PS_PEER)
        self._session_deadline = None
        self.hook = GuardHook(model_dir, runs_per_step, saves_on_stop=not votes)
        # Finishes its step and saves on SIGTERM; the others exit at once.
        self.handles_sigterm = sigterm in (SAVE, VOTE)
        self._deadline, self._deadline_lock = None, threading.Lock()

    def attach(self, train_spec: tf.estimator.TrainSpec) -> tf.estimator.TrainSpec:
        # The vote's exit acts at the session's close, after every hook's end(): any place
        # will do but the last, which is the StallHook's.
        own_vote = self.vote if self._own_vote else None
        hooks = (self.hook,) + tuple(h for h in (own_vote, self._exit_after_vote, self.stall)
                                     if h)
        first = (self.stall.ended,) if self.stall else ()  # StallHook times the run alone
        return tf.estimator.TrainSpec(train_spec.input_fn, train_spec.max_steps,
                                      first + tuple(train_spec.hooks) + hooks,
                                      train_spec.saving_listeners)

    def attach_eval(self, eval_spec: tf.estimator.EvalSpec) -> tf.estimator.EvalSpec:
        return eval_spec._replace(hooks=tuple(eval_spec.hooks) + (
            EvaluationStopHook(self.hook, self.model_dir, self._exit_after_vote),))

    def _on_sigterm(self, signum=signal.SIGTERM):
        if self.role.trains_in_a_group and not self.hook.session_created:
            return  # nothing to save: the watcher thread exits at once (_start_deadline)
        if self.hook.stop_requested or (self.vote and self.vote.stopped_at is not None):
            return  # already stopping (under a vote: every worker saving together)
        self.hook.stop_requested = True
        self.hook.stop_signal = signum
        if self.vote:
            self.vote.signalled = True
        self._start_deadline()
        if not self.hook.active:  # no training step to finish: stop now
            raise stop_messages.preempted_outside_training(
                tf.train.latest_checkpoint(self.model_dir), signum)

    def _start_deadline(self):
        """A cluster task exits 143 PEER_DEADLINE_S after SIGTERM at the latest (once);
        called by signals.SignalWatch's thread the moment SIGTERM arrives, also while the
        main thread is blocked. Before its session exists (building the graph, waiting for
        its peers to connect) a task has nothing to save: it exits at once."""
        if not self.role.trains_in_a_group:
            return
        if not self.hook.session_created:
            signals.exit_now(stop_messages.connecting_stopped(
                tf.train.latest_checkpoint(self.model_dir)), cleanup=self._remove_own_temp_files)
        with self._deadline_lock:
            if self._deadline is None:
                self._deadline = signals.exit_by_deadline(
                    timers.seconds("peer_deadline_s", signals.PEER_DEADLINE_S),
                    lambda: tf.train.latest_checkpoint(self.model_dir))

    def _stopped(self):
        """What a task that exits at once on SIGTERM says."""
        latest = tf.train.latest_checkpoint(self.model_dir)
        if self.role.writes_exports:  # the evaluator
            return stop_messages.evaluator_stopped(latest)
        return stop_messages.task_stopped(self.role.what, latest)

    def _remove_own_temp_files(self):
        storage.remove(storage.temp_entries(self._watched()) - self._before)

    def _watched(self) -> List[str]:
        watched = [self.model_dir] if self.role.writes_checkpoints else []
        if self.role.writes_exports:
            watched += sorted(storage.export_bases(self.model_dir))
        return watched

    def __enter__(self):
        self._before = storage.temp_entries(self._watched())
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(storage.not_world_writable())
        if self.handles_sigterm:
            self._stack.enter_context(signals.call_on_sigterm(self._on_sigterm,
                                                              at_once=self._start_deadline,
                                                              pass_signum=True))
        elif self.sigterm == SERVE_UNTIL_SAVED and step_end.current():
            # An srun step's ps: Slurm signals every task at once; it serves until the chief
            # has saved its final checkpoint (step_end.py).
            watch = step_end.current()
            limit = timers.seconds("peer_deadline_s", signals.PEER_DEADLINE_S) + PS_MARGIN_S
            self._stack.enter_context(signals.call_on_sigterm(
                lambda: None, at_once=lambda: watch.on_signal(
                    limit, lambda: tf.train.latest_checkpoint(self.model_dir))))
        else:
            self._stack.enter_context(signals.exit_on_sigterm(
                self._stopped, cleanup=self._remove_own_temp_files))
        if self.ps_worker:
            self._session_deadline = peers.session_deadline(
                lambda: self.hook.session_created, self.model_dir)
        # Ctrl-C in a local run stops as SIGTERM does, exit 130: it dropped every step since
        # the last checkpoint. A cluster's tasks are stopped by their launcher.
        self._stack.enter_context(signals.call_on_signal(
            signal.SIGINT, lambda: self._on_sigterm(signal.SIGINT), enabled=self.sigint == SAVE))
        return self

    def __exit__(self, exc_type, exc, tb):
        self._stack.close()
        if self._session_deadline:
            self._session_deadline.cancel()
        if exc is None and self.vote and self.vote.stopped_at is not None:
            raise preemption_vote.preempted(self.vote, self.role.names_checkpoint_on_vote,
                                            self.model_dir)
        if exc is None:
            return False
        storage.remove(storage.temp_entries(self._watched()) - self._before)
        if isinstance(exc, StorageError) or storage.storage_reason(exc):
            # a record cut off by the full disk, in the training or the evaluation events
            storage.trim_event_files(self._watched() + [os.path.join(self.model_dir, "eval")])
        if isinstance(exc, ReportedError):
            return False
        if self.hook.stop_requested and isinstance(exc, tf.errors.OpError):
            step = self.hook.step + 1 if self.hook.step is not None else None
            raise stop_messages.preempted_by_peers(step, first_line(exc),
                                                tf.train.latest_checkpoint(self.model_dir)) from None
        if self.stall and peers.is_peer_error(exc):
            step = self.hook.step + 1 if self.hook.step is not None else None
            raise peers.peer_failed(exc, step, tf.train.latest_checkpoint(self.model_dir)) from None
        if peers.is_horovod_shut_down(exc):
            step = self.hook.step + 1 if self.hook.step is not None else None
            raise peers.rank_ended(exc, step, tf.train.latest_checkpoint(self.model_dir)) from None
        if numerics.is_non_finite(exc):
            step = self.hook.step + 1 if self.hook.step is not None else None
            raise numerics.non_finite_error(exc, step, tf.train.latest_checkpoint(self.model_dir),
                                            self.model_dir) from None
        if storage.storage_reason(exc):
            raise storage.storage_error(exc, f"writing into {self.model_dir}",
                                        self.hook.kept()) from None
        if memory.is_out_of_memory(exc) and quiet.is_quiet():
            raise memory.out_of_memory(exc, self.hook.step,
                                tf.train.latest_checkpoint(self.model_dir)) from None
        if isinstance(exc, tf.errors.OpError) and quiet.is_quiet():
            step = self.hook.step + 1 if self.hook.step is not None else None
            latest = tf.train.latest_checkpoint(self.model_dir)
            raise TrainingFailed(
                f"training failed at step {step}: {op_error_line(exc)} ({type(exc).__name__}); "
                f"check the input's labels and features against the model; "
                f"{f'the latest checkpoint is {latest}' if latest else 'no checkpoint was written'}"
                f"; --verbose shows TensorFlow's traceback") from None
        return False


def check_resume(model_dir: str, model_fn, input_fn, params, say=print) -> Optional[str]:
    """Before training, on the task that writes checkpoints: see checkpoints.check_resume.

    The model's variables come from a TRAIN graph of model_fn built in a scratch
    graph, and only when there is a checkpoint to compare them with.
    """
    return checkpoints.check_resume(
        model_dir, lambda: checkpoints.model_variables(model_fn, input_fn, params), say=say)
