"""The launcher acts on the exit that says why a cluster stopped, not on its echo.

A task that exits 144 (a peer is gone) only reports another task's end: a Horovod rank
> 0 sees "Horovod has been shut down" as soon as rank 0, preempted, shuts Horovod down, and
could exit before rank 0 does. The launcher then read that first exit as the cause: rank
1's code 1 (permanent) stopped the cluster instead of restarting it after rank 0's 143.
The tasks here are small Python processes that exit with given codes at given times.
"""
import sys

from estimator_dist import timers
from estimator_dist.launch import supervisor as launcher


def exits(code: int, after: float):
    return [sys.executable, "-c", f"import sys, time; time.sleep({after}); sys.exit({code})"]


def run_cluster(chief, worker, max_restarts=0):
    tasks = [launcher.Task("chief:0", chief, ""), launcher.Task("worker:1", worker, "")]
    lines = []
    supervisor = launcher.Supervisor(tasks, whole_restart=True, max_restarts=max_restarts,
                                     startup_timeout=60, emit=lines.append)
    return supervisor.run(), lines


def test_a_permanent_failure_after_a_peers_144_ends_the_cluster_with_its_code():
    # The chief fails (a NaN step: 4) a moment after its worker saw it gone (144).
    code, lines = run_cluster(exits(4, 1.5), exits(144, 0))
    assert code == 4, lines
    assert any("chief:0 exited with code 4, a permanent failure" in line for line in lines), lines
    assert not any("worker:1 exited" in line for line in lines), lines


def test_a_preempted_chief_after_a_peers_144_restarts_the_cluster_as_the_chiefs_143():
    code, lines = run_cluster(exits(143, 1.5), exits(144, 0), max_restarts=1)
    assert any("chief:0 exited with code 143; restarting the whole cluster" in line
               for line in lines), lines
    assert not any("worker:1 exited with code 144" in line for line in lines), lines


def test_a_144_alone_is_acted_on_once_no_other_task_trains():
    # Both see the other gone: the first 144 is the one named, without the settle wait.
    code, lines = run_cluster(exits(144, 2), exits(144, 0))  # 2 s: start-up skew under load
    assert code == launcher.EXIT_CLUSTER_FAILED, lines
    assert any("worker:1 exited with code 144 and --max_restarts 0 is used up" in line
               for line in lines), lines


def test_a_144_while_the_others_train_on_is_acted_on_after_the_settle_wait(monkeypatch):
    monkeypatch.setenv(timers.ENV, "peer_lost_settle_s=1")
    code, lines = run_cluster(exits(0, 300), exits(144, 0))
    assert code == launcher.EXIT_CLUSTER_FAILED, lines
    assert any("worker:1 exited with code 144 and --max_restarts 0 is used up" in line
               for line in lines), lines
