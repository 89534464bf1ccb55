"""Keep TensorFlow's banners and deprecation warnings out of the output unless --verbose."""
import logging
import os
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
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
    import tensorflow as tf
    from tensorflow.python.util import deprecation

    _state["quiet"] = not verbose
    if verbose:
        tf.get_logger().setLevel("INFO")
        return
    deprecation._PRINT_DEPRECATION_WARNINGS = False  # pylint: disable=protected-access
    tf.get_logger().setLevel("ERROR")
    logging.getLogger("absl").setLevel(logging.ERROR)
