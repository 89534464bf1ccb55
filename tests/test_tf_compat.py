"""Canaries of the one door to TensorFlow's internals (estimator_dist/compat/internals.py): on
the installed TensorFlow every private name, signature and mirrored source the package relies
on is what the code expects, and a missing one fails loudly (TensorFlowChanged), never as a
silent no-op."""
import importlib
import inspect
import threading

import pytest
import tensorflow as tf

from estimator_dist.compat import internals
from support import TRAIN, environment, run_cli


def resolve(dotted: str):
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_installed_tensorflow_is_the_supported_line():
    assert tf.__version__.startswith("2.15."), tf.__version__


@pytest.mark.parametrize("owner", sorted(internals.NAMES))
def test_every_private_name_is_there(owner):
    missing = [n for n in internals.NAMES[owner] if not hasattr(resolve(owner), n)]
    assert missing == []


@pytest.mark.parametrize("dotted", sorted(internals.SIGNATURES))
def test_private_signatures_are_as_called(dotted):
    assert str(inspect.signature(resolve(dotted))) == internals.SIGNATURES[dotted]


@pytest.mark.parametrize("dotted", sorted(internals.MIRRORED))
def test_mirrored_tensorflow_source_is_unchanged(dotted):
    """The copy in internals.py must be compared with TensorFlow's when this fails."""
    assert internals.source_digest(resolve(dotted)) == internals.MIRRORED[dotted]


def test_batch_reduce_patch_is_on_the_path_of_distributed_apply():
    """already_reduced replaces extended.batch_reduce_to: the optimizer's update calls it."""
    source = inspect.getsource(tf.compat.v1.train.Optimizer._distributed_apply)  # noqa: SLF001
    assert "distribution.extended.batch_reduce_to(" in source


def test_graph_collections_are_a_dict_to_replace():
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.add_to_collection("k", 1)
    views = dict(internals.graph_collections(graph))
    internals.replace_graph_collections(graph, views)
    assert graph.get_collection("k") == [1] and internals.graph_collections(graph) is views


def test_checkpoint_saver_hook_state(tmp_path):
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        hook = tf.compat.v1.train.CheckpointSaverHook(str(tmp_path), save_steps=10)
        internals.set_steps_per_run(hook, 1)
        hook.begin()
        for name in ("_global_step_tensor", "_save_graph_def", "_checkpoint_dir",
                     "_summary_writer", "_timer", "_steps_per_run"):
            assert hasattr(hook, name), name
        assert hook._steps_per_run == 1  # noqa: SLF001
        assert internals.global_step_read_tensor() is not None


def test_a_raw_session_close_comes_after_every_hooks_end(tmp_path):
    """The vote's exit (ExitAfterTheVoteHook) relies on MonitoredSession closing the raw
    session a hook got in after_create_session, once, after every hook's end()."""
    events, raw = [], []

    class Hook(tf.compat.v1.train.SessionRunHook):
        def __init__(self, name):
            self.name = name

        def after_create_session(self, session, coord):
            if self.name == "first":
                raw.append(session)
                internals.before_session_close(session, lambda: events.append("close"))

        def end(self, session):
            events.append(f"end {self.name}")

    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        increment = tf.compat.v1.assign_add(step, 1)
        with tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir=str(tmp_path), hooks=[Hook("first"), Hook("last")],
                save_summaries_steps=None, save_summaries_secs=None,
                log_step_count_steps=None) as session:
            session.run(increment)
    assert events == ["end first", "end last", "close"]
    raw[0].close()  # a later close (Session.__del__): TensorFlow's alone
    assert events == ["end first", "end last", "close"]


@pytest.mark.parametrize("error", internals.SESSION_RETRY_ERRORS)
def test_a_failed_session_creation_pauses_before_tensorflows_retry(error, tmp_path, monkeypatch):
    """MonitoredTrainingSession (Estimator's) creates its session again at once, in a loop,
    after these errors (a peer gone); the pause comes before each retry, counting the
    failures in a row, and a created session starts the count again."""
    monkeypatch.setattr(internals, "_retry_pause", [None])
    pauses, tries = [], []
    internals.pause_before_session_retries(pauses.append)

    def init_fn(scaffold, session):
        tries.append(len(pauses))
        if len(tries) <= 2:
            raise error(None, None, "a peer is gone")

    def session_created(name):
        tries.clear()
        with tf.Graph().as_default():
            tf.compat.v1.train.get_or_create_global_step()
            with tf.compat.v1.train.MonitoredTrainingSession(
                    checkpoint_dir=str(tmp_path / name),
                    scaffold=tf.compat.v1.train.Scaffold(init_fn=init_fn),
                    save_summaries_steps=None, save_summaries_secs=None,
                    log_step_count_steps=None):
                pass

    for creator in (tf.compat.v1.train.ChiefSessionCreator,
                    tf.compat.v1.train.WorkerSessionCreator):
        assert creator.create_session.pauses_before_retries
    session_created("first")
    assert tries == [0, 1, 2] and pauses == [1, 2]
    session_created("second")
    assert tries == [2, 3, 4] and pauses == [1, 2, 1, 2]


