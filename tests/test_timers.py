"""The waits a test may shorten (timers.py): only the named timers, only numbers of seconds,
and each one read where its default lives."""
import os
import re
import signal
import sys
import time

import pytest

from estimator_dist import timers
from estimator_dist.cli.main import main
from estimator_dist.errors import UserError
from estimator_dist.guards import peers
from estimator_dist.launch import supervisor as launcher
from support import REPO


def test_unset_the_defaults_hold():
    assert timers.overrides({}) == {}
    assert timers.seconds("stop_grace_s", 25.0, {}) == 25.0


def test_named_timers_take_seconds():
    env = {timers.ENV: "peer_stall_min_s=5, stop_grace_s=0.5"}
    assert timers.overrides(env) == {"peer_stall_min_s": 5.0, "stop_grace_s": 0.5}
    assert timers.seconds("stop_grace_s", 25.0, env) == 0.5
    assert timers.seconds("peer_deadline_s", 20.0, env) == 20.0


@pytest.mark.parametrize("value, message", [
    ("stop_grace=5", "ESTIMATOR_DIST_TEST_TIMERS names 'stop_grace': not a timer; the timers are "
                     f"{', '.join(sorted(timers.TIMERS))} (name=seconds, "
                     "comma-separated), or unset it"),
    ("stop_grace_s=0", "ESTIMATOR_DIST_TEST_TIMERS stop_grace_s='0': must be a number of seconds "
                       "> 0 (e.g. stop_grace_s=5), or unset it"),
    ("stop_grace_s=inf", "ESTIMATOR_DIST_TEST_TIMERS stop_grace_s='inf': must be a number"),
    ("stop_grace_s", "ESTIMATOR_DIST_TEST_TIMERS stop_grace_s='': must be a number"),
])
def test_a_typo_is_refused_not_taken_for_a_default(value, message):
    with pytest.raises(UserError, match=f"^{re.escape(message)}"):
        timers.overrides({timers.ENV: value})


def test_a_command_with_a_bad_setting_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv(timers.ENV, "stall=5")
    assert main(["list"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("estimator-dist: error: ESTIMATOR_DIST_TEST_TIMERS names 'stall'")


def test_each_timer_is_read_where_its_default_lives():
    for name, where in timers.TIMERS.items():
        path, constant = where.split()
        source = open(os.path.join(REPO, "estimator_dist", path)).read()
        assert re.search(rf"^{constant} = [\d.]+ +# timers\.py: {name}$", source, re.M), where
        readers = [p for p in ("guards/peers.py", "guards/training_guard.py",
                               "launch/supervisor.py", "guards/step_end.py")
                   if f'timers.seconds("{name}", ' in open(os.path.join(
                       REPO, "estimator_dist", p)).read()]
        assert readers, name


def test_the_stall_hook_takes_the_injected_minimum(monkeypatch):
    assert peers.StallHook("/tmp")._min == peers.PEER_STALL_MIN_S  # pylint: disable=protected-access
    monkeypatch.setenv(timers.ENV, "peer_stall_min_s=3")
    assert peers.StallHook("/tmp")._min == 3.0  # pylint: disable=protected-access


def test_the_launcher_kills_a_task_that_ignores_sigterm_after_the_injected_grace(monkeypatch):
    monkeypatch.setenv(timers.ENV, "stop_grace_s=1")
    stubborn = [sys.executable, "-c", "import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('ready', flush=True)\ntime.sleep(600)"]
    task = launcher.Task("worker:0", stubborn, "")
    lines = []
    supervisor = launcher.Supervisor([task], whole_restart=False, max_restarts=0,
                                     startup_timeout=60, emit=lines.append)
    supervisor.start(task)
    deadline = time.monotonic() + 120
    while "[worker:0] ready" not in lines:  # past its signal() call
        assert time.monotonic() < deadline and task.process.poll() is None, lines
        time.sleep(0.05)
    started = time.monotonic()
    supervisor.stop_tasks([task])
    assert task.process.returncode == -signal.SIGKILL
    # The default grace would have taken 25 s; the injected one ends it well before.
    assert time.monotonic() - started < launcher.STOP_GRACE_SECONDS
