"""The Role table: what each kind of process does, as the run, the guard and the launcher
ask it (one place; tests of the runs themselves are in test_cluster, test_signals,
test_horovod). And the StrategySpec table against the strategies the CLI offers."""
import contextlib
import json
import os
import signal
import threading
import time
import types

import pytest
import tensorflow as tf

from estimator_dist import checkpoint_files
from estimator_dist.distribute import specs, strategies
from estimator_dist.distribute import tf_config
from estimator_dist.distribute.horovod import Ranks
from estimator_dist.distribute import role as role_lib
from estimator_dist.distribute.role import Role
from estimator_dist.guards import stop_messages
from estimator_dist.launch import layout
from estimator_dist.training import horovod_train


def cluster(task, workers=2, ps=0, evaluator=False):
    spec = {"chief": ["h:1"], "worker": [f"h:{2 + i}" for i in range(workers - 1)],
            "ps": [f"h:{10 + i}" for i in range(ps)]}
    if evaluator:
        spec["evaluator"] = ["h:20"]
    kind, index = task.split(":")
    return tf_config.parse(json.dumps({"cluster": {k: v for k, v in spec.items() if v},
                                       "task": {"type": kind, "index": int(index)}}))


def ranks(rank, size):
    return Ranks(rank=rank, size=size, local_rank=rank, local_size=size, launched=True)


ROLES = {
    "local": Role.of("none"),
    "mwms chief": Role.of("multi_worker_mirrored", cluster("chief:0", evaluator=True)),
    "mwms worker": Role.of("multi_worker_mirrored", cluster("worker:0", evaluator=True)),
    "ps chief, no evaluator": Role.of("parameter_server", cluster("chief:0", ps=1)),
    "ps worker": Role.of("parameter_server", cluster("worker:0", ps=1)),
    "ps task": Role.of("parameter_server", cluster("ps:0", ps=1)),
    "evaluator": Role.of("multi_worker_mirrored", cluster("evaluator:0", evaluator=True)),
    "horovod rank 0": Role.of("horovod", ranks=ranks(0, 2)),
    "horovod rank 1": Role.of("horovod", ranks=ranks(1, 2)),
    "horovod alone": Role.of("horovod", ranks=ranks(0, 1)),
}

# role: (kind, procedure, writes_run_files, exports_final_itself, votes_on_sigterm,
#        trains_in_a_group)
T, F = True, False
EXPECTED = {
    "local": ("local", "run_local", T, F, F, F),
    "mwms chief": ("chief", "run_chief", T, F, T, T),
    "mwms worker": ("worker", "run_worker", F, F, T, T),
    "ps chief, no evaluator": ("chief", "run_chief", T, T, F, T),
    "ps worker": ("worker", "run_worker", F, F, F, T),
    "ps task": ("ps", "run_ps", F, F, F, F),
    "evaluator": ("evaluator", "run_evaluator", F, F, F, F),
    "horovod rank 0": ("chief", "run_horovod_rank", T, F, F, T),
    "horovod rank 1": ("worker", "run_horovod_rank", F, F, F, T),
    "horovod alone": ("local", "run_horovod_rank", T, F, F, F),
}


def procedure_of(role: Role) -> str:
    """The procedure training/roles.py runs for `role`."""
    from estimator_dist.training import roles as procedures

    return procedures.procedure(role).__name__


@pytest.mark.parametrize("name", sorted(ROLES))
def test_role_answers(name):
    r = ROLES[name]
    assert (r.kind, procedure_of(r), r.writes_run_files, r.exports_final_itself,
            r.votes_on_sigterm, r.trains_in_a_group) == EXPECTED[name]


