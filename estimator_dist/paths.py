"""Paths as the user meant them: `~` and `$VARS` expanded, storage URLs refused.

A quoted '~/x' or '$HOME/x', and --flag=~/x (bash expands no `~` after `=`), reached the
commands as is and created directories literally named `~` and `$HOME`. Here they are
expanded, and each expansion is said on stderr (predict may write its CSV to stdout); an
unset variable or unknown user is refused naming it. A storage URL (s3://, gs://, ...) is
refused: TensorFlow would write checkpoints there, but a run's own files and checks (the
model_dir lock, config.yaml, the checkpoint and disk-full guards, whole-or-nothing renames)
work on file system paths only, and TensorFlow 2.15 has no s3:// at all (docs/cluster.md).
No TensorFlow import.
"""
import os
import re
import sys
from typing import Optional

from estimator_dist.errors import UserError

URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
VARIABLE = re.compile(r"\$(?:(\w+)|\{([^}]*)\})")
MOUNTS = {"s3": "mountpoint-s3 or s3fs", "gs": "gcsfuse (Cloud Storage FUSE)"}
# SageMaker's TensorFlow estimator appends `--model_dir s3://OUTPUT/JOB/model` to the entry
# point's arguments unless it is created with model_dir=False; its containers set these.
SAGEMAKER_ENV = ("SM_TRAINING_ENV", "SM_CURRENT_HOST")


def mounted_path_fix(scheme: str, rest: str) -> str:
    """The fix for a storage URL, in the words of the platform it likely came from."""
    if scheme == "gs":
        # Vertex AI custom training mounts every bucket the job may read at /gcs/BUCKET.
        return (f"give /gcs/{rest} (Vertex AI mounts buckets there with Cloud Storage FUSE), or "
                f"mount the bucket elsewhere ({MOUNTS['gs']}, or a Kubernetes volume) and give "
                f"that path")
    if scheme == "s3" and any(name in os.environ for name in SAGEMAKER_ENV):
        return ("on SageMaker create the TensorFlow estimator with model_dir=False and "
                "checkpoint_s3_uri=s3://..., and give --model_dir under /opt/ml/checkpoints "
                "(SageMaker syncs it to that URI and restores it on a restart)")
    tool = MOUNTS.get(scheme, "the storage's FUSE driver")
    return f"mount the bucket ({tool}, or a Kubernetes volume) and give the mounted path"


def check_not_url(flag: str, value: str):
    """UserError for a storage URL: the fix is a mounted path."""
    found = URL.match(value or "")
    if not found:
        return
    scheme = found.group(1).lower()
    missing = " (TensorFlow 2.15 has no s3:// file system)" if scheme == "s3" else ""
    raise UserError(f"{flag} {value}: a storage URL{missing}; estimator-dist keeps a run's files "
                    f"and checks (its lock, config.yaml, checkpoint and disk-full guards) on file "
                    f"system paths only; {mounted_path_fix(scheme, value[found.end():])}")


def expand(flag: str, value: Optional[str]) -> Optional[str]:
    """`value` with a leading ~ or ~user and every $NAME / ${NAME} expanded; a URL, an unset
    variable or an unknown user is a UserError naming it. None and '' stay."""
    if not value:
        return value
    check_not_url(flag, value)
    result = value
    if result.startswith("~"):
        result = os.path.expanduser(result)
        if result.startswith("~"):
            user = result[1:].split("/", 1)[0]
            raise UserError(f"{flag} {value}: no user '{user}' to expand ~{user} for; give the "
                            f"path itself")
    for found in VARIABLE.finditer(result):
        name = found.group(1) or found.group(2)
        if name not in os.environ:
            raise UserError(f"{flag} {value}: the environment variable {name} is not set; set "
                            f"it, or give the path itself")
    result = VARIABLE.sub(lambda m: os.environ[m.group(1) or m.group(2)], result)
    check_not_url(flag, result)
    return result


def expanded(flag: str, value: Optional[str], where: str = "") -> Optional[str]:
    """expand(), saying on stderr what a changed value became (`where`: e.g. 'config file
    run.yaml: ')."""
    result = expand(flag, value)
    if result != value:
        print(f"estimator-dist: {where}{flag} {value} is {result} (~ and $VARS expanded)",
              file=sys.stderr)
    return result


def expand_args(args, flags):
    """expanded() for each (dest, flag) of an argparse namespace (a value or a list of them,
    for a repeated flag), in place."""
    for dest, flag in flags:
        value = getattr(args, dest, None)
        setattr(args, dest, [expanded(flag, v) for v in value] if isinstance(value, list)
                else expanded(flag, value))
