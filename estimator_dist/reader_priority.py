"""The input pipeline's threads at a lower CPU priority than the training step's (Linux).

On a CPU-only machine the reader and the step share the cores. A reader thread that
wakes up in the middle of a step takes a core from one of the step's op shards,
and the whole op waits for that shard. With a higher nice value the kernel runs
the reader mostly when a core would otherwise idle (between ops, while Python
runs the hooks), and the step keeps its cores (README "Performance").

Niceness, not SCHED_IDLE: a reader that only ever ran on idle cores could be
starved by other processes while the step waits for it; a niced thread still gets
its (small) share. The value only ever goes up: an unprivileged process cannot
lower it again, so the threads must be the reader's own (a tf.data private
threadpool, `tf.data.Options().threading.private_threadpool_size`).
"""
import os
import sys
import threading

import numpy as np
import tensorflow as tf

DEFAULT_NICE = 10  # config.DataConfig.reader_nice


def supported() -> bool:
    """Linux: setpriority on a thread id changes that thread only."""
    return sys.platform.startswith("linux") and hasattr(os, "setpriority")


def _renice_this_thread(nice: int) -> np.int32:
    # Asked every time (one cheap syscall), not remembered per thread id: Linux reuses
    # the ids of threads that have ended.
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:
        pass  # e.g. a seccomp profile forbids it: the reader keeps its priority
    return np.int32(0)


def lowered(fn, nice: int):
    """`fn` for Dataset.map that first raises its thread's nice value to `nice`.

    Costs one small Python call per element: map whole batches, not single examples.
    With nice 0, or off Linux, `fn` itself.
    """
    if nice <= 0 or not supported():
        return fn

    def renice_then(*args):
        done = tf.numpy_function(lambda: _renice_this_thread(nice), [], tf.int32, stateful=True)
        with tf.control_dependencies([done]):
            args = tf.nest.map_structure(tf.identity, args)
        return fn(*args)

    return renice_then
