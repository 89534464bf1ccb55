"""Every TensorFlow internal the package relies on: private names, `tensorflow.python` and
`tensorflow_estimator` imports, and the patches of TensorFlow objects.

TensorFlow 2.15 has no public way to do these things; each is one small function named for
what it does, and the rest of the package calls the function, never the internal.
A private name is reached only through `_attr`, `_set` or `_require`: when TensorFlow no
longer has it, they raise TensorFlowChanged naming it and what depends on it (one line,
exit code 1), so a rename fails loudly instead of silently turning a fix into a no-op (a
`getattr(obj, "_name", None)` would return None and skip it). tests/test_tf_compat.py pins
every name, signature and mirrored source on the installed TensorFlow; tests/test_layout.py
refuses these uses anywhere else.

To add one (a helper branch that needs another internal):
1. Add a function here named for what it does; reach the internal with `_attr(owner,
   "name", why)` (read), `_set(owner, "name", value, why)` (write) or `_require(obj,
   "name", why)`; `why` says what breaks without it. A patch of a TensorFlow object goes in
   a function here too (see `replace_method`, `already_reduced`).
2. List every private name it touches in pins.py's NAMES (owner dotted path -> attributes)
   and the signature of any private callable in SIGNATURES; a method whose TensorFlow source
   is copied here gets its digest in MIRRORED.
3. Add a canary in tests/test_tf_compat.py for anything set on instances (NAMES checks
   classes and modules only).
"""
import contextlib
import hashlib
import inspect
import os

import tensorflow as tf
from tensorflow.python.client import pywrap_tf_session
from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.distribute import ps_values
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.eager import context
from tensorflow.python.framework import meta_graph
from tensorflow.python.framework import ops as ops_lib
from tensorflow.python.lib.io import file_io
from tensorflow.python.training import sync_replicas_optimizer
from tensorflow.python.training import training_util
from tensorflow.python.util import _pywrap_util_port
from tensorflow.python.util import deprecation
from tensorflow_estimator.python.estimator import early_stopping as tf_early_stopping
from tensorflow_estimator.python.estimator import training as tf_training

from estimator_dist.compat.pins import MIRRORED, NAMES, SIGNATURES  # noqa: F401 (the canaries)
from estimator_dist.errors import ReportedError

SUPPORTED = "TensorFlow 2.15 (tensorflow-estimator 2.15)"


class TensorFlowChanged(ReportedError):
    """An internal of TensorFlow this package relies on is gone or changed."""

    label = "TensorFlow changed"

    def __init__(self, name: str, why: str):
        super().__init__(f"{name} is gone or changed in TensorFlow {tf.__version__}; "
                         f"estimator-dist uses it {why}. It supports {SUPPORTED}: install "
                         f"tensorflow-cpu==2.15.1 (or tensorflow[and-cuda]==2.15.1) and "
                         f"tensorflow-estimator==2.15.0")
        self.name = name


def _label(owner) -> str:
    return getattr(owner, "__name__", None) or type(owner).__name__


def _attr(owner, name: str, why: str):
    try:
        return getattr(owner, name)
    except AttributeError:
        raise TensorFlowChanged(f"{_label(owner)}.{name}", why) from None


def _require(owner, name: str, why: str):
    _attr(owner, name, why)


def _set(owner, name: str, value, why: str):
    _require(owner, name, why)
    setattr(owner, name, value)


