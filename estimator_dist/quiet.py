"""Keep TensorFlow's banners and deprecation warnings out of the output unless --verbose."""
import logging
import os
import threading
import warnings

_state = {"quiet": False}


def is_quiet() -> bool:
    """Whether configure() silenced TensorFlow (no --verbose)."""
    return _state["quiet"]


def configure(verbose: bool):
    """Call before TensorFlow is imported; afterwards it also quiets the Python loggers."""
    if verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
    else:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        # Horovod's C++ log (read at hvd.init): its errors reach us as the ops' errors; a
        # rank that saw its peer leave printed "Horovod background loop uncaught exception".
        os.environ.setdefault("HOROVOD_LOG_LEVEL", "fatal")
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
    import tensorflow as tf

    from estimator_dist.compat import internals

    _state["quiet"] = not verbose
    if verbose:
        tf.get_logger().setLevel("INFO")
        return
    internals.silence_deprecation_warnings()
    tf.get_logger().setLevel("ERROR")
    tf.get_logger().addFilter(_not_event_writer_error)
    logging.getLogger("absl").setLevel(logging.ERROR)
    if not getattr(threading.excepthook, "drops_event_writer_failures", False):  # once per process
        threading.excepthook = _event_writer_failures_raised_later(threading.excepthook)


# A TensorBoard events writer whose write fails logs an error and dies with a traceback
# in its own thread; the main thread gets the same error at its next write or flush,
# where it becomes one line (a StorageError for a full disk): those two are noise.
EVENT_WRITER_THREAD = "EventLoggerThread"


def _not_event_writer_error(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("EventFileWriter writer thread error")


def _event_writer_failures_raised_later(previous):
    def hook(args):
        if args.thread is not None and args.thread.name == EVENT_WRITER_THREAD:
            return
        previous(args)

    hook.drops_event_writer_failures = True
    return hook
