"""reader_priority: the input pipeline's threads, and only they, get the lower priority."""
import os
import threading

import pytest
import tensorflow as tf

from estimator_dist.training import reader_priority

pytestmark = pytest.mark.skipif(not reader_priority.supported(), reason="Linux only")


def thread_nices():
    """{thread id: nice value} of every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                out[int(tid)] = int(f.read().rsplit(")", 1)[1].split()[16])
        except FileNotFoundError:
            pass  # the thread ended meanwhile (an iterator's threads end with it)
    return out


def pipeline(fn, pool_threads=1):
    options = tf.data.Options()
    options.threading.private_threadpool_size = pool_threads
    options.threading.max_intra_op_parallelism = 1
    ds = tf.data.Dataset.range(64).batch(8).map(fn, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(2).with_options(options)


def test_the_map_runs_on_reniced_threads_and_the_caller_keeps_its_priority():
    seen, policies = {}, set()

    def where(x):
        tid = threading.get_native_id()
        seen[tid] = os.getpriority(os.PRIO_PROCESS, tid)
        policies.add(os.sched_getscheduler(tid))
        return x

    def fn(batch):
        return tf.numpy_function(where, [batch * 2], tf.int64)

    values = [v.tolist() for v in pipeline(reader_priority.lowered(fn, 7)).as_numpy_iterator()]
    assert values[0] == [0, 2, 4, 6, 8, 10, 12, 14] and len(values) == 8  # fn still applies
    assert seen and set(seen.values()) == {7}  # every call ran at nice 7
    assert policies == {os.SCHED_BATCH}  # which never preempts the step on waking up
    main = threading.get_native_id()
    assert main not in seen and thread_nices()[main] == 0
    assert os.sched_getscheduler(main) == os.SCHED_OTHER
    assert sum(nice == 7 for nice in thread_nices().values()) <= 1  # the pool's one thread


def test_nice_zero_leaves_the_function_alone():
    fn = lambda x: x  # noqa: E731
    assert reader_priority.lowered(fn, 0) is fn


def test_not_given_means_the_default_and_zero_means_zero():
    assert [reader_priority.nice_value(n) for n in (-1, None, 0, 7, 19)] == [19, 19, 0, 7, 19]


@pytest.mark.parametrize("given,expected", [(-1, {19}), (7, {7}), (0, set())])
def test_cifar_synthetic_runs_its_reader_threads_at_the_run_s_reader_nice(given, expected):
    """--synthetic too: its training batches come from the same NumPy reader (cifar_split);
    -1 is what a run that leaves --reader_nice out hands the input."""
    from estimator_dist.training import user_code
    from input_fns import cifar

    user_code.load_builtins()
    params = {"batch_size": 16, "synthetic": True, "seed": 1, "data_dir": "",
              "reader_nice": given}
    params.update(cifar.prepare(params))
    before = set(thread_nices())
    iterator = iter(cifar.cifar_input(tf.estimator.ModeKeys.TRAIN, params))
    for _ in range(4):
        next(iterator)
    new = {tid: nice for tid, nice in thread_nices().items() if tid not in before}
    assert {nice for nice in new.values() if nice} == expected
    assert thread_nices()[threading.get_native_id()] == 0
