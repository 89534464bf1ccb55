"""One procedure per kind of process, from its start to its exit code.

tensorflow/estimator's training.py runs `'run_' + task_type`, one method per role; here
each kind of process has its procedure, read top to bottom: what it checks at its start,
what it trains or serves or evaluates, what it writes at the end, and what SIGTERM
(SIGUSR1, SIGUSR2) and SIGINT do to it. distribute/role.py says what a process is (its
Role: kind, strategy, cluster, Horovod ranks); the steps they share are in steps.py.

Exit codes (README): 0 done, 143 stopped by SIGTERM (retryable: the rerun resumes), 130
stopped by Ctrl-C, 144 a lost peer (retryable), 2 refused, 5 storage; a cluster task
stopped after the chief finished the run says `done` and exits 0.
"""
from typing import Any, Dict

from estimator_dist.distribute import role as role_lib
from estimator_dist.guards import peers
from estimator_dist.guards.training_guard import EXIT, SAVE, SERVE_UNTIL_SAVED, VOTE
from estimator_dist.training import config as config_lib
from estimator_dist.training import steps
from estimator_dist.training.plan import Plan, plan


def run(config: config_lib.Config, out=print, extra_hooks=()) -> Dict[str, Any]:
    """This process's part of the run, by its kind; returns its summary.

    extra_hooks: SessionRunHooks added to training's (the bench's step clock).
    """
    p = plan(config, defer_prepare=True)
    peers.pause_between_session_retries()
    return procedure(p.role)(p, out, extra_hooks)


def procedure(role):
    """The procedure of a process with this Role."""
    return run_horovod_rank if role.horovod else PROCEDURES[role.kind]


def run_local(p: Plan, out, extra_hooks=()) -> Dict[str, Any]:
    """One process (also a one-machine job's TF_CONFIG: Vertex AI's one replica).

    Start: holds model_dir's lock, checks the model's PREDICT and EVAL graphs, the input's
    end, the checkpoint it resumes from, writes config.yaml. Runs train_and_evaluate and
    exports as --export says (an early stop's step too). End: a run that trained nothing
    is refused; an input that ran out is said; at --train_steps already, it evaluates and
    exports the final step itself. SIGTERM: finishes its step, saves it, exit 143; Ctrl-C:
    the same, exit 130. Refused before its first checkpoint: no model_dir left.
    """
    with steps.owning_model_dir(p):
        steps.set_tf_config(p)  # none: TensorFlow runs this process alone
        strategy = steps.build_strategy(p)
        p, start_step = steps.start(p, out, say=out, owner=True, evaluates=True)
        with steps.estimator_for(p, strategy, start_step, out, owner=True) as estimator:
            t = steps.training(p, estimator, out, out, extra_hooks, owner=True)
            with steps.guarded(p, sigterm=SAVE, sigint=SAVE) as guard:
                result = steps.train_and_evaluate(p, estimator, guard, t, out)
                steps.export_after_early_stop(p, estimator, t.hooks, out)
            steps.check_trained(p, start_step)
            steps.say_input_end(p, t, out)
            metrics = steps.metrics_when_already_trained(p, estimator, t, result)
            return steps.summarize(p, t, start_step, metrics, out, writes_summary=True)


def run_chief(p: Plan, out, extra_hooks=()) -> Dict[str, Any]:
    """A TF_CONFIG cluster's chief: owns model_dir as a local run does and trains with its
    workers (parameter servers, multi_worker_mirrored), or alone beside an evaluator task
    under a one-machine strategy.

    With an evaluator task, that task evaluates and exports (and writes --summary_json);
    without one, the chief evaluates and exports the final checkpoint itself. It marks
    the run's end for the evaluator. SIGTERM: under multi_worker_mirrored the workers vote
    on one step and save it together; otherwise it finishes its step and saves it; within
    a deadline either way (its peers may be stopping too), exit 143. Ctrl-C is for its
    launcher.
    """
    cluster = p.role.cluster
    with steps.owning_model_dir(p):
        steps.set_tf_config(p)
        strategy = steps.build_strategy(p)
        p, start_step = steps.start(p, out, say=out, owner=True, evaluates=True)
        with steps.estimator_for(p, strategy, start_step, out, owner=True) as estimator:
            t = steps.training(p, estimator, out, out, extra_hooks, owner=True)
            with steps.guarded(p, sigterm=VOTE if p.strategy.every_worker_saves else SAVE) \
                    as guard:
                if p.role.trains_alone:  # TensorFlow sees no cluster; its evaluator evaluates
                    result = steps.train_only(estimator, guard, t, start_step)
                else:
                    result = steps.train_and_evaluate(p, estimator, guard, t, out)
            steps.say_input_end(p, t, out)
            steps.mark_end_for_evaluator(p)
            metrics = steps.metrics_of(result)
            if cluster.chief_evaluates:  # Estimator's `master` evaluated every checkpoint
                metrics = steps.final_eval_metrics(p.model_dir)
            if not cluster.has_evaluator:
                metrics = steps.evaluate_and_export_final(
                    p, t, out, evaluate=not cluster.chief_evaluates, metrics=metrics)
            return steps.summarize(p, t, start_step, metrics, out,
                                   writes_summary=not cluster.has_evaluator,
                                   evaluated_elsewhere=cluster.has_evaluator)


