"""CPU seconds per test, children included: what a test costs a shared 2-core machine.

Wall time says little there (a test waits while its neighbour computes); CPU seconds add up
to the suite's time on a full machine. With ESTIMATOR_DIST_TEST_CPU=FILE each test's user+
system seconds (this process's, plus those of the children it waited for: CLI runs, whole
clusters, whose launcher waits for its tasks) are appended to FILE as
`seconds<TAB>nodeid<TAB>wall seconds<TAB>worker<TAB>end (Unix time)`, by every pytest-xdist
worker (the last two: when each worker was busy with what); the run ends with the
most costly ones and the total (ESTIMATOR_DIST_TEST_CPU_TOP of them, default 25), then the
tests that held their worker longest beyond their CPU time (wall less CPU: waits, sleeps,
timers, another process's CPU such as a Slurm job's tasks), where a parallel suite loses
a worker. conftest.py imports the hooks below.
"""
import os
import resource
import time

import pytest

import warm

ENV = "ESTIMATOR_DIST_TEST_CPU"


def _cpu_seconds():
    """This process's, its waited-for children's and its warm runs' (warm.py: the children
    of its server) CPU seconds so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
            + warm.ended_cpu())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown: a module fixture's cost goes to the test that built it."""
    path = os.environ.get(ENV)
    started, wall = (_cpu_seconds(), time.monotonic()) if path else (None, None)
    yield
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a") as f:  # one short append per test: whole lines across workers
            f.write(f"{_cpu_seconds() - started:.1f}\t{item.nodeid}\t"
                    f"{time.monotonic() - wall:.1f}\t{os.environ.get('PYTEST_XDIST_WORKER', '-')}"
                    f"\t{time.time():.1f}\n")


def cpu_table(path, top):
    """The `top` most costly tests of FILE and the total, as lines."""
    rows, walls = [], {}
    with open(path) as f:
        for line in f:
            seconds, nodeid, *wall = line.rstrip("\n").split("\t")
            rows.append((float(seconds), nodeid))
            walls[nodeid] = float(wall[0]) if wall else float(seconds)
    rows.sort(reverse=True)
    total = sum(s for s, _ in rows)
    lines = [f"{s:8.1f}  {nodeid}" for s, nodeid in rows[:top]]
    by_file = {}
    for s, nodeid in rows:
        by_file[nodeid.split("::")[0]] = by_file.get(nodeid.split("::")[0], 0.0) + s
    lines.append(f"{total:8.1f}  CPU seconds in all, {len(rows)} tests; by file:")
    lines += [f"{s:8.1f}  {name}" for name, s in sorted(by_file.items(), key=lambda r: -r[1])[:top]]
    idle = sorted(((walls[n] - s, walls[n], s, n) for s, n in rows), reverse=True)
    lines.append(f"{sum(max(r[0], 0.0) for r in idle):8.1f}  seconds of wall time beyond the "
                 "test's CPU time in all; the most (wall less CPU, wall, CPU):")
    lines += [f"{gap:8.1f}  {wall:6.1f} {s:6.1f}  {n}" for gap, wall, s, n in idle[:top // 2]]
    return lines


def pytest_terminal_summary(terminalreporter, config):
    path = os.environ.get(ENV)
    if not path or hasattr(config, "workerinput") or not os.path.exists(path):
        return
    top = int(os.environ.get(ENV + "_TOP", "25"))
    terminalreporter.section(f"CPU seconds per test (children included), top {top}")
    for line in cpu_table(path, top):
        terminalreporter.write_line(line)
