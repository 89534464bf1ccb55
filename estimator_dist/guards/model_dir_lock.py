"""One training run per model_dir: an exclusive lock held for the run's life.

Two runs into one model_dir at once both exited 0, their checkpoints, events and
exports interleaved. The run that writes model_dir (local, or a cluster's chief;
its other tasks write under the chief's lock) holds `fcntl.flock` on a file in
it: the kernel drops the lock when the process dies, kill -9 included, so a
dead run never blocks the next one. No TensorFlow import.
"""
import contextlib
import fcntl
import os
import socket

from estimator_dist import files
from estimator_dist.errors import UserError
from estimator_dist.guards import signals

LOCK_FILE = ".estimator-dist.lock"


@contextlib.contextmanager
def held(model_dir: str):
    """Hold model_dir's lock while inside; UserError naming the holder if another run has it."""
    path = os.path.join(model_dir, LOCK_FILE)
    created = files.missing_dirs(model_dir)
    fd = None
    try:
        os.makedirs(model_dir, exist_ok=True)
        fd = _acquire(path, model_dir)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    except OSError as e:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.remove(path)
            os.close(fd)
        files.remove_empty_dirs(created)
        if not files.reason_in(e):
            raise
        # os.write's error names no file (a full disk let the empty lock file be created).
        named = e if e.filename else OSError(e.errno, e.strerror, path)
        raise files.storage_error(named, f"--model_dir {model_dir}: creating its lock file",
                                  "nothing was written") from None
    def release(_error=None):
        # Unlinked before the unlock: a run that opened this file meanwhile finds it gone
        # after its flock (_acquire) and takes a fresh file instead.
        with contextlib.suppress(OSError):
            os.remove(path)
        os.close(fd)

    try:
        with signals.on_exit_now(release):
            yield
    finally:
        release()


def _acquire(path: str, model_dir: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(f"--model_dir {model_dir}: another run ({holder}) is training into "
                            f"it (it holds {path}); wait for it to end or stop it, or give "
                            f"another --model_dir") from None
        if _same_file(fd, path):
            os.ftruncate(fd, 0)
            return fd
        os.close(fd)  # the holder removed it between our open and flock: take the new one


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _holder(fd: int) -> str:
    text = os.pread(fd, 200, 0).decode(errors="replace").split()
    if len(text) >= 2:
        return f"PID {text[0]} on host {text[1]}"
    return "a process that has not yet written its PID"
