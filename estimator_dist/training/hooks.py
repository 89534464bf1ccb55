"""Session hooks: concise progress lines and global examples/sec; a train_op that cannot train."""
import os
import statistics
import time

import numpy as np
import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist.errors import UntrainableTrainOp
from estimator_dist.launch import step_file

# Steps whose duration exceeds this many times the median contain a checkpoint
# save and the evaluation it triggers; they are not training throughput.
OUTLIER_FACTOR = 10.0
BAR_SECONDS = 0.2  # between redraws of the progress bar on a terminal


# Graph collection: the loss of every EstimatorSpec the run's model_fn returned in TRAIN
# mode (one per replica under mirrored), recorded by estimator.build_model_fn.
SPEC_LOSSES = "estimator_dist_spec_losses"
# How far back from a loss summary's input to look for a recorded spec loss: Estimator's
# reduction over replicas is a few ops (copies, a sum, a division).
_REDUCTION_OPS = 200


def record_spec_loss(loss):
    """Remember the loss of an EstimatorSpec the model_fn returned (find_reported_loss)."""
    if loss is not None:
        tf.compat.v1.add_to_collection(SPEC_LOSSES, loss)


def find_reported_loss(graph):
    """The loss tensor Estimator reports (reduced over replicas): the input of the scalar
    summary Estimator writes of the EstimatorSpec's loss.

    Found through the spec's loss, never by a name: a model_fn whose own loss tensor is
    named `loss` (TF's CIFAR-10 tutorial: `tf.reduce_mean(..., name='loss')`) makes
    Estimator's summary `loss_1`. A graph with no recorded spec loss (not built by the
    run's model_fn) falls back to the summary named `loss`.
    """
    summaries = [op for op in graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
                 if op.op.type == "ScalarSummary"]
    recorded = {t.op for t in graph.get_collection(SPEC_LOSSES)}
    if not recorded:
        for op in summaries:
            if op.op.name == "loss" or op.op.name.endswith("/loss"):
                return op.op.inputs[1]
        return None
    for op in reversed(summaries):  # Estimator's summary is made after every model_fn call
        if _reaches(op.op.inputs[1].op, recorded):
            return op.op.inputs[1]
    return None


def _reaches(start, targets) -> bool:
    """Whether `start` is one of `targets` or computed from one, within a few ops."""
    seen, todo = set(), [start]
    while todo and len(seen) < _REDUCTION_OPS:
        op = todo.pop(0)
        if op in targets:
            return True
        if op in seen:
            continue
        seen.add(op)
        todo.extend(t.op for t in op.inputs)
    return False


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
        if step % self._every_n and step < self._max_steps and not last:
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


# Updates after which the global step must have moved (a train_op that never steps it trains
# forever at "step 0": Estimator stops on the global step).
STEP_CHECK_UPDATES = 3


def variables_fingerprint(variables):
    """float64 [2 x len(variables)]: each variable's sum and sum of squares, computed in place
    (no copy of any weight is kept); an update that moves any weight changes it."""
    parts = []
    for v in variables:
        value = tf.cast(v, tf.float64)
        parts += [tf.reduce_sum(value), tf.reduce_sum(tf.square(value))]
    return tf.stack(parts) if parts else tf.zeros([0], tf.float64)


def cut_off_variables(loss, variables):
    """The variables no gradient of `loss` can reach: the walk back from the loss through
    op inputs stops at ops TensorFlow declares not differentiable (StopGradient, ArgMax,
    integer casts' producers...). Run only when a check fired: a graph walk, nothing built."""
    reached, todo = set(), [loss.op]
    while todo:
        op = todo.pop()
        if op in reached:
            continue
        reached.add(op)
        try:
            cut = internals.gradient_function(op) is None and op.inputs
        except LookupError:  # no gradient registered (custom ops): assume it passes one
            cut = False
        if not cut:
            todo.extend(t.op for t in op.inputs)
    return [v for v in variables if v.op not in reached]


