"""A process's own temporary directory, removed however the process ends.

TensorFlow's autograph writes a Python file per function it converts (a tf.data map, a
`tf.function`) into the temporary directory and removes it from an atexit handler. The
exits that must not wait for Python's shutdown (`os._exit`: a stop from a signal, a task
ended with its run, a bench case) skip those handlers: each left its files behind, 46 from
one parameter_server cluster with an evaluator, thousands a day on a machine that trains
often. So an estimator-dist process puts its Python temporary files (`tempfile`: autograph's,
a Horovod rank's scratch model_dir) under `<TMPDIR or /tmp>/estimator-dist-<pid>-XXXXXXXX`
and removes that directory at its end, `hard_exit` (its os._exit) included. A process killed
by a signal cannot: the launcher removes its tasks' (`remove_left_by`) as it reaps them.

No TensorFlow here: the directory is claimed before TensorFlow is imported.
"""
import atexit
import os
import shutil
import tempfile
from typing import Optional, Tuple

PREFIX = "estimator-dist-"
REMOVE_ATTEMPTS = 5

_CLAIMED: Optional[Tuple[int, str]] = None  # (pid, directory)


def claim() -> Optional[str]:
    """Make a new directory under the temporary directory, the process's own: tempfile's
    default from now on, removed at exit. None, and nothing changed, if it cannot be made.
    Call it where a process starts, never in a library call."""
    global _CLAIMED
    if _CLAIMED and _CLAIMED[0] == os.getpid():
        return _CLAIMED[1]
    try:
        path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    except OSError:  # Python found no usable temporary directory: as before
        return None
    _CLAIMED = (os.getpid(), path)
    tempfile.tempdir = path
    atexit.register(remove)
    return path


def remove():
    """Remove the claimed directory: only in the process that claimed it, so a forked child
    leaves its parent's in place. Another thread may still write in it: a task that ended
    from its signal thread while the main thread's autograph converted a function left the
    directory with two files, rmtree having listed it before they came. So it is first
    renamed (no new file can appear by its name), then removed, again while anything is left."""
    if _CLAIMED and _CLAIMED[0] == os.getpid():
        path = _CLAIMED[1]
        try:
            os.rename(path, path + "-exiting")  # still PREFIX<pid>-: remove_left_by finds it
            path += "-exiting"
        except OSError:
            pass
        for _ in range(REMOVE_ATTEMPTS):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                return


def remove_left_by(pid: int):
    """Remove the directories that process `pid`, a child killed by a signal, claimed and
    left. Call it right after reaping the child, before its PID can be reused."""
    base = os.path.dirname(_CLAIMED[1]) if _CLAIMED else tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(f"{PREFIX}{pid}-")]
    except OSError:
        return
    for name in names:
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def remove_if_killed(proc):
    """remove_left_by for a reaped child (a subprocess.Popen) that a signal killed, once."""
    if proc is not None and proc.returncode is not None and proc.returncode < 0 and \
            not getattr(proc, "temp_removed", False):
        remove_left_by(proc.pid)
        proc.temp_removed = True


def hard_exit(code: int):
    """os._exit(code) after removing the claimed directory."""
    remove()
    os._exit(code)  # noqa: SLF001 - the callers' reasons: they must not wait for Python's exit
