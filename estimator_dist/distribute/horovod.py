"""Horovod ranks: the import check, `hvd.init()`, this process's rank, device and session.

A Horovod job is N copies of the same `train` command, one per rank, started by
`estimator-dist cluster --launcher horovod` (or horovodrun) with HOROVOD_RANK,
HOROVOD_SIZE, ... and a gloo rendezvous address in the environment. Without
them `--strategy horovod` runs as one rank (size 1), as a Horovod script does
when started without a launcher, and says so in its first line.

Rank 0 writes everything (checkpoints, summaries, config.yaml, exports) and
evaluates; the other ranks train in a private scratch model_dir and get their
variables from rank 0 by broadcast (see horovod_train.py).
"""
import os
from dataclasses import dataclass
from typing import Mapping, Optional

import tensorflow as tf

from estimator_dist.distribute import devices as devices_lib
from estimator_dist.errors import UserError

from estimator_dist.distribute.horovod_setup import INSTALL, RANK_VARIABLES, RENDEZVOUS, not_installed  # noqa: F401,E501


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in the Horovod job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    launched: bool  # started by a Horovod launcher (else one rank on its own)

    @property
    def is_root(self) -> bool:
        return self.rank == 0


PACKAGE = "horovod"  # the module name; a missing dependency of it is named on its own

# How the gradients cross between ranks (docs/horovod.md, "Speed"):
# Horovod's background thread starts the all-reduces of the tensors every rank has ready
# once per cycle, by default every 1 ms, so a gradient waits up to a cycle; and it
# negotiates and all-reduces each gradient on its own as the backward pass makes it. On
# one-core CPU ranks (the bench, 2 ranks) a 0.2 ms cycle and one grouped all-reduce per step
# took the MLP's scaling from 0.50 to 0.62 and ResNet-20's from 0.88 to 0.92-0.95. The user's
# HOROVOD_CYCLE_TIME wins; ESTIMATOR_DIST_HOROVOD_GROUPS sets the groups (0: Horovod's own).
CYCLE_TIME_MS = "0.2"
GROUPS_VARIABLE = "ESTIMATOR_DIST_HOROVOD_GROUPS"


def require():
    """horovod.tensorflow, or a one-line UserError saying how to install it."""
    try:
        import horovod.tensorflow as hvd
    except ModuleNotFoundError as e:
        if (e.name or PACKAGE).split(".")[0] == PACKAGE:
            raise not_installed() from None
        raise UserError(f"--strategy horovod: Horovod needs the module '{e.name}'; pip install "
                        f"{e.name} (or reinstall Horovod: {INSTALL})") from None
    except Exception as e:  # noqa: BLE001 - a build without TF, or against another TF: any error
        raise UserError(f"--strategy horovod: Horovod cannot load its TensorFlow ops ({e}); "
                        f"reinstall it against this TensorFlow: {INSTALL}") from None
    if not hvd.gloo_built():
        raise UserError(f"--strategy horovod: this Horovod was built without gloo; {INSTALL}")
    return hvd


def _int_env(environ: Mapping[str, str], name: str) -> int:
    text = environ[name]
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"{name}={text!r}: must be a whole number (set by the Horovod "
                        f"launcher; start the job with 'estimator-dist cluster --launcher "
                        f"horovod')") from None
    return value


def check_environment(environ: Mapping[str, str] = os.environ) -> bool:
    """True when a Horovod launcher started this process; a partial environment is an error."""
    present = [name for name in RANK_VARIABLES if environ.get(name, "").strip()]
    if not present:
        return False
    missing = [name for name in RANK_VARIABLES if name not in present]
    if missing:
        raise UserError(f"the environment sets {', '.join(present)} but not {', '.join(missing)}; "
                        f"a Horovod launcher sets all of them: start the job with "
                        f"'estimator-dist cluster --launcher horovod' or horovodrun")
    rank, size = _int_env(environ, "HOROVOD_RANK"), _int_env(environ, "HOROVOD_SIZE")
    if size < 1 or not 0 <= rank < size:
        raise UserError(f"HOROVOD_RANK={rank} with HOROVOD_SIZE={size}: the rank must be in "
                        f"0..size-1; start the job with 'estimator-dist cluster --launcher "
                        f"horovod'")
    if size > 1 and not environ.get(RENDEZVOUS, "").strip():
        # Without a rendezvous address gloo waits forever for the other ranks.
        raise UserError(f"HOROVOD_SIZE={size} but {RENDEZVOUS} is not set; this build of Horovod "
                        f"runs over gloo: start the job with 'estimator-dist cluster --launcher "
                        f"horovod' or 'horovodrun --gloo'")
    return True


