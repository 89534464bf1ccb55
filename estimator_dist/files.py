"""Whole-or-nothing file writes, and the one-line error of a full disk.

Every small file the project writes (config.yaml, --summary_json, the
checkpoint state file, the evaluator's end marker, report.csv/png, predict's
CSV, a TFJob manifest) goes through `write_file`: a temp file next to it, then
a rename. A failed write leaves the earlier file as it was and no temp file;
a full disk, a file-size limit, a quota or a read-only file system becomes a
StorageError (one line, exit code 5) naming the file. No TensorFlow import:
the launcher and config code use it too.
"""
import contextlib
import errno
import os
import re
import tempfile
from typing import Callable, List, Optional

from estimator_dist.errors import StorageError, UserError, message

# How the OS errors of a write that storage refused read, also once TensorFlow has turned
# them into OpErrors: (what it means, the fix). A read-only or forbidden directory was told
# to "free space".
REASONS = {"File too large": ("a file hit the file-size limit (RLIMIT_FSIZE / ulimit -f)",
                              "raise the limit"),
           "No space left on device": ("the disk is full", "free space"),
           "Disk quota exceeded": ("the disk quota is used up", "free space or raise the quota"),
           "Read-only file system": ("the file system is read-only",
                                     "write to a writable directory (or remount it read-write)"),
           "Permission denied": ("this user may not write there",
                                 "write to a directory this user can write to (or fix its "
                                 "owner/mode)"),
           "Operation not permitted": ("writing there is not permitted (e.g. an immutable "
                                       "directory, chattr +i)",
                                       "write to a writable directory (or lift the attribute)")}
ERRNOS = {errno.EFBIG: "File too large", errno.ENOSPC: "No space left on device",
          errno.EDQUOT: "Disk quota exceeded", errno.EROFS: "Read-only file system",
          errno.EACCES: "Permission denied", errno.EPERM: "Operation not permitted"}


def reason_in(error: BaseException) -> Optional[str]:
    """The storage reason `error` carries (its errno, else its text), or None."""
    if isinstance(error, OSError) and error.errno in ERRNOS:
        return ERRNOS[error.errno]
    text = message(error)
    return next((reason for reason in REASONS if reason in text), None)


def _where(error: BaseException) -> str:
    """The file the error names: OSError.filename, or TensorFlow's "<path>; File too large"
    (a relative path too: "runs/d/eval; Read-only file system")."""
    if isinstance(error, OSError) and error.filename:
        return str(error.filename)
    text = message(error)
    found = re.search(r"([^\s;]*/[^\s;]*)\s*;\s*(?:" + "|".join(REASONS) + ")", text)
    if not found:
        return ""
    # TensorFlow writes through "<file>.tempstate<N>"; name the file being written.
    return re.sub(r"\.tempstate\d+$", "", found.group(1))


def storage_error(error: BaseException, what: str, kept: str) -> StorageError:
    reason = reason_in(error) or "write failed"
    where = _where(error)
    meaning, fix = REASONS.get(reason, (reason, "check the storage"))
    return StorageError(f"{what} failed: {meaning} ({reason}{': ' + where if where else ''}); "
                        f"{kept}; {fix} and rerun")


def check_output_file(flag: str, path: str, default_name: str):
    """Refuse an output file path (`flag` names it) that write_file could not write, before
    any work (the write's own errors came after it, naming the temp file or no file)."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"{flag} {path}: is a directory; give a file path such as "
                        f"{os.path.join(path, default_name)}")
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path}: its directory {parent} does not exist; create it or "
                        f"give another path")
    try:  # what the write will do: create a file next to `path`, then rename it
        fd, probe = tempfile.mkstemp(prefix=".estimator-dist-probe-", dir=parent)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot create a file in {parent} ({e.strerror or e}); "
                        f"give a path in a directory you can write to") from None


def write_file(path: str, write: Callable[[str], None], temp_suffix: str = ".tmp"):
    """`write(temp_path)` then rename it to `path`: `path` is whole or as it was before.
    A symlink's target is written (the link kept); a device or pipe is written directly.

    On any failure the temp file is removed; a full disk (see REASONS) raises
    StorageError. `temp_suffix` keeps an extension some writers need (".tmp.png").
    """
    path = os.path.realpath(path)  # through a symlink: the link stays, its target is replaced
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        write(path)  # a device or pipe (/dev/stdout): written into; a rename replaced it
        return
    tmp = path + temp_suffix
    existed = os.path.exists(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError) and reason_in(e):
            kept = f"the earlier {path} is unchanged" if existed else f"no {path} was left"
            raise storage_error(e, f"writing {path}", kept) from None
        raise


def write_text(path: str, data):
    """write_file for a text (str) or binary (bytes) file."""
    def write(tmp):
        if isinstance(data, bytes):
            with open(tmp, "wb") as f:
                f.write(data)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(data)

    write_file(path, write)


def missing_dirs(path: str) -> List[str]:
    """`path` and its parents that do not exist yet, deepest first: what creating it makes,
    for remove_empty_dirs to undo."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def remove_empty_dirs(directories: List[str]):
    """Remove `directories` (deepest first) while they are empty: undo a failed write's
    makedirs; one holding anything (another process's files) stays, with its parents."""
    for directory in directories:
        try:
            os.rmdir(directory)
        except OSError:
            return