def test_who_trains_in_a_scratch_dir_and_where_it_is():
    assert [n for n, r in ROLES.items() if r.horovod_follower] == ["horovod rank 1"]
    assert ROLES["mwms worker"].where("1 CPU(s)") == "worker:0 of 2 worker(s), 0 ps, 1 CPU(s) each"
    assert ROLES["horovod rank 1"].where("1 CPU(s)") == "rank 1 of 2, 1 CPU(s) each"
    assert ROLES["ps task"].what == "ps task" and ROLES["ps worker"].what == "worker"
    assert ROLES["mwms worker"].task == "worker:0" and ROLES["mwms worker"].address == "h:2"


def test_launcher_task_kinds():
    """The launcher's questions: which tasks train (GPUs), listen, serve until stopped."""
    kinds = {name: role_lib.TASK_TRAITS[layout.kind_of(name)]
             for name in ("chief:0", "worker:1", "ps:0", "evaluator:0")}
    assert [n for n, k in kinds.items() if k.trains] == ["chief:0", "worker:1"]
    assert [n for n, k in kinds.items() if not k.listens] == ["evaluator:0"]
    assert [n for n, k in kinds.items() if k.serves_forever] == ["ps:0"]
    assert role_lib.kind_of_rank(0) == "chief" and role_lib.kind_of_rank(3) == "worker"


def test_every_strategy_has_a_spec_and_a_builder():
    assert specs.names() == sorted(strategies._BUILDERS)  # pylint: disable=protected-access
    assert specs.tf_config_strategies() == ("multi_worker_mirrored", "parameter_server")
    assert [n for n in specs.names() if specs.spec(n).input_gets_global_batch] == ["tower"]
    assert [n for n in specs.names() if specs.restarts_whole_cluster(n)] == \
        ["multi_worker_mirrored"]
    assert specs.is_horovod("horovod") and not specs.is_horovod(None) and \
        not specs.is_horovod("mirored")


def test_the_shadow_dirs_each_task_removes():
    """TensorFlow makes a multi_worker_mirrored worker save its own copy into
    model_dir/tmp_worker_N, which stayed (18 MB after a restart) and showed as a run."""
    names = ["model.ckpt-0.index", "tmp_worker_0", "tmp_worker_1", "tmp_worker_2", "eval"]
    assert ROLES["mwms worker"].shadow_dir == "tmp_worker_0"
    assert ROLES["mwms worker"].shadow_dirs_to_remove(names) == ["tmp_worker_0"]
    assert ROLES["mwms chief"].shadow_dirs_to_remove(names) == ["tmp_worker_1", "tmp_worker_2"]
    for name in ("local", "ps worker", "ps chief, no evaluator", "evaluator", "horovod rank 1"):
        assert ROLES[name].shadow_dir is None and ROLES[name].shadow_dirs_to_remove(names) == []


# -- each procedure driven through its start, a normal end, SIGTERM and Ctrl-C ------------
# training/roles.py's procedures run here in this process with a stand-in for
# training/steps.py that records each step they take. What decides how a process stops is
# real: the model_dir lock and the finish-with-the-chief check around the procedure, the
# TrainingGuard with the reaction the procedure chose, its hooks inside a real TF1 training
# loop (MonitoredTrainingSession, as Estimator runs them), and a real signal sent to this
# process at step 3. The signal's effect on the TensorFlow cluster itself (peers, servers,
# the vote's all-reduce between processes) is tested with real processes in test_signals.py,
# test_cluster.py and test_guards_process.py.
SIGNAL_AT, LAST_STEP = 3, 30


