"""The warm-start harness (warm.py) behaves as the subprocess.Popen it stands in for."""
import os
import subprocess
import time

import pytest

import warm


@pytest.mark.skipif(not warm.enabled(), reason="warm starts are off (ESTIMATOR_DIST_TEST_WARM=0)")
def test_a_signal_to_a_warm_child_that_ended_unread_is_a_no_op_as_for_popen(tmp_path):
    """The warm server reaps its children, so one can be gone before poll() read that: a
    launcher stopping its cluster then signalled a PID that no longer existed (a traceback
    and exit code 1 instead of the failed task's 2). Popen.send_signal ignores that."""
    proc = warm.Process(["--help"], tmp_path, None, subprocess.DEVNULL, subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.kill(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        pytest.fail(f"warm child {proc.pid} still exists after 120 s")
    proc.send_signal(15)
    proc.terminate()
    proc.kill()
    assert proc.wait(60) == 0
