"""Writing checkpoints and exports safely: disk-full errors, temp leftovers, export dirs, modes.

TF 2.15 fails silently here (measured): a checkpoint save that hits a full disk
or a file-size limit raises OutOfRangeError ("File too large"), which
MonitoredSession takes for the end of the input: training stops early, exits 0,
and evaluates and exports an older checkpoint. A failed save also leaves a
`model.ckpt-N_temp` dir, a failed export a `temp-<timestamp>` dir.
`guard_saver()` makes a failed save a StorageError (which MonitoredSession does
not swallow); the caller removes the leftovers it made and keeps everything
that was there before.
"""
import contextlib
import errno
import os
import re
import shutil
from typing import Iterable, Optional, Set

import tensorflow as tf

from estimator_dist.errors import StorageError, UserError

# How the OS errors of a full disk read once TensorFlow has turned them into OpErrors.
REASONS = {"File too large": "a file hit the file-size limit (RLIMIT_FSIZE / ulimit -f)",
           "No space left on device": "the disk is full",
           "Disk quota exceeded": "the disk quota is used up",
           "Read-only file system": "the file system is read-only"}
ERRNOS = {errno.EFBIG: "File too large", errno.ENOSPC: "No space left on device",
          errno.EDQUOT: "Disk quota exceeded", errno.EROFS: "Read-only file system"}
TEMP_NAME = re.compile(r"(_temp$|^temp-\d+$|\.tempstate\d+$|\.tmp[0-9a-f]*$)")
EXPORT_NAME = re.compile(r"^(temp-)?\d+$")  # exports, and leftovers of a killed one


def storage_reason(error: BaseException) -> Optional[str]:
    """The OS reason when `error` is a failed write (disk full, file too large, ...), else None."""
    if isinstance(error, OSError) and error.errno in ERRNOS:
        return ERRNOS[error.errno]
    if isinstance(error, (tf.errors.OpError, OSError)):
        text = getattr(error, "message", None) or str(error)
        for reason in REASONS:
            if reason in text:
                return reason
    return None


def _where(error: BaseException) -> str:
    """The file the error names: OSError.filename, or TensorFlow's "<path>; File too large"."""
    if isinstance(error, OSError) and error.filename:
        return str(error.filename)
    text = getattr(error, "message", None) or str(error)
    found = re.search(r"(/[^\s;]+)\s*;\s*(?:" + "|".join(REASONS) + ")", text)
    if not found:
        return ""
    # TensorFlow writes through "<file>.tempstate<N>"; name the file being written.
    return re.sub(r"\.tempstate\d+$", "", found.group(1))


def storage_error(error: BaseException, what: str, kept: str) -> StorageError:
    reason = storage_reason(error) or "write failed"
    where = _where(error)
    return StorageError(f"{what} failed: {REASONS.get(reason, reason)} ({reason}"
                        f"{': ' + where if where else ''}); {kept}; free space (or raise the "
                        f"limit) and rerun")


def guard_saver(saver, describe_kept):
    """Make `saver.save` raise StorageError for a failed write instead of an OpError.

    MonitoredSession swallows OutOfRangeError, TensorFlow's error for a file that
    is too large, as if the input had ended; a StorageError propagates.
    `describe_kept()` says what is still intact, for the message.
    """
    if getattr(saver, "_estimator_dist_guarded", False):
        return saver
    save = saver.save

    def guarded_save(sess, save_path, global_step=None, *args, **kwargs):
        try:
            return save(sess, save_path, global_step, *args, **kwargs)
        except (tf.errors.OpError, OSError) as e:
            if storage_reason(e) is None:
                raise
            name = os.path.basename(save_path)
            with contextlib.suppress(TypeError, ValueError):
                name += f"-{int(global_step)}"
            raise storage_error(e, f"saving checkpoint {name}", describe_kept()) from None

    saver.save = guarded_save
    saver._estimator_dist_guarded = True  # pylint: disable=protected-access
    return saver


def temp_entries(directories: Iterable[str]) -> Set[str]:
    """Paths of temp files/dirs (TensorFlow's and ours) directly inside `directories`."""
    found = set()
    for directory in directories:
        if os.path.isdir(directory):
            found.update(os.path.join(directory, n) for n in os.listdir(directory)
                         if TEMP_NAME.search(n))
    return found


def export_bases(model_dir: str) -> Set[str]:
    """model_dir/export and its per-exporter bases (final, latest, best, manual)."""
    root = os.path.join(model_dir, "export")
    bases = {root}
    if os.path.isdir(root):
        bases.update(os.path.join(root, n) for n in os.listdir(root)
                     if os.path.isdir(os.path.join(root, n)))
    return bases


def remove(paths: Iterable[str]):
    for path in sorted(paths):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            with contextlib.suppress(OSError):
                os.remove(path)


@contextlib.contextmanager
def cleanup_on_failure(directories: Iterable[str]):
    """On an exception, remove the temp entries that appeared in `directories` meanwhile."""
    directories = list(directories)
    before = temp_entries(directories)
    try:
        yield
    except BaseException:
        remove(temp_entries(directories) - before)
        raise


def forbid_world_writable() -> int:
    """Honour the umask, but never create world-writable files or dirs: add o-w to it.

    Returns the previous umask. The CLI calls it once at start.
    """
    old = os.umask(0o022)
    os.umask(old | 0o002)
    return old


@contextlib.contextmanager
def not_world_writable():
    """forbid_world_writable() while inside (library use: training, export)."""
    old = forbid_world_writable()
    try:
        yield
    finally:
        os.umask(old)


def check_export_base(base: str):
    """Refuse an export base that holds anything but earlier timestamped exports.

    Estimator writes each export into a new `base/<timestamp>` directory and never
    overwrites one; a base that holds other files (e.g. a SavedModel itself, or
    an unrelated directory) is refused so that nothing of it is mixed into or lost.
    """
    if os.path.exists(base) and not os.path.isdir(base):
        raise UserError(f"--export_dir {base}: exists and is not a directory; give a new or "
                        f"empty directory")
    if not os.path.isdir(base):
        return
    other = sorted(n for n in os.listdir(base)
                   if not (EXPORT_NAME.match(n) and os.path.isdir(os.path.join(base, n))))
    if other:
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        raise UserError(f"--export_dir {base}: not empty (holds {shown}); exports go into "
                        f"<export_dir>/<timestamp>, so give a new or empty directory, or one "
                        f"holding only earlier exports")
