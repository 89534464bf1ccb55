"""What a failed or timed-out test leaves running is stopped after it (conftest.py)."""
import support
from support import TRAIN, Run, alive


def test_a_run_still_running_after_its_test_is_stopped(tmp_path):
    """A test that hit its pytest timeout left its cluster training beside the next tests
    (an early-stop cluster ran on for minutes on a loaded machine)."""
    run = Run(["--train_steps", "1000000", "--model_dir", str(tmp_path / "run"), *TRAIN],
              command="train")
    assert run.proc.poll() is None
    support.stop_left_running()  # what conftest.py does after every test
    assert run.proc.poll() is not None and not alive(run.proc.pid)
    assert not support._STARTED  # pylint: disable=protected-access