def init(environ: Mapping[str, str] = os.environ) -> Ranks:
    """`hvd.init()` (idempotent) and this process's place in the job."""
    launched = check_environment(environ)
    gradient_groups(environ)  # a bad value is refused before Horovod starts
    hvd = require()
    os.environ.setdefault("HOROVOD_CYCLE_TIME", CYCLE_TIME_MS)  # read by hvd.init()
    hvd.init()
    ranks = Ranks(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                  local_size=hvd.local_size(), launched=launched)
    pin_gpu(ranks)
    return ranks


def pin_gpu(ranks: Ranks, gpus: Optional[list] = None):
    """This rank's GPU (its local rank's) as the process's only one, before any TF op runs:
    the first eager op (agree_on's broadcast) starts the runtime, which maps every GPU."""
    gpus = devices_lib.physical_gpus() if gpus is None else gpus
    if gpus:
        check_gpus(ranks, len(gpus))
        devices_lib.claim_gpus([ranks.local_rank], gpus)


def devices(num_devices: int, gpus: Optional[int] = None) -> devices_lib.Devices:
    """One device per rank: a GPU (the local rank's, the only one pin_gpu left visible) or
    one CPU."""
    if num_devices > 1:
        raise UserError(f"--strategy horovod runs one device per rank, got --num_devices "
                        f"{num_devices}; start more ranks instead (cluster --launcher horovod "
                        f"--workers N)")
    gpus = devices_lib.gpu_count() if gpus is None else gpus
    return devices_lib.Devices(("/gpu:0",) if gpus else ("/cpu:0",), "GPU" if gpus else "CPU")


def gradient_groups(environ: Mapping[str, str] = os.environ,
                    gpus: Optional[int] = None) -> Optional[int]:
    """`hvd.DistributedOptimizer`'s `groups`: how many grouped all-reduces carry a step's
    gradients. ESTIMATOR_DIST_HOROVOD_GROUPS if set (0: None, Horovod's own all-reduce per
    gradient); else one on a CPU rank, Horovod's own on a GPU rank, where an all-reduce
    started early overlaps the rest of the backward pass."""
    text = environ.get(GROUPS_VARIABLE)
    if text is None:
        return None if (devices_lib.gpu_count() if gpus is None else gpus) else 1
    if not text.isdigit():
        raise UserError(f"{GROUPS_VARIABLE}={text}: must be a whole number, 0 or more (0: "
                        f"Horovod's own all-reduce per gradient, N: N grouped all-reduces a "
                        f"step); unset it for the default")
    return int(text) or None


def check_gpus(ranks: Ranks, gpus: int):
    if gpus and ranks.local_size > gpus:
        raise UserError(f"{ranks.local_size} Horovod ranks on this host but {gpus} GPU(s); start "
                        f"at most {gpus} ranks per host (one GPU each)")


def session_config(base: tf.compat.v1.ConfigProto, devs: devices_lib.Devices,
                   ranks: Ranks, cores: int) -> tf.compat.v1.ConfigProto:
    """The session of one rank: its share of the host's cores (a GPU rank sees only its own
    GPU already, pin_gpu)."""
    config = tf.compat.v1.ConfigProto()
    config.CopyFrom(base)
    if devs.kind == "CPU" and ranks.local_size > 1:
        # N ranks share the host's cores; each using all of them oversubscribes the
        # CPU (and gloo's threads) N times over.
        config.intra_op_parallelism_threads = max(1, cores // ranks.local_size)
        config.inter_op_parallelism_threads = 2
    return config


def agree_on(value: Optional[int]) -> Optional[int]:
    """Rank 0's `value` on every rank (None travels as -1): one eager broadcast.

    Used for the global step to resume from, read by rank 0 alone: a rank that
    decided for itself whether training is already done could wait forever for
    the others (horovod#346, #1581).
    """
    hvd = require()
    agreed = int(hvd.broadcast(tf.constant(-1 if value is None else value, tf.int64), root_rank=0,
                               name="estimator_dist_agree").numpy())
    return None if agreed < 0 else agreed
