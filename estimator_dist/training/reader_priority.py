"""The input pipeline's threads at a lower CPU priority than the training step's (Linux).

On a CPU-only machine the reader and the step share the cores. A reader thread that
wakes up in the middle of a step takes a core from one of the step's op shards,
and the whole op waits for that shard. So the reader's threads run under
SCHED_BATCH, which never preempts a running thread when it wakes up, at a high
nice value, which gives it a small share of a busy core: the kernel runs the
reader mostly when a core would otherwise idle (between ops, while Python runs
the hooks), and the step keeps its cores (docs/speed.md). A higher nice
value alone (SCHED_OTHER) still lets the waking reader preempt the step.

Not SCHED_IDLE: a reader that only ever ran on idle cores could be starved by
other processes while the step waits for it (and, holding the GIL, stall the
training loop's Python); a niced thread still gets its share, and an
unprivileged thread cannot leave SCHED_IDLE again. The nice value only goes up
(an unprivileged process cannot lower it), so the threads must be the reader's
own (a tf.data private threadpool, `tf.data.Options().threading.private_threadpool_size`).
"""
import os
import sys
import threading

import numpy as np
import tensorflow as tf

DEFAULT_NICE = 19  # --reader_nice not given (config.NO_READER_NICE in params)


def nice_value(nice) -> int:
    """The nice value to use for a run's params["reader_nice"]: DEFAULT_NICE when the run did
    not set it (-1, or None / missing), else the value given (0-19)."""
    return DEFAULT_NICE if nice is None or nice < 0 else int(nice)


def supported() -> bool:
    """Linux: setpriority and sched_setscheduler on a thread id change that thread only."""
    return sys.platform.startswith("linux") and hasattr(os, "setpriority") \
        and hasattr(os, "SCHED_BATCH")


def lower_this_thread(nice: int):
    """Put the calling thread under SCHED_BATCH at nice value `nice` (Linux; elsewhere, or
    at 0, nothing; below 0, not given: DEFAULT_NICE).

    For a function that already runs in the reader's threads, e.g. a tf.numpy_function
    of a Dataset.map: cheaper than wrapping it with `lowered`.
    """
    nice = nice_value(nice)
    if nice == 0 or not supported():
        return
    # Asked every time (two cheap syscalls), not remembered per thread id: Linux reuses
    # the ids of threads that have ended.
    tid = threading.get_native_id()
    try:
        if os.sched_getscheduler(tid) == os.SCHED_OTHER:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:
        pass  # e.g. a seccomp profile forbids it: the reader keeps its priority


def _renice_this_thread(nice: int) -> np.int32:
    lower_this_thread(nice)
    return np.int32(0)


def lowered(fn, nice: int):
    """`fn` for Dataset.map that first lowers its thread's priority (lower_this_thread).

    Costs one small Python call per element: map whole batches, not single examples.
    With nice 0, or off Linux, `fn` itself; below 0 (not given), DEFAULT_NICE.
    """
    nice = nice_value(nice)
    if nice == 0 or not supported():
        return fn

    def renice_then(*args):
        done = tf.numpy_function(lambda: _renice_this_thread(nice), [], tf.int32, stateful=True)
        with tf.control_dependencies([done]):
            args = tf.nest.map_structure(tf.identity, args)
        return fn(*args)

    return renice_then
