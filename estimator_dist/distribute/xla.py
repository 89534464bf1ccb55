"""--jit: XLA auto-clustering of the whole graph (TF1's global_jit_level ON_1).

On a CPU, XLA clusters ops only with the process-wide `tf_xla_cpu_global_jit`
flag, which TensorFlow reads once, at the first session (setting it later is
ignored; measured): it is set on import, and does nothing for a session whose
config does not ask for XLA.

XLA's first compilation logs two lines through absl, which TF_CPP_MIN_LOG_LEVEL
does not govern in TF 2.15. Both are logged once per process, so a quiet run
(no --verbose) first compiles a tiny graph with stderr sent to /dev/null.
"""
import contextlib
import functools
import os
import sys

import numpy as np
import tensorflow as tf

from estimator_dist.compat import internals

internals.enable_xla_cpu_global_jit()


def enable(config: tf.compat.v1.ConfigProto) -> tf.compat.v1.ConfigProto:
    config.graph_options.optimizer_options.global_jit_level = tf.compat.v1.OptimizerOptions.ON_1
    return config


@functools.lru_cache(maxsize=None)  # once per process
def compile_once_quietly():
    """Spend XLA's once-per-process log lines on a throwaway graph, out of sight."""
    with tf.Graph().as_default(), _stderr_discarded():
        x = tf.compat.v1.placeholder(tf.float32, [8, 8])
        y = tf.reduce_sum(tf.nn.relu(tf.matmul(x, x) * 2.0 + 1.0))
        # No GPU in this session: the first session of a process fixes its GPU allocator.
        config = enable(tf.compat.v1.ConfigProto(device_count={"GPU": 0}))
        with tf.compat.v1.Session(config=config) as session:
            session.run(y, {x: np.ones([8, 8], np.float32)})


@contextlib.contextmanager
def _stderr_discarded():
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
