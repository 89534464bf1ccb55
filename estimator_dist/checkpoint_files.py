"""A model_dir's checkpoint files, read without TensorFlow (the launcher reads them too).

Estimator saves model.ckpt-N as an index file and data shards (model.ckpt-N.index,
model.ckpt-N.data-I-of-M), first into a model.ckpt-N_temp directory; then it rewrites
the `checkpoint` state file, whose model_checkpoint_path names the checkpoint a run
resumes from. The questions asked of these files differ, so each has its own function:

  named_step        the step the state file names, whether or not its files are there
  latest_prefix     the checkpoint the state file names, when its index file exists: what
  latest_step       tf.train.latest_checkpoint returns, and the step a resume starts from
  index_steps       the steps whose index file exists
  complete_checkpoints  the steps whose index file and every data shard exist

The state file is a text protobuf (CheckpointState). It is read as TensorFlow reads it: a
file with a line that is no `field: value` of CheckpointState, or an unknown field, is
garbage and names nothing (TensorFlow logs a ParseError and ignores it); an empty one, or
one without model_checkpoint_path, names nothing either. A relative path is relative to
model_dir, as Estimator writes it.
"""
import os
import re
from typing import Dict, List, Optional

STATE_FILE = "checkpoint"
PREFIX = "model.ckpt"
INDEX_NAME = re.compile(r"^model\.ckpt-(\d+)\.index$")
SHARD_NAME = re.compile(r"\.data-(\d+)-of-(\d+)$")
TEMP_NAME = re.compile(r"^model\.ckpt-\d+_temp$")  # a save under way, or one that was killed

# CheckpointState's fields (tensorflow/python/checkpoint/checkpoint_state.proto): two of
# strings, two of numbers.
STRING_FIELDS = ("model_checkpoint_path", "all_model_checkpoint_paths")
NUMBER_FIELDS = ("all_model_checkpoint_timestamps", "last_preserved_timestamp")
_SKIP = re.compile(r"(?:\s|#[^\n]*)*")  # whitespace and comments between fields
_FIELD = re.compile(r"(\w+)\s*:\s*")
_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"|\'((?:[^\'\\\n]|\\.)*)\'')
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")


def step_of(prefix: str) -> int:
    """42 of a checkpoint prefix .../model.ckpt-42."""
    return int(prefix.rsplit("-", 1)[1])


def _state(model_dir: str) -> Optional[Dict[str, List[str]]]:
    """{field: [values]} of model_dir's state file; None when it is missing, unreadable
    or garbage (text protobuf: `field: value` pairs, a string value may be several quoted
    pieces, a `,` or `;` may end a pair, `#` starts a comment)."""
    try:
        with open(os.path.join(model_dir, STATE_FILE), encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    fields: Dict[str, List[str]] = {}
    at = _SKIP.match(text).end()
    while at < len(text):
        field = _FIELD.match(text, at)
        if not field or field.group(1) not in STRING_FIELDS + NUMBER_FIELDS:
            return None
        at, pieces = field.end(), []
        while True:
            string = _STRING.match(text, at)
            if not string:
                break
            quoted = string.group(1) if string.group(1) is not None else string.group(2)
            pieces.append(re.sub(r"\\(.)", r"\1", quoted))
            at = _SKIP.match(text, string.end()).end()
        if field.group(1) in NUMBER_FIELDS:
            number = _NUMBER.match(text, at)
            if not number:
                return None
            pieces, at = [number.group()], number.end()
        elif not pieces:
            return None
        fields.setdefault(field.group(1), []).append("".join(pieces))
        at = _SKIP.match(text, at).end()
        if text[at:at + 1] in (",", ";"):
            at = _SKIP.match(text, at + 1).end()
    return fields


def named_prefix(model_dir: str) -> Optional[str]:
    """The checkpoint prefix model_dir's state file names (joined with model_dir when
    relative), whether or not its files exist; None when there is no usable state file."""
    named = (_state(model_dir) or {}).get("model_checkpoint_path")
    if not named or not named[-1]:
        return None
    path = named[-1]
    return path if os.path.isabs(path) else os.path.join(model_dir, path)


def _step_in(prefix: Optional[str]) -> Optional[int]:
    m = re.search(r"-(\d+)$", prefix or "")
    return int(m.group(1)) if m else None


def named_step(model_dir: str) -> Optional[int]:
    """The step the state file names, whether or not its files exist (None: it names none,
    or a checkpoint without a step)."""
    return _step_in(named_prefix(model_dir))


def latest_prefix(model_dir: str) -> Optional[str]:
    """The checkpoint the state file names, if its index file exists (what
    tf.train.latest_checkpoint returns for a checkpoint Estimator wrote); else None."""
    prefix = named_prefix(model_dir)
    return prefix if prefix and os.path.isfile(prefix + ".index") else None


def latest_step(model_dir: str) -> Optional[int]:
    """The step of latest_prefix: the step a run in model_dir resumes from; None without one."""
    return _step_in(latest_prefix(model_dir))


def _names(model_dir: str) -> List[str]:
    return os.listdir(model_dir) if os.path.isdir(model_dir) else []


def index_steps(model_dir: str) -> List[int]:
    """The steps whose model.ckpt-N.index file exists, ascending (their shards unchecked)."""
    return sorted(int(m.group(1)) for m in map(INDEX_NAME.match, _names(model_dir)) if m)


def complete_checkpoints(model_dir: str) -> Dict[int, str]:
    """step -> prefix of every model.ckpt-N whose index and every data shard exist."""
    names = set(_names(model_dir))
    found = {}
    for name in names:
        m = INDEX_NAME.match(name)
        if not m:
            continue
        prefix = name[: -len(".index")]
        shards = [SHARD_NAME.search(n) for n in names if n.startswith(prefix + ".data-")]
        counts = {int(s.group(2)) for s in shards if s}
        if len(counts) == 1 and len([s for s in shards if s]) == counts.pop():
            found[int(m.group(1))] = os.path.join(model_dir, prefix)
    return found


def temp_dirs(model_dir: str) -> List[str]:
    """The model.ckpt-N_temp directories in model_dir: saves under way or killed."""
    return sorted(n for n in _names(model_dir)
                  if TEMP_NAME.match(n) and os.path.isdir(os.path.join(model_dir, n)))
