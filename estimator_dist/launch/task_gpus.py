"""Which GPUs each task of a local cluster gets (CUDA_VISIBLE_DEVICES), decided before it starts.

Every task of `estimator-dist cluster` runs on this machine. Left alone, each TensorFlow
process maps every GPU and takes memory on each: chief, workers, evaluator and ps shared
every GPU and ran out of memory together, and a ps task's variables landed on its GPU:0.
Training tasks (chief, workers) get disjoint slices of the GPUs, `--num_devices` each (0:
an even share); ps tasks none (their variables live on their CPU); the evaluator none,
or `--evaluator_gpus` of its own. No TensorFlow import: decided before any task runs.
"""
import os
import re
from typing import Dict, List, Mapping, Sequence

from estimator_dist.errors import UserError
from estimator_dist.distribute import role as role_lib
from estimator_dist.launch.layout import kind_of


def visible_gpus(environ: Mapping[str, str] = os.environ, dev_dir: str = "/dev") -> List[str]:
    """The GPU ids this launcher may hand out: CUDA_VISIBLE_DEVICES when set (empty or -1:
    none), else one per /dev/nvidiaN device file."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [g.strip() for g in listed.split(",") if g.strip()]
        return [] if not ids or ids[0] == "-1" else ids
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return []
    return sorted((n[len("nvidia"):] for n in names if re.fullmatch(r"nvidia\d+", n)), key=int)


def assign(names: Sequence[str], gpus: Sequence[str], num_devices: int,
           evaluator_gpus: int = 0) -> Dict[str, str]:
    """Task name (chief:0, worker:1, ps:0, evaluator:0) -> its CUDA_VISIBLE_DEVICES; {} on a
    machine without GPUs (nothing to divide)."""
    if not gpus:
        if evaluator_gpus:
            raise UserError(f"--evaluator_gpus {evaluator_gpus}: this machine has no GPU; "
                            f"leave it out")
        return {}
    training = [n for n in names if role_lib.TASK_TRAITS[kind_of(n)].trains]
    has_evaluator = any(role_lib.TASK_TRAITS[kind_of(n)].evaluates for n in names)
    if evaluator_gpus and not has_evaluator:
        raise UserError(f"--evaluator_gpus {evaluator_gpus}: there is no evaluator task; add "
                        f"--evaluator or leave it out")
    spare = len(gpus) - evaluator_gpus
    per_task = num_devices or (spare // len(training) if training else 0)
    if per_task < 1 or per_task * len(training) > spare:
        raise UserError(f"{len(training)} training task(s) x {num_devices or 'an even share of'} "
                        f"GPU(s) each{f' + {evaluator_gpus} for the evaluator' if evaluator_gpus else ''}"
                        f" need more than this machine's {len(gpus)} GPU(s) "
                        f"({','.join(gpus)}); ask for fewer workers or --num_devices")
    free = iter(gpus)
    out = {}
    for name in names:
        traits = role_lib.TASK_TRAITS[kind_of(name)]
        count = per_task if traits.trains else evaluator_gpus if traits.evaluates else 0
        out[name] = ",".join(next(free) for _ in range(count))
    return out
