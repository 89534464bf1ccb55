"""Step checkpoints without an extra session run per step (estimator_dist/saver_hook.py)."""
import pytest
import tensorflow as tf

from conftest import quick_train
from estimator_dist.compat import internals
from estimator_dist.distribute import specs
from estimator_dist.training import saver_hook

STEPS = 60


@pytest.fixture
def count_runs(monkeypatch):
    """Session runs that fetch one int64 scalar: a hook's own read of the global step."""
    runs = []
    base_session = internals.session_base_class()
    real_run = base_session.run

    def counted(self, fetches, *args, **kwargs):
        if isinstance(fetches, tf.Tensor) and fetches.dtype == tf.int64 and fetches.shape.rank == 0:
            runs.append(fetches)
        return real_run(self, fetches, *args, **kwargs)

    monkeypatch.setattr(base_session, "run", counted)
    return runs


@pytest.mark.parametrize("strategy,devices", [("none", 1), ("mirrored", 2), ("tower", 2)])
def test_one_session_run_per_step_and_checkpoints_every_n(tmp_path, count_runs, strategy, devices):
    summary = quick_train(tmp_path, steps=STEPS, strategy=strategy, num_devices=devices,
                          save_checkpoints_steps=20, export="none", eval_steps=1)
    assert summary["global_step"] == STEPS
    # Estimator's own hook reads the global step again after every step (>= STEPS reads);
    # this one about twice per save (4 saves) plus once at start and end.
    assert len(count_runs) < STEPS // 2, len(count_runs)
    kept = tf.train.get_checkpoint_state(str(tmp_path)).all_model_checkpoint_paths
    assert [int(p.rsplit("-", 1)[1]) for p in kept] == [0, 20, 40, 60]


def _spec(scaffold=None, hooks=()):
    loss = tf.constant(1.0)
    return tf.estimator.EstimatorSpec(tf.estimator.ModeKeys.TRAIN, loss=loss, train_op=tf.no_op(),
                                      scaffold=scaffold, training_chief_hooks=list(hooks))


def _wrapped_hooks(spec, mode=tf.estimator.ModeKeys.TRAIN, **every):
    every = every or {"save_checkpoints_steps": 20}
    config = tf.estimator.RunConfig(model_dir="/tmp/unused", **every)
    fn = saver_hook.with_saver_hook(lambda features, labels, mode, params: spec, config)
    return list(fn({}, None, mode=mode, params={}).training_chief_hooks)


def test_hook_added_only_where_the_default_saver_applies():
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        hooks = _wrapped_hooks(_spec())
        assert len(hooks) == 1 and hooks[0]._steps_per_run == 1  # pylint: disable=protected-access
        assert isinstance(hooks[0], saver_hook.SaverHook)
        # Checkpoints by seconds: the same hook (for its graph.pbtxt), on a timer.
        by_secs = _wrapped_hooks(_spec(), save_checkpoints_secs=60)
        assert len(by_secs) == 1 and by_secs[0]._timer._every_secs == 60  # pylint: disable=protected-access
        own_saver = tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver())
        assert _wrapped_hooks(_spec(scaffold=own_saver)) == []
        own_hook = tf.compat.v1.train.CheckpointSaverHook("/tmp/unused", save_steps=5)
        assert _wrapped_hooks(_spec(hooks=[own_hook])) == [own_hook]
        assert _wrapped_hooks(_spec(), mode=tf.estimator.ModeKeys.EVAL) == []
    model_fn = lambda features, labels, mode: None  # noqa: E731
    # multi_worker_mirrored: its MonitoredTrainingSession adds a saver hook of its own.
    config = tf.estimator.RunConfig(save_checkpoints_steps=20)
    assert specs.spec("multi_worker_mirrored").saves_itself
    assert saver_hook.with_saver_hook(model_fn, config, strategy_saves=True) is model_fn
    assert saver_hook.with_saver_hook(model_fn, config) is not model_fn


@pytest.mark.parametrize("strategy,devices", [("none", 1), ("mirrored", 2)])
def test_graph_pbtxt_is_the_graph_of_the_checkpoints(tmp_path, strategy, devices):
    from google.protobuf import text_format

    quick_train(tmp_path, steps=2, strategy=strategy, num_devices=devices, export="none",
                eval_steps=1)
    written = text_format.Parse((tmp_path / saver_hook.GRAPH_FILE).read_text(), tf.compat.v1.GraphDef())
    meta = tf.compat.v1.MetaGraphDef()
    meta.ParseFromString((tmp_path / "model.ckpt-0.meta").read_bytes())
    assert len(written.node) > 100 and written == meta.graph_def