class TrainOpCheckHook(tf.compat.v1.train.SessionRunHook):
    """Stops a run whose train_op cannot train, after its first few updates, with one line.

    - The global step has not moved after STEP_CHECK_UPDATES updates: the train_op does not
      step it (`minimize(loss)` without `global_step=`, a tf.keras optimizer), and
      Estimator, which stops on the global step, would train forever at "step 0".
    - No trainable variable changed over the first `weights_check_steps` updates of a fresh
      run (0: not checked) while the loss is finite and nonzero: a tf.keras optimizer in
      graph mode, a learning rate of 0, or a loss with no gradient to the variables.
    Cost: two small session runs per session (a sum and a sum of squares per variable),
    one fetch of the loss and the global step; nothing after the check.
    """

    def __init__(self, model_name: str, runs_per_step: int = 1, weights_check_steps: int = 3,
                 learning_rate=None):
        self._model = model_name
        self._runs_per_step = max(1, runs_per_step)
        self._weights_steps = weights_check_steps
        self._learning_rate = learning_rate

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        self._global_step = tf.compat.v1.train.get_global_step()
        self._loss = find_reported_loss(graph)
        self._variables = list(dict.fromkeys(
            tf.compat.v1.trainable_variables() +
            graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES)))
        self._fingerprint = variables_fingerprint(self._variables) if self._weights_steps else None
        self._checks = sorted({STEP_CHECK_UPDATES, self._weights_steps} - {0})

    def after_create_session(self, session, coord):
        self._runs = 0
        self._start_step = int(session.run(self._global_step))
        self._start_weights = None
        if self._fingerprint is not None and self._start_step == 0:  # a fresh run only
            self._start_weights = session.run(self._fingerprint)

    def _due(self):
        """The update count checked at the end of this run, or None."""
        if self._runs % self._runs_per_step:
            return None
        updates = self._runs // self._runs_per_step
        return updates if updates in self._checks else None

    def before_run(self, run_context):
        self._runs += 1
        if self._due() is None or self._loss is None:
            return None
        return tf.compat.v1.train.SessionRunArgs({"loss": self._loss})

    def after_run(self, run_context, run_values):
        updates = self._due()
        if updates is None:
            return
        session = run_context.session
        if updates == STEP_CHECK_UPDATES:
            step = int(session.run(self._global_step))
            if step == self._start_step:
                raise UntrainableTrainOp(self._step_message(updates, step))
        if updates == self._weights_steps and self._start_weights is not None:
            loss = (run_values.results or {}).get("loss")
            moved = (session.run(self._fingerprint) != self._start_weights).any()
            if not moved and loss is not None and np.isfinite(loss) and loss != 0:
                raise UntrainableTrainOp(self._weights_message(updates, float(loss)))

    def _step_message(self, updates: int, step: int) -> str:
        return (f"model '{self._model}': its train_op did not advance the global step in "
                f"{updates} updates (still {step}), so training would never reach "
                f"--train_steps; build it with estimator_dist.minimize(loss) or pass "
                f"global_step=tf.compat.v1.train.get_or_create_global_step() to the "
                f"optimizer's minimize/apply_gradients (a tf.keras optimizer never steps it)")

    def _weights_message(self, updates: int, loss: float) -> str:
        cut = cut_off_variables(self._loss, self._variables)
        names = ", ".join(v.op.name for v in cut[:5]) + (", ..." if len(cut) > 5 else "")
        if cut and len(cut) == len(self._variables):
            cause = (f"the loss has no gradient to any trainable variable (a stop_gradient or a "
                     f"non-differentiable op cuts it off): {names}")
        elif self._learning_rate == 0:
            cause = "the learning rate is 0 (--set learning_rate=...)"
        else:
            cause = ("likely a tf.keras optimizer (in graph mode its apply_gradients changes "
                     "nothing: use estimator_dist.minimize(loss)) or a learning rate of 0" +
                     (f"; variables without a gradient: {names}" if cut else ""))
        return (f"model '{self._model}': no trainable variable changed in the first {updates} "
                f"updates while the loss is {loss:.4g}: {cause}; --weights_check_steps 0 "
                f"turns this check off for deliberate freezing")


class StepFileHook(tf.compat.v1.train.SessionRunHook):
    """Writes launch/step_file.py's file after this process's first step (note_stop: when
    training stopped on a signal)."""

    def __init__(self, path: str):
        self._path = path
        self._written = False

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_run(self, run_context, run_values):
        if not self._written:
            self._written = True
            step_file.write(self._path, {
                "first_step": int(run_context.session.run(self._global_step)),
                "first_at": time.time()})


def step_file_hooks():
    """[StepFileHook] when an elastic launcher asked this process for one (its chief)."""
    path = os.environ.get(step_file.ENV)
    return [StepFileHook(path)] if path else []


def note_stop(step):
    """The step training stopped at on SIGTERM (Preempted.step), into the step file if there
    is one: the launcher reports the steps trained after the checkpoint as lost."""
    path = os.environ.get(step_file.ENV)
    if path and step is not None:
        step_file.write(path, {**step_file.read(path), "last_step": step,
                               "last_at": time.time()})