class Exited(BaseException):
    """What signals.exit_now and the peer deadline would have done: os._exit(code). Not an
    Exception: TensorFlow's session close swallows those, never os._exit."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


class Script:
    """training/steps.py for one procedure under test: each step it takes is recorded; its
    training phases (train_and_evaluate, train_only, evaluate_each_checkpoint) run a TF1
    loop with the guard's hooks and send `signum` at step 3."""

    def __init__(self, real_steps, model_dir, signum, exits):
        self.real, self.model_dir, self.signum, self.exits = real_steps, model_dir, signum, exits
        self.calls, self.guards = [], []
        self.silent = real_steps.silent
        self.graph = None  # _train's

    def __getattr__(self, name):
        if not callable(getattr(self.real, name, None)) or name.startswith("_"):
            raise AttributeError(f"training/steps.py has no step {name}")
        results = {"start": lambda p, *a, **k: (p, None), "metrics_of": lambda r: {},
                   "final_eval_metrics": lambda d: {"loss": 0.5},
                   "metrics_when_already_trained": lambda *a: {},
                   "evaluate_and_export_final": lambda *a, **k: {"loss": 0.5},
                   "summarize": lambda *a, **k: {"done": True}}

        def step(*args, **kwargs):
            self.calls.append(name)
            return results.get(name, lambda *a, **k: None)(*args, **kwargs)
        return step

    # the steps that hold something while inside: the real ones where they decide the stop
    def owning_model_dir(self, p):
        self.calls.append("owning_model_dir")
        return self.real.owning_model_dir(p)

    def finishing_with_the_chief(self, p):
        self.calls.append("finishing_with_the_chief")
        return self.real.finishing_with_the_chief(p)

    @contextlib.contextmanager
    def estimator_for(self, *args, **kwargs):
        self.calls.append("estimator_for")
        yield None

    def training(self, p, *args, **kwargs):
        self.calls.append("training")
        # Horovod's stop-together hook, real: its vote is a one-rank all-reduce here (_train)
        vote = horovod_train.StopTogetherHook() if p.role.horovod else None
        return types.SimpleNamespace(hooks=[vote] if vote else [], train_spec=None,
                                     eval_spec=None, horovod_vote=vote)

    def guarded(self, p, sigterm, sigint=None, vote=None):
        self.calls.append(f"guarded(sigterm={sigterm}, sigint={sigint})")
        guard = self.real.guarded(p, sigterm, sigint, vote)
        self.guards.append(guard)
        return guard

    def train_and_evaluate(self, p, estimator, guard, t, say):
        self.calls.append("train_and_evaluate")
        return self._train(guard)

    def train_only(self, estimator, guard, t, start_step):
        self.calls.append("train_only")
        self._train(guard)

    def evaluate_each_checkpoint(self, p, estimator, guard, t, say):
        self.calls.append("evaluate_each_checkpoint")
        self._train(guard)

    def _train(self, guard):
        script = self

        class SignalAt(tf.compat.v1.train.SessionRunHook):
            def after_run(self, run_context, run_values):
                step = run_context.session.run(tf.compat.v1.train.get_global_step())
                if script.signum is None or step != SIGNAL_AT:
                    return
                os.kill(os.getpid(), script.signum)
                # A handler that stops training runs before the next line; an exit at once
                # comes from the signal's watcher thread: wait for either.
                deadline = time.monotonic() + 5.0
                while not (script.exits or guard.hook.stop_requested) and \
                        time.monotonic() < deadline:
                    time.sleep(0.01)
                if script.exits:
                    raise Exited(script.exits[0])

        spec = tf.estimator.TrainSpec(lambda: None, max_steps=LAST_STEP)
        with tf.Graph().as_default() as self.graph:
            global_step = tf.compat.v1.train.get_or_create_global_step()
            w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
            train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
                tf.square(w - 1.0), global_step=global_step)
            # Estimator's saver, in the collection the guard's final save takes it from
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS,
                                           tf.compat.v1.train.Saver(sharded=True))
            horovod = [h for h in (guard.vote,) if isinstance(h, horovod_train.StopTogetherHook)]
            if horovod:  # what minimize() builds, the all-reduce of one rank being identity
                request = tf.compat.v1.placeholder_with_default(0.0, [])
                tf.compat.v1.add_to_collection(horovod_train.VOTES, tf.stack([0.0, request]))
                tf.compat.v1.add_to_collection(horovod_train.STOP_REQUEST, request)
            hooks = horovod + list(guard.attach(spec).hooks) + [
                SignalAt(), tf.compat.v1.train.StopAtStepHook(last_step=LAST_STEP)]
            with tf.compat.v1.train.MonitoredTrainingSession(
                    checkpoint_dir=self.model_dir, hooks=hooks, save_summaries_steps=None,
                    save_summaries_secs=None, log_step_count_steps=None) as session:
                while not session.should_stop():
                    session.run(train_op)


