"""Early stopping on an eval metric with patience, in local and cluster runs.

The decision reads the evaluations Estimator wrote to model_dir/eval. Estimator's
own hooks carry it to every task: under parameter-server training the chief
decides and the workers poll its stop flag; under MultiWorkerMirrored every worker
votes into a summed variable so all stop at the same step.

The hooks are chosen here rather than by tf.estimator.experimental.
make_early_stopping_hook: it tests a generator's truthiness, so it hands EVERY
strategy the MultiWorkerMirrored hook, which crashes under ParameterServerStrategy
("Argument `fetch` = None", measured in TF 2.15).
"""
import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist.errors import UserError

STOP_VARIABLE = "signal_early_stopping/STOP"  # TensorFlow's early-stopping hooks' variable


def improvements(values, higher: bool, min_delta: float):
    """For each evaluation, whether it beat the best so far by more than min_delta."""
    best = None
    flags = []
    for value in values:
        better = best is None or (value > best + min_delta if higher else value < best - min_delta)
        flags.append(better)
        if better:
            best = value
    return flags


def evaluations_without_improvement(values, higher: bool, min_delta: float) -> int:
    flags = improvements(values, higher, min_delta)
    count = 0
    for better in reversed(flags):
        if better:
            break
        count += 1
    return count


def make_should_stop(eval_dir: str, metric: str, higher: bool, patience: int,
                     min_delta: float, say=print):
    """A should_stop_fn for tf.estimator.experimental.make_early_stopping_hook; its `fired`
    tells whether it stopped training."""

    def should_stop() -> bool:
        results = internals.read_eval_metrics(eval_dir)
        if not results:
            return False
        if any(metric not in m for m in results.values()):
            known = sorted(k for k in next(iter(results.values())) if k != "global_step")
            raise UserError(f"--early_stop {metric}: not an eval metric of this model; it "
                            f"reports {', '.join(known)}")
        steps = sorted(results)
        values = [float(results[s][metric]) for s in steps]
        stale = evaluations_without_improvement(values, higher, min_delta)
        if stale >= patience:
            should_stop.fired = True
            say(f"early stop at step {steps[-1]}: {metric} has not improved by more than "
                f"{min_delta} for {stale} evaluations")
            return True
        return False

    should_stop.fired = False
    return should_stop


def make_hook(estimator, metric: str, higher: bool, patience: int, min_delta: float,
              every_steps: int, say=print, stops_together: bool = False,
              owns_the_run: bool = True):
    """The early-stopping hook for this task.

    stops_together: the workers take every step together (StrategySpec.stops_together); the
    decision is all-reduced so that all stop at one step. Otherwise the run's owner (local,
    chief: Role.writes_run_files) decides and the other workers read its stop signal.
    """
    should_stop = make_should_stop(estimator.eval_dir(), metric, higher, patience, min_delta, say)
    every_steps = max(1, every_steps)
    if stops_together:
        hook = internals.multi_worker_early_stopping_hook(should_stop, every_steps)
    elif owns_the_run:
        hook = internals.stop_on_predicate_hook(should_stop, every_steps)
    else:
        hook = internals.check_for_stopping_hook()
    return UnsavedStopSignal(hook, should_stop)


class UnsavedStopSignal(tf.compat.v1.train.SessionRunHook):
    """`hook` with its stop signal variable (signal_early_stopping/STOP) kept out of checkpoints.

    TensorFlow's hooks create it as a global variable, so a checkpoint written
    without --early_stop could not be resumed with it (the restore of the missing
    variable fails) and one written with it carried a stale stop signal. Here it is
    a local variable: initialized (False) by every task's session, never saved.
    """

    def __init__(self, hook, should_stop=None):
        self._hook = hook
        self._should_stop = should_stop

    @property
    def stopped_early(self) -> bool:
        """Whether this task's early-stopping decision stopped training."""
        return bool(getattr(self._should_stop, "fired", False))

    def begin(self):
        self._hook.begin()
        graph = tf.compat.v1.get_default_graph()
        stop = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                if v.op.name == STOP_VARIABLE or getattr(v, "name", "").startswith(STOP_VARIABLE + ":")]
        global_vars = graph.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        for variable in stop:
            global_vars.remove(variable)
            graph.add_to_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES, variable)

    def after_create_session(self, session, coord):
        self._hook.after_create_session(session, coord)

    def before_run(self, run_context):
        return self._hook.before_run(run_context)

    def after_run(self, run_context, run_values):
        self._hook.after_run(run_context, run_values)

    def end(self, session):
        self._hook.end(session)