def test_sync_replicas_hook_and_quiet_queue_runner_end():
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        weight = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), replicas_to_aggregate=1,
            total_num_replicas=1)
        optimizer.minimize(weight * 2.0, global_step=step)
        hook = optimizer.make_session_run_hook(is_chief=True)
        hook.begin()
        assert internals.is_sync_replicas_hook(hook)
        assert not internals.is_sync_replicas_hook(tf.compat.v1.train.StopAtStepHook(1))
        with pytest.raises(ValueError) as raised:
            optimizer.apply_gradients([])
        assert internals.raised_by_sync_replicas(raised.value)
        assert not internals.raised_by_sync_replicas(ValueError("elsewhere"))
        optimizer.ready_for_local_init_op.mark_used()  # built, never run: no TF warning
        assert internals.sync_optimizer_of(hook) is optimizer
        runner = internals.sync_queue_runner(hook)
        coord = tf.train.Coordinator()
        thread = threading.Thread(name=f"QueueRunnerThread-{runner.name}-x", target=lambda: None)
        other = threading.Thread(name="other", target=lambda: None)
        coord.register_thread(thread)
        coord.register_thread(other)
        internals.end_queue_runner_quietly(runner, coord)
        assert tf.errors.CancelledError in runner._queue_closed_exception_types  # noqa: SLF001
        assert coord._registered_threads == {other}  # noqa: SLF001


def test_best_exporter_state():
    exporter = tf.estimator.BestExporter(serving_input_receiver_fn=lambda: None)
    assert internals.best_exporter_model_dir(exporter) is None
    assert callable(internals.best_exporter_compare_fn(exporter))
    internals.resume_best_exporter(exporter, "/m", {"loss": 1.0}, True)
    assert (exporter._model_dir, exporter._best_eval_result, exporter._has_exported) == (  # noqa: SLF001
        "/m", {"loss": 1.0}, True)


def test_evaluator_loop_and_early_stopping_hooks():
    assert issubclass(internals.ContinuousEvalListener, object)
    result = type("Result", (), {"status": resolve(
        "tensorflow_estimator.python.estimator.training._EvalStatus").EVALUATED})()
    assert internals.evaluated(result)
    with tf.Graph().as_default():
        assert isinstance(internals.stop_on_predicate_hook(lambda: False, 10),
                          tf.compat.v1.train.SessionRunHook)
        assert isinstance(internals.check_for_stopping_hook(), tf.compat.v1.train.SessionRunHook)


def test_keras_callback_takes_tensor_logs():
    callback = tf.keras.callbacks.Callback()
    internals.keep_tf_logs(callback)
    assert callback._supports_tf_logs is True  # noqa: SLF001


def test_process_wide_switches():
    internals.silence_deprecation_warnings()
    assert isinstance(internals.onednn_enabled(), bool)
    assert internals.session_base_class() in tf.compat.v1.Session.__mro__


def test_a_missing_name_raises_not_returns_none():
    """Where the code read `getattr(hook, "_q_runner", None)`, a renamed attribute turned the
    quiet shutdown into a no-op; now it names what is gone."""
    with pytest.raises(internals.TensorFlowChanged, match=r"SessionRunHook\._q_runner is gone"):
        internals.sync_queue_runner(tf.compat.v1.train.SessionRunHook())
    with pytest.raises(internals.TensorFlowChanged, match="_collections"):
        internals.replace_graph_collections(object(), {})


PLANTED = '''import tensorflow as tf
del tf.compat.v1.train.CheckpointSaverHook._set_steps_per_run  # as if TensorFlow renamed it
'''


def test_cli_names_a_renamed_internal_in_one_line(tmp_path):
    """A TensorFlow without a private the run uses: one line naming it, exit code 1."""
    (tmp_path / "renamed.py").write_text(PLANTED)
    done = run_cli("train", *TRAIN, "--train_steps", "2", "--model_dir", tmp_path / "m",
                   "--import", "renamed", cwd=tmp_path, env=environment(tmp_path))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("estimator-dist: TensorFlow changed: SaverHook._set_steps_per_run "
                               "is gone or changed in TensorFlow 2.15"), lines[0]
