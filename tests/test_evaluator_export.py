"""The evaluator task's final export (estimator_dist/training/evaluator.py): one per run, of the
chief's last checkpoint, with Estimator's own evaluator loop and a TF1 model_fn."""
import json
import os
import threading

import numpy as np
import tensorflow as tf

from estimator_dist.training import evaluator

MAX_STEPS = 20


def model_fn(features, labels, mode):
    w = tf.compat.v1.get_variable("w", [1], initializer=tf.compat.v1.zeros_initializer())
    predictions = features["x"] * w
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"y": predictions})
    loss = tf.reduce_mean(tf.square(predictions - labels))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn():
    x = np.arange(8, dtype=np.float32).reshape(8, 1)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, 2 * x)).batch(4).repeat()


def serving_input_fn():
    x = tf.compat.v1.placeholder(tf.float32, [None, 1], name="x")
    return tf.estimator.export.ServingInputReceiver({"x": x}, {"x": x})


class ChiefAfterTheLoop(tf.compat.v1.train.SessionRunHook):
    """An evaluation hook: counts evaluations; after the first one, plays the chief whose
    last checkpoint comes after the one at max_steps (another worker's update landed), and
    marks the end; or, with no extra step, only marks it; or does neither (a chief gone)."""

    def __init__(self, chief, extra_steps, marks_end=True):
        self.chief, self.extra_steps, self.marks_end = chief, extra_steps, marks_end
        self.evaluations = 0

    def end(self, session):
        self.evaluations += 1
        if self.evaluations > 1:
            return
        if self.extra_steps:
            steps = threading.Thread(
                target=lambda: self.chief.train(input_fn, steps=self.extra_steps))
            steps.start()
            steps.join()
        if self.marks_end:
            evaluator.mark_end(self.chief.model_dir, MAX_STEPS + self.extra_steps)


def run_evaluator(tmp_path, monkeypatch, extra_steps, marks_end=True):
    model_dir = str(tmp_path / "run")
    chief = tf.estimator.Estimator(model_fn, model_dir)
    chief.train(input_fn, max_steps=MAX_STEPS)  # one checkpoint, at max_steps
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["localhost:1"]},
                                                "task": {"type": "evaluator", "index": 0}}))
    estimator = tf.estimator.Estimator(model_fn, model_dir)
    hook = ChiefAfterTheLoop(chief, extra_steps, marks_end)
    eval_spec = tf.estimator.EvalSpec(
        input_fn, steps=2, hooks=[hook], start_delay_secs=0, throttle_secs=0,
        exporters=[tf.estimator.FinalExporter("final", serving_input_fn)])
    said = []
    evaluator.run(estimator, tf.estimator.TrainSpec(input_fn, max_steps=MAX_STEPS), eval_spec,
                  said.append, end_wait_s=0.5)
    export_dir = os.path.join(model_dir, "export", "final")
    return said, hook, sorted(os.listdir(export_dir)) if os.path.isdir(export_dir) else []


def test_a_checkpoint_after_max_steps_is_the_one_final_export(tmp_path, monkeypatch):
    said, hook, exports = run_evaluator(tmp_path, monkeypatch, extra_steps=1)
    assert len(exports) == 1, exports
    assert hook.evaluations == 2  # the loop's (step 20), then the last checkpoint's
    assert said == [f"training ended at step {MAX_STEPS + 1}: evaluated and exported the last "
                    f"checkpoint"]


def test_the_loops_evaluation_of_the_last_checkpoint_is_not_repeated(tmp_path, monkeypatch):
    said, hook, exports = run_evaluator(tmp_path, monkeypatch, extra_steps=0)
    assert len(exports) == 1 and hook.evaluations == 1, (exports, hook.evaluations)
    assert said and f"step {MAX_STEPS}:" in said[0]


def test_a_chief_gone_before_its_end_marker_still_gets_the_final_export(tmp_path, monkeypatch):
    said, hook, exports = run_evaluator(tmp_path, monkeypatch, extra_steps=0, marks_end=False)
    assert len(exports) == 1 and hook.evaluations == 1, (exports, hook.evaluations)


def test_an_earlier_runs_end_marker_does_not_end_a_rerun(tmp_path):
    """A rerun to more steps: its evaluator, started 0.4 s after the earlier run's chief marked
    the end (before the new chief removed that marker), took it as this run's end and
    exported nothing new. Only a marker written after the evaluator started counts."""
    evaluator.mark_end(str(tmp_path), 10)  # the earlier run's, just now
    listener = evaluator.StopWhenTrainingEnded(str(tmp_path), sleep=lambda _: None)
    assert not listener.ended() and listener.before_eval()
    evaluator.clear_end(str(tmp_path))  # the new chief starts
    assert not listener.ended()
    evaluator.mark_end(str(tmp_path), 20)
    assert listener.ended() and not listener.before_eval()
    assert evaluator.end_step(str(tmp_path), since=0.0) == 20


def test_a_chief_that_marks_the_same_step_again_ends_the_evaluation(tmp_path):
    """A rerun whose training was already at its end: the chief marks the same step again."""
    evaluator.mark_end(str(tmp_path), 10)
    listener = evaluator.StopWhenTrainingEnded(str(tmp_path), sleep=lambda _: None)
    before = os.stat(evaluator.marker_path(str(tmp_path))).st_mtime_ns
    evaluator.mark_end(str(tmp_path), 10)
    os.utime(evaluator.marker_path(str(tmp_path)), ns=(before + 10**6, before + 10**6))
    assert listener.ended()
