"""Where a worker case's step goes: compute, all-reduce, input wait, hooks and checkpoints.

The chief's clock (cases.Clock) times each step two ways in every burst: from one step's
end to the next (the step) and inside the session run (from the clock hook's before_run
to its after_run). The rest of the step is spent outside the run: the other hooks and
checkpoint saves. After the measured bursts the bench asks for a few traced steps
(RunOptions FULL_TRACE, TensorFlow's step stats): on the run's timeline, the share of the
wall time in which input ops (IteratorGetNext waiting for a batch), then communication ops
(collective all-reduces, Horovod's, NCCL's, sends and receives between devices or
processes, ps reads) are in flight while no compute op runs: the exposed waits. An
all-reduce launched as soon as its gradient is ready overlaps the rest of the backward
pass; only what the step waits for it counts (on the measured cifar 2-worker step, counting
every in-flight collective called 70% of the step all-reduce). The untraced run time is
split in those shares; compute is what remains (scheduling gaps included). Tracing slows
a step, so the shares come from traced steps and the milliseconds from untraced ones: the
four parts add up to the median step.
"""
import statistics
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

TRACED_STEPS = 6  # the first traced step starts TensorFlow's profiler: not counted
INPUT_OPS = ("IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
             "MultiDeviceIteratorGetNextFromShard")
COMM_PREFIXES = ("Collective", "Nccl", "Horovod", "_Recv", "_Send", "_HostRecv", "_HostSend",
                 "RecvTensor")
PARTS = ("compute", "all-reduce", "input wait", "hooks & checkpoints")


def op_type(timeline_label: str, node_name: str) -> str:
    """The op type in a step stats node ("name = Type(inputs)"), else its node name."""
    if " = " in timeline_label:
        return timeline_label.split(" = ", 1)[1].split("(", 1)[0].strip()
    return node_name


def category(op: str) -> str:
    if op in INPUT_OPS:
        return "input"
    if op.startswith(COMM_PREFIXES):
        return "comm"
    return "compute"


def covered(intervals: Iterable[Tuple[int, int]]) -> int:
    """The length of the union of [start, end) intervals."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def shares(step_stats) -> Optional[Dict[str, float]]:
    """{"input": f, "comm": f} of one traced run's span (first op start to last op end): the
    time input ops are in flight and no compute op runs, then communication ops and neither
    of those; None for a run with no timed op."""
    spans = {"input": [], "comm": [], "compute": []}
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            start = node.all_start_micros
            end = start + max(node.all_end_rel_micros, 0)
            spans[category(op_type(node.timeline_label, node.node_name))].append((start, end))
    every = spans["input"] + spans["comm"] + spans["compute"]
    if not every:
        return None
    first = min(a for a, _ in every)
    last = max(b for _, b in every)
    if last <= first:
        return None
    wall = last - first
    compute = covered(spans["compute"])
    waits = covered(spans["compute"] + spans["input"])
    return {"input": (waits - compute) / wall, "comm": (covered(every) - waits) / wall}


def trace_summary(runs: Sequence[Optional[Dict[str, float]]]) -> Dict[str, float]:
    """The median shares over traced steps (the first left out: the profiler's start)."""
    kept = [r for r in list(runs)[1:] if r] or [r for r in runs if r]
    if not kept:
        return {}
    return {k: statistics.median(r[k] for r in kept) for k in ("input", "comm")}


def split(step_seconds: List[float], run_seconds: List[float],
          trace: Dict[str, float]) -> Dict[str, float]:
    """Milliseconds per part of the median step (PARTS, plus "step"); {} without a trace.

    step_seconds[i] and run_seconds[i] belong to one step: its gap from the previous
    step's end and its session run."""
    if not trace or not step_seconds or len(run_seconds) != len(step_seconds) or \
            any(r != r for r in run_seconds):  # NaN: a driver that does not time its runs
        return {}
    step = statistics.median(step_seconds)
    outside = min(max(statistics.median(g - r for g, r in zip(step_seconds, run_seconds)), 0.0),
                  step)
    run = step - outside
    comm, inputs = run * trace["comm"], run * trace["input"]
    parts = {"step": step, "compute": run - comm - inputs, "all-reduce": comm,
             "input wait": inputs, "hooks & checkpoints": outside}
    return {k: 1000.0 * v for k, v in parts.items()}


def format_split(rows: List[Tuple[str, str, Dict[str, float]]]) -> str:
    """The table of (model title, case name, split) for the cases that have one."""
    rows = [r for r in rows if r[2]]
    if not rows:
        return ""
    head = (f"{'model':<20} {'case':<52} {'step':>7} "
            + " ".join(f"{p:>{max(len(p), 7)}}" for p in PARTS))
    lines = ["per-step split of the worker cases (the chief's median step, ms; all-reduce "
             "includes waiting for the other workers; docs/performance.md)", head, "-" * len(head)]
    for title, name, parts in rows:
        lines.append(f"{title:<20} {name:<52} {parts['step']:>7.2f} "
                     + " ".join(f"{parts[p]:>{max(len(p), 7)}.2f}" for p in PARTS))
    return "\n".join(lines)
