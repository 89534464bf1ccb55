"""A train_op that cannot train, stopped after its first few updates with one line: the global
step does not move, or no trainable variable changes."""
import numpy as np
import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist.errors import UntrainableTrainOp
from estimator_dist.graph.reported_loss import find_reported_loss

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
