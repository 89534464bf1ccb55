"""ProgressHook: lines at the right steps, fetches only on those runs, TensorBoard's rate."""
import glob

import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist.training.progress import ProgressHook


class FetchCounter(tf.compat.v1.train.SessionRunHook):
    """Wraps a hook and counts the runs on which it asked for fetches."""

    def __init__(self, hook):
        self.hook = hook
        self.fetching_runs = 0

    def begin(self):
        self.hook.begin()

    def after_create_session(self, session, coord):
        self.hook.after_create_session(session, coord)

    def before_run(self, run_context):
        args = self.hook.before_run(run_context)
        self.fetching_runs += args is not None
        return args

    def after_run(self, run_context, run_values):
        self.hook.after_run(run_context, run_values)

    def end(self, session):
        self.hook.end(session)


def run_steps(hook, max_steps, increment=1, summary_dir=None):
    """Train a one-variable 'model' whose run adds `increment` to the global step (more than
    one: as if other workers stepped too; a tuple: its numbers in turn, run by run) until
    max_steps."""
    increments = tuple(increment) if isinstance(increment, tuple) else (increment,)
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        # As Estimator builds it: the step StopAtStepHook fetches is read before the update
        # (without this the read and the assign race, and the hook stops a run early or late).
        step_read = internals.global_step_read_tensor()
        weight = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        runs_done = tf.compat.v1.get_variable("runs", [], tf.int64, trainable=False,
                                              initializer=tf.compat.v1.zeros_initializer())
        loss = tf.identity(weight * 2.0, name="loss_value")
        tf.compat.v1.summary.scalar("loss", loss)
        this_run = tf.gather(tf.constant(increments, tf.int64), runs_done % len(increments))
        with tf.control_dependencies([loss, step_read, this_run]):  # read before the updates
            train_op = tf.group(tf.compat.v1.assign_add(step, this_run),
                                weight.assign_add(1.0), runs_done.assign_add(1))
        hooks = [hook, tf.compat.v1.train.StopAtStepHook(last_step=max_steps)]
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as session:
            runs = 0
            while not session.should_stop():
                session.run(train_op)
                runs += 1
        if summary_dir:
            tf.compat.v1.summary.FileWriterCache.clear()
        return runs


def test_lines_at_every_n_and_the_last_step_fetching_only_then():
    lines = []
    counter = FetchCounter(ProgressHook(8, 12, every_n=5, emit=lines.append))
    assert run_steps(counter, 12) == 12
    assert [line.split()[1] for line in lines] == ["5/12", "10/12", "12/12"]
    assert counter.fetching_runs == 3
    assert lines[0].split()[3] == "10.0000"  # 2 * w in run 5: w = 1 + 4
    assert "examples/sec" in lines[-1] and "ETA 0:00:00" in lines[-1]


def test_steps_other_workers_add_are_caught_up_and_the_final_step_shown():
    lines = []
    hook = ProgressHook(8, 20, every_n=5, emit=lines.append)
    runs = run_steps(hook, 20, increment=3)  # this task counts 1 a run; the step moves by 3
    # StopAtStepHook counts +1 from the step read before each run's update: it sees 18 + 1
    # after run 7 (the step is 21 by then) and stops after run 8.
    assert runs == 8
    shown = [int(line.split()[1].split("/")[0]) for line in lines]
    assert shown[-1] == 24  # the step training really ended at, printed by end()
    assert shown == sorted(shown) and all(s % 3 == 0 for s in shown)


def test_a_line_for_every_multiple_of_every_n_the_step_passes_asynchronously():
    """Asynchronous workers (parameter servers): the step this task reads after a run is
    rarely a multiple of every_n; a line still comes for each multiple the step passes."""
    lines = []
    counter = FetchCounter(ProgressHook(8, 60, every_n=5, emit=lines.append))
    run_steps(counter, 60, increment=(1, 2))  # the step: 1, 3, 4, 6, 7, 9, ...
    shown = [int(line.split()[1].split("/")[0]) for line in lines]
    assert shown[-1] >= 60 and shown == sorted(shown), lines
    assert sorted({s // 5 for s in shown[:-1]}) == list(range(1, 12)), lines
    assert any(s % 5 for s in shown), lines  # steps between multiples, as read
    assert counter.fetching_runs <= len(lines) + 1


def test_an_input_that_runs_out_gets_a_last_line_and_no_error():
    lines = []
    hook = ProgressHook(8, 100, every_n=5, emit=lines.append)
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        batch = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(7)).get_next()
        loss = tf.cast(batch, tf.float32)
        tf.compat.v1.summary.scalar("loss", loss)
        with tf.control_dependencies([loss]):
            train_op = tf.compat.v1.assign_add(step, 1)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            while not session.should_stop():
                session.run(train_op)
    assert [line.split()[1] for line in lines] == ["5/100", "7/100"]
    assert "loss" not in lines[-1] and "examples/sec" in lines[-1]


def test_examples_per_sec_reaches_tensorboard(tmp_path):
    hook = ProgressHook(8, 12, every_n=5, emit=lambda line: None, summary_dir=str(tmp_path))
    run_steps(hook, 12, summary_dir=str(tmp_path))
    rates = {}
    for path in glob.glob(str(tmp_path / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "examples_per_sec":
                    rates[event.step] = value.simple_value
    assert sorted(rates) == [5, 10, 12] and min(rates.values()) > 0