def source_digest(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


# Strategies


def multi_worker_mirrored_without_health_check(build):
    """`build()` (a MultiWorkerMirroredStrategy) without TensorFlow's coordination service and
    its health-check barrier: both wait for every peer in C++ holding the GIL, so a worker
    still connecting ignored SIGTERM (strategies.py says why neither is needed)."""
    why = "to leave out MultiWorkerMirroredStrategy's health check (SIGTERM while connecting)"
    context.context().configure_coordination_service(service_type="")  # "": none
    extended = _attr(collective_all_reduce_strategy, "CollectiveAllReduceExtended", why)
    saved = _attr(extended, "_enable_check_health", why)
    extended._enable_check_health = False  # the class default, read while the strategy builds
    try:
        strategy = build()
    finally:
        extended._enable_check_health = saved
    _set(strategy.extended, "_enable_check_health", False, why)  # Estimator configures it again
    return strategy


def distributed_apply(optimizer, distribution, grads_and_vars, global_step):
    """A tf.compat.v1 optimizer's own update under a strategy (in a merge_call): slots and
    global step included."""
    apply = _attr(optimizer, "_distributed_apply", "to apply gradients compressed to 16 bits")
    return apply(distribution, grads_and_vars, global_step)


@contextlib.contextmanager
def already_reduced(distribution):
    """The strategy's batch_reduce_to, for one merge, hands each replica its own value back:
    the values are the all-reduced sums already (a second reduce would send float32).
    `Optimizer._distributed_apply` reduces through it (a canary checks its source)."""
    extended = distribution.extended
    regroup = _attr(distribute_utils, "regroup", "to skip the float32 all-reduce")
    mirrored = _attr(values_lib, "Mirrored", "to skip the float32 all-reduce")

    def batch_reduce_to(reduce_op, value_destination_pairs, options=None):
        return [regroup(distribution.experimental_local_results(value), wrap_class=mirrored)
                for value, _ in value_destination_pairs]

    _require(extended, "batch_reduce_to", "to skip the float32 all-reduce")
    wrapped = extended.__dict__.get("batch_reduce_to")  # sparse_gradients' wrapper
    extended.batch_reduce_to = batch_reduce_to
    try:
        yield
    finally:
        if wrapped is None:
            del extended.batch_reduce_to
        else:
            extended.batch_reduce_to = wrapped


def replace_batch_reduce(distribution, batch_reduce_to):
    """From now on the strategy's batch_reduce_to (every gradient all-reduce: a tf.compat.v1
    optimizer's `_distributed_apply`, Keras's `all_reduce_sum_gradients` through
    `ReplicaContext.all_reduce`) is `batch_reduce_to`, which may call the class's own
    (`original_batch_reduce`). It goes with the strategy when Estimator deep-copies it."""
    extended = distribution.extended
    _require(extended, "batch_reduce_to", "to reduce sparse gradients exactly")
    extended.batch_reduce_to = batch_reduce_to


def original_batch_reduce(distribution, reduce_op, value_destination_pairs, options=None):
    extended = distribution.extended
    return type(extended).batch_reduce_to(extended, reduce_op, value_destination_pairs, options)


def per_replica(components):
    """The strategy's container of one value per local replica, as its inputs are."""
    return _attr(values_lib, "PerReplica", "to reduce sparse gradients exactly")(
        tuple(components))


def wrapped_variables(variable) -> tuple:
    """The variables a strategy's variable wraps: a MirroredVariable's copies (one per
    replica), a CentralStorage AggregatingVariable's one; () for a plain variable."""
    why = "to save each variable once"
    if isinstance(variable, _attr(values_lib, "DistributedVariable", why)):
        return tuple(variable.values)
    if isinstance(variable, _attr(ps_values, "AggregatingVariable", why)):
        return (variable.get(),)
    return ()


def mirrored(components):
    """One value per local replica, as the strategy's own all-reduce returns them."""
    regroup = _attr(distribute_utils, "regroup", "to reduce sparse gradients exactly")
    return regroup(list(components),
                   wrap_class=_attr(values_lib, "Mirrored", "to reduce sparse gradients exactly"))


# Graphs


def graph_collections(graph) -> dict:
    """The graph's own dict of collections (name -> list)."""
    return _attr(graph, "_collections", "to give each replica's model_fn call its collections")


def replace_graph_collections(graph, collections: dict):
    """Make `collections` (a dict subclass) the graph's dict of collections."""
    _set(graph, "_collections", collections, "to give each replica's model_fn call its "
                                              "collections")


def gradient_function(op):
    """The gradient function registered for `op`'s type (None: not differentiable; raises
    LookupError for none registered)."""
    return _attr(ops_lib, "get_gradient_function", "to name variables no gradient reaches")(op)


def global_step_read_tensor(graph=None):
    """The global step read that hooks fetch (created on first use)."""
    return _attr(training_util, "_get_or_create_global_step_read", "to read the global step")(
        graph)


# Process-wide switches


def enable_xla_cpu_global_jit():
    """XLA auto-clustering on CPUs too; read by TensorFlow once, at the first session."""
    _attr(pywrap_tf_session, "TF_SetTfXlaCpuGlobalJit", "for --jit on CPUs")(True)


def silence_deprecation_warnings():
    _set(deprecation, "_PRINT_DEPRECATION_WARNINGS", False, "to keep deprecation warnings "
                                                             "out of a quiet run")


def onednn_enabled() -> bool:
    """Whether this TensorFlow runs oneDNN kernels."""
    return bool(_attr(_pywrap_util_port, "IsMklEnabled", "to report oneDNN in the bench")())


# Checkpoint saving


def set_steps_per_run(hook, steps: int):
    """A CheckpointSaverHook's trust in the global step fetched with the train op."""
    _attr(hook, "_set_steps_per_run", "to save checkpoints without a run per step")(steps)


def checkpoint_saver_after_create_session(hook, session, write_graph_text):
    """TF 2.15's CheckpointSaverHook.after_create_session (digest in MIRRORED), with the graph
    serialized once and graph.pbtxt written by `write_graph_text(checkpoint_dir, graph_def)`."""
    why = "to write graph.pbtxt fast (saver_hook.py)"
    global_step = session.run(_attr(hook, "_global_step_tensor", why))
    graph = tf.compat.v1.get_default_graph()
    graph_def = graph.as_graph_def(add_shapes=True)
    if _attr(hook, "_save_graph_def", why):
        write_graph_text(_attr(hook, "_checkpoint_dir", why), graph_def)
    saver = _attr(hook, "_get_saver", why)()
    writer = _attr(hook, "_summary_writer", why)
    writer.add_graph(graph)
    writer.add_meta_graph(meta_graph.create_meta_graph_def(
        graph_def=graph_def, saver_def=saver.saver_def if saver else None))
    # The checkpoint saved here is the state at step "global_step".
    _attr(hook, "_save", why)(session, global_step)
    _attr(hook, "_timer", why).update_last_triggered_step(global_step)


def atomic_write(path: str, text: str):
    """Write via a temporary file and a rename, as TensorFlow does: never half-written."""
    file_io.atomic_write_string_to_file(path, text)


def replace_method(obj, name: str, function):
    """Make `obj.name` (an instance's method) call `function` instead."""
    _require(obj, name, f"to wrap {name}")
    setattr(obj, name, function)


def before_session_close(session, callback):
    """`callback()` first when MonitoredSession closes this raw session, after every hook's
    end(), before TensorFlow's teardown; once (a later close, e.g. Session.__del__, is not)."""
    original = session.close
    replace_method(session, "close", lambda: (
        replace_method(session, "close", original), callback(), original()))


# TensorFlow's recoverable session (MonitoredSession: Estimator's training and evaluation)
# creates its session again at once, in a loop, when creating it raised one of these.
SESSION_RETRY_ERRORS = (tf.errors.AbortedError, tf.errors.UnavailableError)


_retry_pause = [None]  # the pause pause_before_session_retries set last


def pause_before_session_retries(pause):
    """In every session creator of this process: after create_session raised one of
    SESSION_RETRY_ERRORS (a peer gone), `pause(n)` (n: such failures in a row) before the
    error propagates to the recoverable session's retry. A later call replaces `pause`."""
    _retry_pause[0] = pause
    for creator in (tf.compat.v1.train.ChiefSessionCreator,
                    tf.compat.v1.train.WorkerSessionCreator):
        original = creator.create_session
        if getattr(original, "pauses_before_retries", False):
            continue
        failures = [0]

        def create_session(self, original=original, failures=failures):
            try:
                session = original(self)
            except SESSION_RETRY_ERRORS:
                failures[0] += 1
                _retry_pause[0](failures[0])
                raise
            failures[0] = 0
            return session

        create_session.pauses_before_retries = True
        creator.create_session = create_session


# Keras


def keep_tf_logs(callback):
    """A tf.keras callback that takes the logs as tensors: no per-batch conversion to numpy."""
    _set(callback, "_supports_tf_logs", True, "to time Keras steps without a numpy copy each")


# Exporters


def best_exporter_model_dir(exporter):
    """The model_dir a tf.estimator.BestExporter last exported from (None before its first)."""
    return _attr(exporter, "_model_dir", "to keep the best export across restarts")


def best_exporter_compare_fn(exporter):
    """`compare_fn(best_eval_result, current_eval_result)` of a BestExporter."""
    return _attr(exporter, "_compare_fn", "to keep the best export across restarts")


def resume_best_exporter(exporter, model_dir, best_eval_result, has_exported: bool):
    """A BestExporter's state as if it had run since the model_dir's first evaluation."""
    why = "to keep the best export across restarts"
    _set(exporter, "_model_dir", model_dir, why)
    _set(exporter, "_best_eval_result", best_eval_result, why)
    _set(exporter, "_has_exported", has_exported, why)


# SyncReplicasOptimizer


def is_sync_replicas_hook(hook) -> bool:
    """Whether `hook` is the session hook of a SyncReplicasOptimizer."""
    why = "to find a model_fn's SyncReplicasOptimizer"
    return isinstance(hook, _attr(sync_replicas_optimizer, "_SyncReplicasOptimizerHook", why))


def raised_by_sync_replicas(error: BaseException) -> bool:
    """Whether `error` was raised from SyncReplicasOptimizer's own module."""
    source = os.path.splitext(sync_replicas_optimizer.__file__)[0]
    tb = error.__traceback__
    while tb is not None:
        if os.path.splitext(tb.tb_frame.f_code.co_filename)[0] == source:
            return True
        tb = tb.tb_next
    return False


def sync_optimizer_of(hook):
    """The SyncReplicasOptimizer of its session hook."""
    return _attr(hook, "_sync_optimizer", "to refuse SyncReplicasOptimizer without a traceback")


def sync_queue_runner(hook):
    """The chief's queue runner of a SyncReplicasOptimizer hook after begin() (None elsewhere)."""
    return _attr(hook, "_q_runner", "to end the chief's queue runner quietly")


def end_queue_runner_quietly(runner, coord):
    """The session's close ending `runner` is its normal end; `coord` stops waiting for it."""
    why = "to end the chief's queue runner quietly"
    closed = tuple(_attr(runner, "_queue_closed_exception_types", why))
    runner._queue_closed_exception_types = closed + (tf.errors.CancelledError,
                                                     tf.errors.FailedPreconditionError)
    prefix = f"QueueRunnerThread-{runner.name}-"
    with _attr(coord, "_lock", why):
        registered = _attr(coord, "_registered_threads", why)
        for thread in [t for t in registered if t.name.startswith(prefix)]:
            registered.discard(thread)


# Estimator's evaluator loop and early stopping

ContinuousEvalListener = _attr(tf_training, "_ContinuousEvalListener",
                               "to end the evaluator when training ends")


def evaluated(eval_result) -> bool:
    """Whether the evaluator loop's result is a new evaluation (not "no new checkpoint")."""
    status = _attr(tf_training, "_EvalStatus", "to back off between empty evaluator polls")
    return eval_result.status == status.EVALUATED


def run_evaluator_loop(estimator, train_spec, eval_spec, listener):
    """Estimator's evaluator task loop, told by `listener` when to stop."""
    executor = _attr(tf_training, "_TrainingExecutor", "to end the evaluator when training ends")
    executor(estimator, train_spec, eval_spec, continuous_eval_listener=listener).run()


def read_eval_metrics(eval_dir: str) -> dict:
    """{global_step: {metric: value}} of the evaluations Estimator wrote to `eval_dir`."""
    return _attr(tf_early_stopping, "read_eval_metrics", "for --early_stop")(eval_dir)


def multi_worker_early_stopping_hook(should_stop, every_steps: int):
    """Every MultiWorkerMirrored worker votes; all stop at the same step."""
    hook = _attr(tf_early_stopping, "_MultiWorkerEarlyStoppingHook", "for --early_stop")
    return hook(should_stop, every_steps)


def stop_on_predicate_hook(should_stop, every_steps: int):
    """The chief's hook: decides, and sets the stop flag the other workers poll."""
    hook = _attr(tf_early_stopping, "_StopOnPredicateHook", "for --early_stop")
    return hook(should_stop, None, every_steps)


def check_for_stopping_hook():
    """A parameter-server worker's hook: polls the chief's stop flag."""
    return _attr(tf_early_stopping, "_CheckForStoppingHook", "for --early_stop")()


def session_base_class():
    """The class whose `run` every tf.compat.v1 session runs (for tests counting runs)."""
    from tensorflow.python.client import session as session_lib  # only tests need it

    return session_lib.BaseSession
