"""A local cluster's layout: its tasks' names (chief:0, worker:1, ps:0, evaluator:0), the
kind each name says, and the TF_CONFIG each task gets (no TensorFlow).

The names are TF_CONFIG's `type:index`; the chief counts as one of the workers. The
TF_CONFIGs are laid out as Kubeflow's operator writes them: every task, the evaluator
included, is in `cluster`, at a loopback port of its own (launch/ports.py).
"""
import json
from typing import Dict, List, Optional

from estimator_dist.launch.ports import LOOPBACK

MAX_LOCAL_TASKS = 32  # processes of one local cluster (each holds a TensorFlow runtime)


def task_names(workers: int, ps: int, evaluator: bool) -> List[str]:
    """chief:0, worker:0..workers-2, ps:0..ps-1, evaluator:0 (workers counts the chief)."""
    names = ["chief:0"] + [f"worker:{i}" for i in range(workers - 1)]
    names += [f"ps:{i}" for i in range(ps)]
    return names + (["evaluator:0"] if evaluator else [])


def kind_of(task_name: str) -> str:
    """'worker' of the task named 'worker:1' (TF_CONFIG's task type)."""
    return task_name.split(":")[0]


def make_tf_configs(names: List[str], ports: List[int],
                    only: Optional[str] = None) -> Dict[str, str]:
    """TF_CONFIG per task (or of the task `only`), laid out as Kubeflow's operator does
    (evaluator in the cluster)."""
    cluster: Dict[str, List[str]] = {}
    for name, port in zip(names, ports):
        cluster.setdefault(kind_of(name), []).append(f"{LOOPBACK}:{port}")
    configs = {}
    for name in [only] if only else names:
        kind, index = name.split(":")
        configs[name] = json.dumps({"cluster": cluster, "task": {"type": kind, "index": int(index)},
                                    "environment": "cloud"})
    return configs
