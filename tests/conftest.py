"""Shared test setup: quiet TensorFlow, register built-ins, small training helpers, test tiers."""
import ast
import functools
import inspect
import os
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

from estimator_dist import quiet  # noqa: E402

quiet.configure(verbose=False)

from estimator_dist import config as config_lib  # noqa: E402
from estimator_dist import runner  # noqa: E402
from estimator_dist.registry import MODELS  # noqa: E402

runner.load_builtins()

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


# --- Tiers ----------------------------------------------------------------------------------------
# `make test` runs every test; `make test-fast` runs `-m "not process and not slow"`: the unit tier.
# The rule, applied at collection: a test is marked `process` when its code names a way to start a
# process (SPAWNS: subprocess, Popen, sys.executable, pty, launcher.Supervisor, ...), looking at the
# names used by the test function, by the fixtures it requests and, followed transitively, by the
# functions and classes defined under tests/ that these name (run_cli, test_cluster.Run, a module
# helper). Names, not text: a docstring that says "subprocess" does not count. PROCESS and SLOW list
# by "file::name" the few tests the rule gets wrong, and in-process tests too slow for the fast tier
# (each trains for many seconds; measured with --durations).
SPAWNS = frozenset({"subprocess", "Popen", "executable", "pty", "fork", "multiprocessing",
                    "Supervisor", "run_group"})
PROCESS = frozenset()
SLOW = frozenset()
TESTS = os.path.dirname(os.path.abspath(__file__))


def _defined_in_tests(obj) -> bool:
    try:
        path = inspect.getsourcefile(obj)
    except TypeError:  # a built-in
        return False
    return bool(path) and os.path.dirname(os.path.abspath(path)) == TESTS


@functools.lru_cache(maxsize=None)
def _uses(obj):
    """(names, attributes): the bare names and the `x.attr` pairs in obj's source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attributes = {(n.value.id, n.attr) for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    return names, attributes


def spawns_processes(*objects) -> bool:
    """True when these functions or classes, or the tests/ functions and classes they name (and
    so on), use one of SPAWNS."""
    seen, todo = set(), list(objects)
    while todo:
        obj = inspect.unwrap(todo.pop())
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        names, attributes = _uses(obj)
        if (names | {attr for _, attr in attributes}) & SPAWNS:
            return True
        scope = vars(sys.modules[obj.__module__])
        found = [scope.get(name) for name in names]
        found += [getattr(scope.get(base), attr, None) for base, attr in attributes
                  if inspect.ismodule(scope.get(base)) and _defined_in_tests(scope.get(base))]
        todo.extend(f for f in found if (inspect.isfunction(f) or inspect.isclass(f))
                    and _defined_in_tests(f))
    return False


def _test_id(item) -> str:
    return f"{os.path.basename(str(item.path))}::{item.originalname}"


def is_process_test(item) -> bool:
    fixtures = [defs[-1].func for defs in item._fixtureinfo.name2fixturedefs.values()
                if _defined_in_tests(defs[-1].func)]
    return _test_id(item) in PROCESS or spawns_processes(item.function, *fixtures)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_process_test(item):
            item.add_marker(pytest.mark.process)
        if _test_id(item) in SLOW:
            item.add_marker(pytest.mark.slow)
