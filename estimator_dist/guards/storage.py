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
import os
import re
import shutil
from typing import Dict, Iterable, Optional, Set

import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist import checkpoint_files
from estimator_dist import files
from estimator_dist.errors import StorageError, UserError
from estimator_dist.files import reason_in, storage_error

TEMP_NAME = re.compile(r"(_temp$|^temp-\d+$|\.tempstate\d+$|\.tmp[0-9a-f]*$)")
EXPORT_NAME = re.compile(r"^(temp-)?\d+$")  # exports, and leftovers of a killed one


def storage_reason(error: BaseException) -> Optional[str]:
    """The OS reason when `error` is a failed write (disk full, file too large, ...), else None.

    TensorFlow raises OpErrors, or from a TensorBoard events writer's flush an IndexError
    (an OUT_OF_RANGE status through pybind) or a RuntimeError ("<file>; No space left on
    device", its writer thread's error re-raised).
    """
    if isinstance(error, (tf.errors.OpError, OSError, IndexError, RuntimeError)):
        return reason_in(error)
    return None


def event_files(directory: str):
    """The TensorBoard events files directly in `directory` (none if it does not exist)."""
    if not os.path.isdir(directory):
        return []
    return [os.path.join(directory, n) for n in os.listdir(directory)
            if n.startswith("events.out.tfevents.")]


def guard_saver(saver, describe_kept):
    """Make `saver.save` raise StorageError for a failed write instead of an OpError.

    MonitoredSession swallows OutOfRangeError, TensorFlow's error for a file that
    is too large, as if the input had ended; a StorageError propagates. A save
    that fails after writing some of its files (TensorFlow writes the variables,
    points the state file at them, then writes the .meta) is undone: its files
    are removed and the state file names the previous checkpoint again.
    `describe_kept()` says what is still intact, for the message.
    """
    if getattr(saver.save, "guards_storage", False):
        return saver
    save = saver.save

    def guarded_save(sess, save_path, global_step=None, *args, **kwargs):
        prefix = save_path
        with contextlib.suppress(TypeError, ValueError):
            prefix = f"{save_path}-{int(global_step)}"
        before = _files_before_save(prefix)
        shards = _shards(prefix)
        try:
            path = save(sess, save_path, global_step, *args, **kwargs)
        except (tf.errors.OpError, OSError) as e:
            if storage_reason(e) is None:
                raise
            _undo_save(prefix, *before)
            raise storage_error(e, f"saving checkpoint {os.path.basename(prefix)}",
                                describe_kept()) from None
        remove_stale_shards(prefix, shards)
        return path

    guarded_save.guards_storage = True
    internals.replace_method(saver, "save", guarded_save)
    return saver


def _shards(prefix: str) -> Dict[str, int]:
    """{path: mtime in ns} of checkpoint `prefix`'s data shards (model.ckpt-N.data-I-of-M)."""
    directory, name = os.path.split(prefix)
    found = {}
    for n in os.listdir(directory or "."):
        if n.startswith(name + ".data-") and checkpoint_files.SHARD_NAME.search(n):
            with contextlib.suppress(OSError):
                found[os.path.join(directory, n)] = os.stat(os.path.join(directory, n)).st_mtime_ns
    return found


def remove_stale_shards(prefix: str, before: Dict[str, int]):
    """After a save, remove the shards of an earlier save of the same step in another count.

    A run resumed with another strategy re-saves the checkpoint it restored at its
    first step: `tower` over 2 devices wrote model.ckpt-10.data-0000{0,1}-of-00002,
    `none` writes .data-00000-of-00001 and an index naming it, and the two old
    shards stayed beside it (measured), so that the checkpoint looked incomplete
    (checkpoint_files.complete_checkpoints) and a resume could fall back to an older one.
    """
    written = {path for path, mtime in _shards(prefix).items() if before.get(path) != mtime}
    counts = {checkpoint_files.SHARD_NAME.search(path).group(2) for path in written}
    if len(counts) != 1:
        return
    count = counts.pop()
    remove(path for path in before
           if path not in written and checkpoint_files.SHARD_NAME.search(path).group(2) != count)


def _files_before_save(prefix: str):
    """(whether checkpoint `prefix` already existed, the state file's bytes or None)."""
    state_path = os.path.join(os.path.dirname(prefix), checkpoint_files.STATE_FILE)
    try:
        with open(state_path, "rb") as f:
            state = f.read()
    except OSError:
        state = None
    return os.path.exists(prefix + ".index"), state


def _undo_save(prefix: str, existed: bool, state: Optional[bytes]):
    """Remove what a failed save of a new checkpoint `prefix` wrote; restore the state file.

    If restoring the state file fails too (the disk is full), it may name the
    removed checkpoint: the next run's resume check repairs such a state file.
    """
    if existed:  # a re-save at the same step: the old files may be the new ones now
        return
    directory, name = os.path.split(prefix)
    remove(os.path.join(directory, n) for n in os.listdir(directory or ".")
           if n.startswith(name + "."))
    state_path = os.path.join(directory, checkpoint_files.STATE_FILE)
    with contextlib.suppress(OSError, StorageError):
        if state is None:
            os.remove(state_path)
        else:
            files.write_text(state_path, state)


def trim_event_files(directories: Iterable[str]):
    """Cut every TensorBoard events file in `directories` back to its last whole record.

    A write that failed on a full disk leaves the record it was writing cut off, which
    TensorBoard reports as a damaged file ("truncated record") from then on. Records are
    TFRecord frames: an 8-byte length, its 4-byte CRC, the data, the data's 4-byte CRC.
    """
    for directory in directories:
        for path in event_files(directory):
            with contextlib.suppress(OSError):
                whole = _whole_records_end(path)
                if whole < os.path.getsize(path):
                    os.truncate(path, whole)


def _whole_records_end(path: str) -> int:
    """The byte offset where the last whole record of a TFRecord file ends."""
    size, end = os.path.getsize(path), 0
    with open(path, "rb") as f:
        while end + 12 <= size:
            f.seek(end)
            length = int.from_bytes(f.read(8), "little")
            if end + 12 + length + 4 > size:
                break
            end += 12 + length + 4
    return end


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
