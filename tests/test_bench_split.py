"""The bench's per-step split of a worker case (bench/step_split.py): the traced shares of
input and communication, the untraced step and session-run times, and the table."""
import math

import pytest
from tensorflow.core.framework import step_stats_pb2

from estimator_dist.bench import step_split
from test_bench import FakeGate, GateClosed


def stats(*nodes, device="/job:chief/replica:0/task:0/device:CPU:0"):
    """StepStats of (op type, start micros, end micros) on one device."""
    out = step_stats_pb2.StepStats()
    dev = out.dev_stats.add(device=device)
    for i, (op, start, end) in enumerate(nodes):
        dev.node_stats.add(node_name=f"n{i}", timeline_label=f"n{i} = {op}(a, b)",
                           all_start_micros=start, all_end_rel_micros=end - start)
    return out


def test_the_union_of_intervals_counts_overlaps_once():
    assert step_split.covered([]) == 0
    assert step_split.covered([(0, 10), (5, 20), (30, 40), (35, 36)]) == 30


def test_shares_are_the_waits_no_compute_op_overlaps_input_first():
    run = stats(("IteratorGetNext", 0, 20), ("MatMul", 10, 40), ("CollectiveReduceV2", 30, 90),
                ("_Recv", 80, 95), ("HorovodAllreduce", 15, 25), ("Conv2D", 60, 70),
                ("ApplyGradientDescent", 95, 100))
    got = step_split.shares(run)
    assert got["input"] == pytest.approx(0.10)  # 0-10: the input alone
    # communication while nothing computes: 40-60 and 70-95 (the all-reduce launched at 30
    # overlaps MatMul and Conv2D there; the Horovod one lies under input and MatMul)
    assert got["comm"] == pytest.approx(0.45)
    assert step_split.shares(step_stats_pb2.StepStats()) is None


def test_op_types_come_from_the_timeline_label():
    assert step_split.op_type("x/y = CollectiveReduceV2(a)", "x/y") == "CollectiveReduceV2"
    assert step_split.op_type("", "_SOURCE") == "_SOURCE"
    assert [step_split.category(o) for o in ("MultiDeviceIteratorGetNextFromShard", "NcclAllReduce",
                                            "Conv2D")] == ["input", "comm", "compute"]


def test_the_parts_add_up_to_the_median_step():
    steps = [0.100, 0.100, 0.300]  # a stalled step: the medians leave it out
    runs = [0.080, 0.080, 0.090]
    parts = step_split.split(steps, runs, {"input": 0.25, "comm": 0.5})
    assert parts["step"] == pytest.approx(100.0)
    assert parts["hooks & checkpoints"] == pytest.approx(20.0)
    assert parts["all-reduce"] == pytest.approx(40.0) and parts["input wait"] == pytest.approx(20.0)
    assert math.isclose(sum(parts[p] for p in step_split.PARTS), parts["step"])
    assert step_split.split(steps, runs, {}) == {}  # no traced steps
    assert step_split.split(steps, [float("nan")] * 3, {"input": 0, "comm": 0}) == {}
    table = step_split.format_split([("MLP", "project multi_worker_mirrored 2 worker(s) x 1 core",
                                      parts), ("MLP", "plain none N=1", {})])
    assert "all-reduce" in table.splitlines()[1] and len(table.splitlines()) == 4
    assert " 100.00 " in table and " 40.00 " in table


def test_shares_median_leaves_out_the_first_traced_step_which_starts_the_profiler():
    runs = [{"input": 0.9, "comm": 0.0}, {"input": 0.1, "comm": 0.5},
            {"input": 0.2, "comm": 0.4}, None]
    assert step_split.trace_summary(runs) == {"input": pytest.approx(0.15),
                                              "comm": pytest.approx(0.45)}
    assert step_split.trace_summary([None, None]) == {}


def test_clock_times_session_runs_and_traces_on_the_benchs_command(monkeypatch):
    """The clock hook times each run; "trace K" runs K steps with FULL_TRACE and reports the
    median shares from their step stats instead of a burst."""
    import tensorflow as tf

    from estimator_dist.bench import cases as bench_cases

    now = [0.0]
    monkeypatch.setattr(bench_cases.time, "monotonic", lambda: now[0])
    gate = FakeGate(["run 3", "trace 3"])
    clock = bench_cases.Clock({"warmup": 1, "t0": 0.0}, gate)
    hook = bench_cases.ClockHook(clock)

    class Values:
        run_metadata = tf.compat.v1.RunMetadata()

    Values.run_metadata.step_stats.CopyFrom(stats(("MatMul", 10, 60), ("IteratorGetNext", 0, 10),
                                                  ("CollectiveReduceV2", 50, 90),
                                                  ("AssignVariableOp", 90, 100)))
    asked = []
    with pytest.raises(GateClosed):
        for t in range(20):
            now[0] = float(t)
            asked.append(hook.before_run(None))
            now[0] = t + 0.75
            hook.after_run(None, Values)
    ready, burst, traced = gate.reports
    assert burst["step_seconds"] == [1.0, 1.0] and burst["run_seconds"] == [0.75, 0.75]
    assert asked[:4] == [None] * 4  # warm-up and the burst: not traced
    assert all(a.options.trace_level == tf.compat.v1.RunOptions.FULL_TRACE for a in asked[4:7])
    assert traced == {"event": "trace", "shares": {"input": pytest.approx(0.1),
                                                   "comm": pytest.approx(0.3)}}


def test_failed_traced_steps_leave_the_measured_bursts_and_say_why():
    from estimator_dist.bench import case_runner as bench_runner
    from estimator_dist.bench import plan as bench_plan

    class Silent:
        sent = []

        def send(self, command):
            self.sent.append(command)

        def receive(self, deadline):
            raise TimeoutError

        def close(self):
            pass

    case = next(c for c in bench_plan.cases_for("mlp") if c.workers == 2 and c.driver == "project")
    run = bench_runner.CaseRun(case, 0, "log", global_batch=64)
    run.channels = [Silent(), Silent()]
    run.bursts = [{"steps": 3, "step_seconds": [1.0, 1.0], "run_seconds": [0.5, 0.5],
                   "cpu_seconds": 1.0}]
    run.ready = {"first_step_seconds": 1.0}
    options = bench_plan.Options(quick=True, case_timeout=0.01)
    bench_runner.Runner(options, bench_plan.QUICK_SETTINGS, "", "", None, None)._trace(run)
    assert Silent.sent == [f"trace {step_split.TRACED_STEPS}"] * 2
    assert run.ok and run.split_error == "timed out in the traced steps"
    assert run.figures()["step_split"] == {} and run.figures()["examples_per_sec"] == 64.0