def drive(name, signum, tmp_path, monkeypatch):
    """Run ROLES[name]'s procedure; returns (exit code, steps taken, checkpoint steps)."""
    from estimator_dist import errors
    from estimator_dist.guards import signals
    from estimator_dist.training import roles as procedures, steps

    role = ROLES[name]
    exits, events = [], []

    def exit_now(error, cleanup=None):  # record, never os._exit
        if cleanup:
            cleanup()
        exits.append(stop_messages.finished_instead(error).exit_code)
        events.append("exit")
        if threading.current_thread() is threading.main_thread():
            raise Exited(exits[-1])  # the vote's exit at the session's close: nothing follows

    monkeypatch.setattr(signals, "exit_now", exit_now)
    script = Script(steps, str(tmp_path / "run"), signum, exits)
    close = tf.compat.v1.Session.close

    def closing(session):
        # The training session's close only: Session.__del__ closes too, and an earlier
        # test's session collected meanwhile (a CI run saw three) is none of this run's.
        if session.graph is script.graph:
            events.append("session close")
        return close(session)

    monkeypatch.setattr(tf.compat.v1.Session, "close", closing)
    monkeypatch.setattr(procedures, "steps", script)
    # Ctrl-C as in the CLI's process: KeyboardInterrupt (a pytest-xdist worker ignores SIGINT)
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    strategy = {"local": "none", "ps": "parameter_server", "horovod": "horovod"}.get(
        name.split()[0], "multi_worker_mirrored")
    p = types.SimpleNamespace(role=role, model_dir=str(tmp_path / "run"),
                              strategy=specs.spec(strategy), config=types.SimpleNamespace(
                                  distribute=types.SimpleNamespace(accumulate_steps=1)))
    try:
        procedures.procedure(role)(p, lambda *a: None)
        code = 0
    except Exited as e:
        code = e.code
    except errors.ReportedError as e:
        code = e.exit_code
    except KeyboardInterrupt:
        code = errors.EXIT_INTERRUPTED  # cli.main: "interrupted", exit 130
    finally:
        signal.signal(signal.SIGINT, previous_sigint)
        for guard in procedures.steps.guards:  # a cluster task's 20 s deadline after SIGTERM
            if guard._deadline:  # pylint: disable=protected-access
                guard._deadline.cancel()  # pylint: disable=protected-access
    return (code, procedures.steps.calls, checkpoint_files.index_steps(str(tmp_path / "run")),
            events)


