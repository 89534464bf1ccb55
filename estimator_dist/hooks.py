"""Session hooks: concise progress lines and global examples/sec."""
import statistics
import time

import tensorflow as tf

# Steps whose duration exceeds this many times the median contain a checkpoint
# save and the evaluation it triggers; they are not training throughput.
OUTLIER_FACTOR = 10.0


def find_reported_loss(graph):
    """The loss tensor Estimator reports (reduced over replicas), via its 'loss' summary."""
    for op in graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES):
        if op.op.name == "loss" or op.op.name.endswith("/loss"):
            return op.op.inputs[1]
    return None


def steady_rate(durations, batch: int, warmup: int):
    """GLOBAL examples/sec over the steps after warm-up, without checkpoint/eval outliers."""
    steady = durations[warmup:] or durations
    if not steady:
        return None
    limit = statistics.median(steady) * OUTLIER_FACTOR
    kept = [d for d in steady if d <= limit]
    return len(kept) * batch / max(sum(kept), 1e-9)


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Every `every_n` steps a line with step, loss and GLOBAL examples/sec.

    examples/sec counts every replica's examples (global batch per run), the
    number users want; `examples_per_sec` is the steady-state figure for the run.
    With gradient accumulation a step (update) takes `runs_per_step` session
    runs; only the last of them moves the global step and may print.
    """

    def __init__(self, global_batch: int, max_steps: int, every_n: int = 100, emit=print,
                 runs_per_step: int = 1, bar_stream=None):
        self._bar = bar_stream  # a terminal: redraw one progress bar instead of printing lines
        self._last_draw = 0.0
        self._batch = global_batch
        self._max_steps = max_steps
        self._every_n = max(1, every_n)
        self._emit = emit
        self._runs_per_step = max(1, runs_per_step)
        self.durations = []
        self.losses = []

    @property
    def examples_per_sec(self):
        return steady_rate(self.durations, self._batch, warmup=min(10, len(self.durations) // 10))

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        self._global_step = tf.compat.v1.train.get_global_step()
        self._loss = find_reported_loss(graph)
        # TensorBoard's `examples_per_sec`: the GLOBAL rate of the last progress window
        # (Estimator's global_step/sec counts steps). Fed on every run, written when
        # Estimator's summary saver runs; nothing is written before a rate is known.
        self._rate = 0.0
        self._rate_feed = tf.compat.v1.placeholder_with_default(0.0, [],
                                                                name="examples_per_sec_feed")
        rate_summary = tf.compat.v1.summary.scalar("examples_per_sec", self._rate_feed,
                                                   collections=[])
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SUMMARIES,
                                       tf.where(self._rate_feed > 0, rate_summary, ""))
        self._started = None
        self._window = []
        self._runs = 0

    def after_create_session(self, session, coord):
        self._runs = 0  # accumulation restarts with the session (see accumulate.py)

    def before_run(self, run_context):
        self._started = time.perf_counter()
        fetches = {"step": self._global_step}
        if self._loss is not None:
            fetches["loss"] = self._loss
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict={self._rate_feed: self._rate})

    def after_run(self, run_context, run_values):
        duration = time.perf_counter() - self._started
        self.durations.append(duration)
        self._window.append(duration)
        self._runs += 1
        if self._runs % self._runs_per_step:
            return
        if self._runs_per_step > 1:
            # The accumulated update ran in this run, unordered with the step fetched
            # above (which may show it or not): read the step it left.
            step = int(run_context.session.run(self._global_step))
        else:
            step = int(run_values.results["step"]) + 1
        if self._bar is not None:
            self._draw(step, run_values.results.get("loss"))
        if step % self._every_n and step < self._max_steps:
            return
        self._rate = steady_rate(self._window, self._batch, warmup=0) or self._rate
        if self._bar is not None:
            self._window = []
            return
        loss = run_values.results.get("loss")
        text = f"step {step}/{self._max_steps}"
        if loss is not None:
            self.losses.append((step, float(loss)))
            text += f"  loss {float(loss):.4f}"
        rate = steady_rate(self._window, self._batch, warmup=0)
        self._emit(f"{text}  {rate:,.0f} examples/sec  ETA {self._eta(step, rate)}")
        self._window = []

    def _eta(self, step: int, rate) -> str:
        if not rate:
            return "?"
        seconds = int((self._max_steps - step) * self._batch * self._runs_per_step / rate)
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

    def _draw(self, step: int, loss):
        now = time.perf_counter()
        done = step >= self._max_steps
        if not done and now - self._last_draw < 0.2:
            return
        self._last_draw = now
        rate = steady_rate(self._window[-50:] or self.durations[-50:], self._batch, warmup=0)
        width = 30
        filled = int(width * min(step, self._max_steps) / max(self._max_steps, 1))
        loss_text = f"  loss {float(loss):.4f}" if loss is not None else ""
        self._bar.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {step}/{self._max_steps}"
                        f"{loss_text}  {rate or 0:,.0f} examples/sec  ETA {self._eta(step, rate)} ")
        if done:
            self._bar.write("\n")
        self._bar.flush()