def run_worker(p: Plan, out, extra_hooks=()) -> Dict[str, Any]:
    """Another training task of a TF_CONFIG cluster: trains silently with the chief and
    writes nothing of the run's (a multi_worker_mirrored worker's copy of each save goes to
    a shadow dir, removed at its start and end).

    SIGTERM: under multi_worker_mirrored it votes with the others and saves the voted step
    with them, exit 143; a parameter-server worker exits 143 at once (it saves nothing).
    Stopped after the chief finished the run: `done`, exit 0. Its steps and session wait
    for peers that may be gone: a deadline, exit 144.
    """
    quiet = steps.silent
    with steps.finishing_with_the_chief(p):
        steps.set_tf_config(p)
        strategy = steps.build_strategy(p)
        p, start_step = steps.start(p, out, say=quiet, owner=False, evaluates=False)
        with steps.estimator_for(p, strategy, start_step, out, owner=False) as estimator:
            t = steps.training(p, estimator, out, quiet, extra_hooks, owner=False)
            with steps.guarded(p, sigterm=VOTE if p.strategy.every_worker_saves else EXIT) \
                    as guard:
                result = steps.train_and_evaluate(p, estimator, guard, t, quiet)
            return steps.summarize(p, t, start_step, steps.metrics_of(result), quiet,
                                   writes_summary=False,
                                   evaluated_elsewhere=p.role.cluster.has_evaluator)


def run_ps(p: Plan, out, extra_hooks=()) -> Dict[str, Any]:
    """A parameter server: holds variables (no GPU of its own) and serves until the chief
    finished the run; its launcher then stops it: `done`, exit 0.

    SIGTERM before that: exit 143 at once; in an srun step (Slurm signals every task at
    once) it serves until the chief has saved its final checkpoint, then exits 143.
    """
    quiet = steps.silent
    with steps.finishing_with_the_chief(p):
        steps.set_tf_config(p)
        strategy = steps.build_strategy(p)
        p, start_step = steps.start(p, out, say=quiet, owner=False, evaluates=False)
        with steps.estimator_for(p, strategy, start_step, out, owner=False) as estimator:
            t = steps.training(p, estimator, out, quiet, extra_hooks, owner=False)
            with steps.guarded(p, sigterm=SERVE_UNTIL_SAVED) as guard:
                result = steps.train_and_evaluate(p, estimator, guard, t, quiet)  # serves
            return steps.summarize(p, t, start_step, steps.metrics_of(result), quiet,
                                   writes_summary=False)


def run_evaluator(p: Plan, out, extra_hooks=()) -> Dict[str, Any]:
    """A cluster's evaluator: no strategy (evaluation needs no replicas), no server;
    evaluates each new checkpoint until the chief marks the run's end, then the last one,
    and runs the exporters. Its result: the last evaluation's, with --summary_json.

    SIGTERM: exit 143 at once, removing an export it was writing. Outpaced by checkpoint
    rotation, it moves on to the newest checkpoint.
    """
    steps.set_tf_config(p)
    p, start_step = steps.start(p, out, say=out, owner=False, evaluates=True)
    with steps.estimator_for(p, None, start_step, out, owner=False) as estimator:
        t = steps.training(p, estimator, out, out, extra_hooks, owner=False)
        with steps.guarded(p, sigterm=EXIT) as guard:
            steps.evaluate_each_checkpoint(p, estimator, guard, t, out)
        return steps.summarize(p, t, start_step, steps.final_eval_metrics(p.model_dir), out,
                               writes_summary=True)


def run_horovod_rank(p: Plan, out, extra_hooks=()) -> Dict[str, Any]:
    """A Horovod rank. Rank 0 owns model_dir as a local run does, evaluates and exports; a
    rank > 0 trains in a scratch dir of its own, gets every variable from rank 0 (no warm
    start of its own) and skips training exactly when rank 0 does.

    SIGTERM to any rank: every rank stops after the same step, voted inside the step's
    all-reduce; rank 0 saves it, all exit 143 (within a deadline: a peer may be gone). A
    lone rank saves as a local run. Ctrl-C: a lone rank's, as a local run.
    """
    steps.set_tf_config(p)  # none: Horovod needs no TF_CONFIG
    if p.role.horovod_follower:
        quiet = steps.silent
        strategy = steps.build_strategy(p)
        p, start_step = steps.start(p, out, say=quiet, owner=False, evaluates=False)
        with steps.estimator_for(p, strategy, start_step, out, owner=False) as estimator:
            t = steps.training(p, estimator, out, quiet, extra_hooks, owner=False)
            with steps.guarded(p, sigterm=VOTE, vote=t.horovod_vote) as guard:
                steps.train_only(estimator, guard, t, start_step)
            return steps.summarize(p, t, start_step, {}, quiet, writes_summary=False)
    alone = p.role.num_workers == 1
    with steps.owning_model_dir(p):
        strategy = steps.build_strategy(p)
        p, start_step = steps.start(p, out, say=out, owner=True, evaluates=True)
        with steps.estimator_for(p, strategy, start_step, out, owner=True) as estimator:
            t = steps.training(p, estimator, out, out, extra_hooks, owner=True)
            with steps.guarded(p, sigterm=SAVE if alone else VOTE,
                               sigint=SAVE if alone else None, vote=t.horovod_vote) as guard:
                result = steps.train_and_evaluate(p, estimator, guard, t, out)
                steps.export_after_early_stop(p, estimator, t.hooks, out)
            if alone:
                steps.check_trained(p, start_step)
            metrics = steps.metrics_when_already_trained(p, estimator, t, result)
            return steps.summarize(p, t, start_step, metrics, out, writes_summary=True)


PROCEDURES = {role_lib.LOCAL: run_local, role_lib.CHIEF: run_chief, role_lib.WORKER: run_worker,
              role_lib.PS: run_ps, role_lib.EVALUATOR: run_evaluator}
