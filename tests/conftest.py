"""Shared test setup: quiet TensorFlow, register built-ins, small training helpers."""
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

from estimator_dist import quiet  # noqa: E402

quiet.configure(verbose=False)

from estimator_dist.training import config as config_lib  # noqa: E402
from estimator_dist.training import user_code
from estimator_dist.training import run as runner  # noqa: E402
from estimator_dist.training.registry import MODELS  # noqa: E402

user_code.load_builtins()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, timeout=300):
    """`python -m estimator_dist ARGS` in a fresh process, as a user runs it: the finished process."""
    return subprocess.run([sys.executable, "-m", "estimator_dist", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def run_on_a_terminal(args, columns=None, timeout=120):
    """`python -m estimator_dist ARGS` writing to a pseudo-terminal (`columns` wide when given),
    as from a user's shell: (exit code, everything it wrote, as text)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "estimator_dist", *args], stdout=slave,
                            stderr=slave, cwd=REPO)
    os.close(slave)
    output = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    return proc.wait(timeout), output.decode()


def make_config(model="digits", overrides=(), **flags):
    """A Config as the CLI would build it from flags (None = not given)."""
    entry = MODELS.get(model)
    return config_lib.build_config(model, {}, flags, entry.run_defaults, entry.hparams,
                                   tuple(overrides))


def quick_train(model_dir, steps=40, strategy="none", num_devices=1, **flags):
    """Train digits briefly and quietly; returns the run summary."""
    flags = {"train_steps": steps, "strategy": strategy, "num_devices": num_devices,
             "model_dir": str(model_dir), "batch_size": 32, "export": "final", "seed": 1,
             "save_checkpoints_steps": steps, **flags}
    return runner.train(make_config(**flags), out=lambda *_: None)


@pytest.fixture(scope="session")
def trained_digits(tmp_path_factory):
    """One short single-device digits run shared by export/predict tests."""
    model_dir = tmp_path_factory.mktemp("digits_none")
    summary = quick_train(model_dir, steps=60)
    return model_dir, summary
