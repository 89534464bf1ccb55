"""Session hooks: concise progress lines and global examples/sec."""
import sys
import time

import tensorflow as tf


def find_reported_loss(graph):
    """The loss tensor Estimator reports (reduced over replicas), via its 'loss' summary."""
    for op in graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES):
        if op.op.name == "loss" or op.op.name.endswith("/loss"):
            return op.op.inputs[1]
    return None


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Every `every_n` steps: step, loss, GLOBAL examples/sec; keeps the steady-state rate.

    examples/sec counts every replica's examples (global batch x steps / time) and
    ignores the first interval, which includes graph start-up.
    """

    def __init__(self, global_batch: int, max_steps: int, every_n: int = 100, out=None):
        self._batch = global_batch
        self._max_steps = max_steps
        self._every_n = max(1, every_n)
        self._out = out or sys.stdout
        self.examples_per_sec = None
        self.last_loss = None
        self._rates = []

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        self._global_step = tf.compat.v1.train.get_global_step()
        self._loss = find_reported_loss(graph)
        self._last_step = None
        self._last_time = None

    def before_run(self, run_context):
        fetches = {"step": self._global_step}
        if self._loss is not None:
            fetches["loss"] = self._loss
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        step = int(run_values.results["step"]) + 1
        now = time.perf_counter()
        if self._last_step is None:
            self._last_step, self._last_time = step, now
            return
        if step % self._every_n and step < self._max_steps:
            return
        rate = (step - self._last_step) * self._batch / max(now - self._last_time, 1e-9)
        self._rates.append((step - self._last_step, now - self._last_time))
        steps, secs = map(sum, zip(*self._rates))
        self.examples_per_sec = steps * self._batch / max(secs, 1e-9)
        loss = run_values.results.get("loss")
        self.last_loss = float(loss) if loss is not None else None
        loss_text = f"  loss {self.last_loss:.4f}" if loss is not None else ""
        print(f"step {step}/{self._max_steps}{loss_text}  {rate:,.0f} examples/sec",
              file=self._out, flush=True)
        self._last_step, self._last_time = step, now
