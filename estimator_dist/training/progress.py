"""Training progress: concise lines (or a bar on a terminal) with the step, the loss and
GLOBAL examples/sec, and that rate for TensorBoard."""
import os
import statistics
import time

import tensorflow as tf

from estimator_dist.graph.reported_loss import find_reported_loss


# Steps whose duration exceeds this many times the median contain a checkpoint
# save and the evaluation it triggers; they are not training throughput.
OUTLIER_FACTOR = 10.0
BAR_SECONDS = 0.2  # between redraws of the progress bar on a terminal
BAR_WIDTH = 30  # at most; narrower on a narrow terminal


def terminal_columns(stream) -> int:
    """The terminal's width (80 when it cannot be read or was never set)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 80
    return columns if columns > 0 else 80  # a pty whose size was never set says 0


def fit_bar(text: str, fraction: float, columns: int) -> str:
    """`[###...]` + text in fewer than `columns` characters: a line that reaches the last
    column wraps, and every redraw then became a new line (an 80-column terminal)."""
    room = columns - 1
    width = min(BAR_WIDTH, room - len(text) - 2)
    if width < 5:
        return text.strip()[:room]
    filled = int(width * min(max(fraction, 0.0), 1.0))
    return f"[{'#' * filled}{'.' * (width - filled)}]{text}"


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
    number users want; `examples_per_sec` is the steady-state figure for the run,
    and with `summary_dir` each line's rate is also TensorBoard's `examples_per_sec`.
    With gradient accumulation a step (update) takes `runs_per_step` session
    runs; only the last of them moves the global step and may print.

    Only the runs that print fetch anything: the step is counted here (one update
    per update run; read once per session and again after every printing run, so
    steps other workers add are caught up), the loss fetched when it is shown.
    Fetching the step and loss and feeding a rate on every run cost the MLP
    benchmark ~4% of its step under `mirrored` (docs/speed.md).
    """

    def __init__(self, global_batch: int, max_steps: int, every_n: int = 100, emit=print,
                 runs_per_step: int = 1, bar_stream=None, summary_dir=None):
        self._bar = bar_stream  # a terminal: redraw one progress bar instead of printing lines
        self._last_draw = 0.0
        self._batch = global_batch
        self._max_steps = max_steps
        self._every_n = max(1, every_n)
        self._emit = emit
        self._runs_per_step = max(1, runs_per_step)
        self._summary_dir = summary_dir
        self.durations = []
        self.losses = []

    @property
    def examples_per_sec(self):
        return steady_rate(self.durations, self._batch, warmup=min(10, len(self.durations) // 10))

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        self._loss = find_reported_loss(tf.compat.v1.get_default_graph())
        self._started = None
        self._window = []
        self._runs = 0
        self._step = 0
        self._printed = None
        self._fetching = False

    def after_create_session(self, session, coord):
        self._runs = 0  # accumulation restarts with the session (see accumulate.py)
        self._step = int(session.run(self._global_step))
        if self._printed is None:
            self._printed = self._step  # lines from the next multiple of every_n on

    def before_run(self, run_context):
        self._started = time.perf_counter()
        updates = (self._runs + 1) % self._runs_per_step == 0
        self._fetching = updates and self._shows(self._step + 1)
        if not self._fetching or self._loss is None:
            return None
        return tf.compat.v1.train.SessionRunArgs({"loss": self._loss})

    def _shows(self, step: int) -> bool:
        """Whether the run that reaches `step` prints a line or redraws the bar."""
        if step >= self._max_steps:
            return True
        if self._bar is not None:
            return time.perf_counter() - self._last_draw >= BAR_SECONDS
        return step % self._every_n == 0

    def after_run(self, run_context, run_values):
        duration = time.perf_counter() - self._started
        self.durations.append(duration)
        self._window.append(duration)
        self._runs += 1
        if self._runs % self._runs_per_step:
            return
        self._step += 1
        if self._fetching:
            # Read after the run: a read fetched in it is unordered with the update (it may
            # show the step before or after it).
            self._step = int(run_context.session.run(self._global_step))
            results = run_values.results or {}
            self._show(self._step, results.get("loss"))
        if self._bar is not None and (self._step % self._every_n == 0 or
                                      self._step >= self._max_steps):
            self._write_rate(self._step, steady_rate(self._window, self._batch, warmup=0))
            self._window = []

    def end(self, session):
        """A last line for the final step when no run printed it (other workers' steps, or an
        input that ran out), and the TensorBoard rate written out. Without the loss:
        computing it would read the input again."""
        step = int(session.run(self._global_step))
        if self._bar is None and self._printed != step and self._window:
            self._show(step, None, last=True)
        if self._summary_dir:
            tf.compat.v1.summary.FileWriterCache.get(self._summary_dir).flush()

    def _show(self, step: int, loss, last: bool = False):
        if self._bar is not None:
            self._draw(step, loss)
            return
        # Other workers move the step too (asynchronous training): a line for each run that
        # crossed a multiple of every_n, at the step it read (a multiple only by chance).
        crossed = step // self._every_n > self._printed // self._every_n
        if not (crossed or last or step >= self._max_steps):
            return
        rate = steady_rate(self._window, self._batch, warmup=0)
        text = f"step {step}/{self._max_steps}"
        if loss is not None:
            self.losses.append((step, float(loss)))
            text += f"  loss {float(loss):.4f}"
        self._emit(f"{text}  {rate:,.0f} examples/sec  ETA {self._eta(step, rate)}")
        self._write_rate(step, rate)
        self._printed = step
        self._window = []

    def _write_rate(self, step: int, rate):
        """TensorBoard's `examples_per_sec`: the GLOBAL rate of the last progress window
        (Estimator's global_step/sec counts steps)."""
        if not self._summary_dir or not rate:
            return
        summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
            tag="examples_per_sec", simple_value=rate)])
        tf.compat.v1.summary.FileWriterCache.get(self._summary_dir).add_summary(summary, step)

    def _eta(self, step: int, rate) -> str:
        if not rate:
            return "?"
        seconds = int((self._max_steps - step) * self._batch * self._runs_per_step / rate)
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

    def _draw(self, step: int, loss):
        self._last_draw = time.perf_counter()
        done = step >= self._max_steps
        rate = steady_rate(self._window[-50:] or self.durations[-50:], self._batch, warmup=0)
        loss_text = f"  loss {float(loss):.4f}" if loss is not None else ""
        text = (f" {step}/{self._max_steps}{loss_text}  {rate or 0:,.0f} examples/sec  "
                f"ETA {self._eta(step, rate)} ")
        self._bar.write("\r" + fit_bar(text, step / max(self._max_steps, 1),
                                       terminal_columns(self._bar)))
        if done:
            self._bar.write("\n")
        self._bar.flush()