# kind: (steps from start to a normal end, SIGTERM's exit code and the checkpoint steps then,
# Ctrl-C's). The steps a stopped process takes are the same up to its training phase.
START = ["set_tf_config", "build_strategy", "start", "estimator_for", "training"]
OWNER = ["owning_model_dir"] + START
PEER = ["finishing_with_the_chief"] + START
SAVED, VOTED, NOTHING = [0, SIGNAL_AT + 1], [0, 10], [0]  # the vote falls on step 10
PROCEDURE_RUNS = {
    "local": (OWNER + ["guarded(sigterm=save, sigint=save)", "train_and_evaluate",
                       "export_after_early_stop", "check_trained", "say_input_end",
                       "metrics_when_already_trained", "summarize"],
              (143, SAVED), (130, SAVED)),
    "mwms chief": (OWNER + ["guarded(sigterm=vote, sigint=None)", "train_and_evaluate",
                            "say_input_end", "mark_end_for_evaluator", "metrics_of",
                            "summarize"],
                   (143, VOTED), (130, NOTHING)),
    "mwms worker": (PEER + ["guarded(sigterm=vote, sigint=None)", "train_and_evaluate",
                            "metrics_of", "summarize"],
                    (143, VOTED), (130, NOTHING)),
    "ps chief, no evaluator": (OWNER + ["guarded(sigterm=save, sigint=None)",
                                        "train_and_evaluate", "say_input_end",
                                        "mark_end_for_evaluator", "metrics_of",
                                        "evaluate_and_export_final", "summarize"],
                               (143, SAVED), (130, NOTHING)),
    "ps worker": (PEER + ["guarded(sigterm=exit, sigint=None)", "train_and_evaluate",
                          "metrics_of", "summarize"],
                  (143, NOTHING), (130, NOTHING)),
    "ps task": (PEER + ["guarded(sigterm=serve_until_saved, sigint=None)",
                        "train_and_evaluate", "metrics_of", "summarize"],
                (143, NOTHING), (130, NOTHING)),
    "evaluator": (["set_tf_config", "start", "estimator_for", "training",
                   "guarded(sigterm=exit, sigint=None)", "evaluate_each_checkpoint",
                   "final_eval_metrics", "summarize"],
                  (143, NOTHING), (130, NOTHING)),
    # Horovod's vote rides on the next step's all-reduce: every rank stops after step 4
    "horovod rank 0": (["set_tf_config", "owning_model_dir"] + START[1:]
                       + ["guarded(sigterm=vote, sigint=None)", "train_and_evaluate",
                          "export_after_early_stop", "metrics_when_already_trained",
                          "summarize"],
                       (143, SAVED), (130, NOTHING)),
    "horovod rank 1": (START + ["guarded(sigterm=vote, sigint=None)", "train_only",
                                "summarize"],
                       (143, SAVED), (130, NOTHING)),
    "horovod alone": (["set_tf_config", "owning_model_dir"] + START[1:]
                      + ["guarded(sigterm=save, sigint=save)", "train_and_evaluate",
                         "export_after_early_stop", "check_trained",
                         "metrics_when_already_trained", "summarize"],
                      (143, SAVED), (130, SAVED)),
}


def test_every_kind_of_process_has_its_procedure_run_here():
    assert sorted(PROCEDURE_RUNS) == sorted(ROLES)


@pytest.mark.parametrize("name", sorted(ROLES))
def test_a_procedure_from_its_start_to_its_normal_end(name, tmp_path, monkeypatch):
    code, calls, checkpoints, _ = drive(name, None, tmp_path, monkeypatch)
    assert (code, calls, checkpoints) == (0, PROCEDURE_RUNS[name][0], [0, LAST_STEP])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("name", sorted(ROLES))
def test_a_procedure_stopped_by_a_signal_in_training(name, signum, tmp_path, monkeypatch):
    """SIGTERM: a task that saves finishes its step and saves it, one that votes saves the
    voted step, the others exit at once; every one exits 143, taking no step after its
    training. Ctrl-C: a lone process saves as on SIGTERM and exits 130; a cluster task
    (stopped by its launcher) exits 130 saving nothing. One that saved exits before
    TensorFlow's session close, which waited for tf.data's autotuning thread (a
    parameter_server chief under Slurm ran past its deadline there)."""
    normal_end, on_sigterm, on_sigint = PROCEDURE_RUNS[name]
    code, calls, checkpoints, events = drive(name, signum, tmp_path, monkeypatch)
    phase = next(i for i, c in enumerate(normal_end) if c.startswith("guarded")) + 2
    assert calls == normal_end[:phase]
    assert (code, checkpoints) == (on_sigterm if signum == signal.SIGTERM else on_sigint)
    if checkpoints[-1] > 0:
        assert events[:1] == ["exit"], events
