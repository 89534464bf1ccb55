"""TF_CONFIG: the one place it is read, checked and normalised before TensorFlow sees it.

Accepted roles: chief (or its old name "master"), worker, ps, evaluator. The
evaluator is not a training task: it is removed from the cluster that training
tasks hand to TensorFlow (MultiWorkerMirroredStrategy would otherwise count it),
and the evaluator itself runs without a strategy. Kubeflow's TFJob operator puts
every replica type, the evaluator included, into `cluster`; both forms work.
"""
import errno
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

from estimator_dist.distribute import specs
from estimator_dist.errors import UserError

TF_CONFIG = "TF_CONFIG"
ROLES = ("chief", "worker", "ps", "evaluator")
CLUSTER_STRATEGIES = specs.tf_config_strategies()
NOTE = " (TF_CONFIG environment variable)"
RPC_LAYERS = ("grpc",)


@dataclass(frozen=True)
class ClusterSpec:
    """A validated TF_CONFIG."""

    cluster: Mapping[str, List[str]]
    task_type: str
    task_index: int
    extra: Mapping[str, object] = field(default_factory=dict)

    @property
    def num_workers(self) -> int:
        """Training tasks: the chief plus the workers."""
        return len(self.cluster.get("chief", ())) + len(self.cluster.get("worker", ()))

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get("ps", ()))

    @property
    def is_chief(self) -> bool:
        return self.task_type == "chief"

    @property
    def is_evaluator(self) -> bool:
        return self.task_type == "evaluator"

    @property
    def has_evaluator(self) -> bool:
        return bool(self.cluster.get("evaluator"))

    @property
    def is_distributed(self) -> bool:
        return self.num_workers > 1 or self.num_ps > 0

    def for_tensorflow(self) -> Dict[str, object]:
        """The TF_CONFIG TensorFlow should see for this task."""
        cluster = {k: list(v) for k, v in self.cluster.items() if k != "evaluator"}
        return {**self.extra, "cluster": cluster,
                "task": {"type": self.task_type, "index": self.task_index}}


def _fail(field_name, value, allowed):
    raise UserError(f"TF_CONFIG {field_name} {value!r}: {allowed}{NOTE}")


def _addresses(cluster) -> Dict[str, List[str]]:
    if not isinstance(cluster, dict) or not cluster:
        _fail("'cluster'", cluster, "must be a non-empty mapping of task type -> list of host:port")
    out = {}
    for task_type, addresses in cluster.items():
        name = "chief" if task_type == "master" else task_type
        if name not in ROLES:
            _fail("cluster key", task_type, f"is not a task type; allowed: {', '.join(ROLES)} "
                                            f"(or 'master' for chief)")
        if name in out:
            _fail("cluster", cluster, "has both 'chief' and 'master'; give one chief")
        if isinstance(addresses, dict):  # TF accepts sparse {index: address}
            if not all(isinstance(k, str) and k.isdigit() for k in addresses):
                _fail(f"cluster['{task_type}']", addresses,
                      "as a mapping must map task indices ('0', '1', ...) to 'host:port'")
            addresses = [addresses[k] for k in sorted(addresses, key=int)]
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            _fail(f"cluster['{task_type}']", addresses, "must be a list of 'host:port' strings")
        for address in addresses:
            _check_address(task_type, address)
        out[name] = list(addresses)
    return out


def _check_address(task_type: str, address: str):
    """'host:port' with a host and a port of 1-65535 (TensorFlow's server hung on port 0 or
    an empty host, ignoring SIGTERM, and failed with a traceback on a port it could not parse)."""
    host, _, port = address.rpartition(":")
    if not host or any(c.isspace() for c in host) or not port.isdigit() or \
            not 1 <= int(port) <= 65535:
        _fail(f"address in cluster['{task_type}']", address,
              "must be 'host:port' with a host and a port of 1-65535, e.g. '10.0.0.2:2222'")


def parse(text: str) -> ClusterSpec:
    """Parse and check a TF_CONFIG JSON string; raise UserError naming the field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"TF_CONFIG is not valid JSON ({e.msg} at line {e.lineno} column "
                        f"{e.colno}){NOTE}") from None
    except RecursionError:
        raise UserError(f"TF_CONFIG nests its JSON too deeply to read; give an object with "
                        f"'cluster' and 'task'{NOTE}") from None
    if not isinstance(data, dict):
        _fail("", data, "must be a JSON object with 'cluster' and 'task'")
    cluster = _addresses(data.get("cluster"))
    task = data.get("task")
    if not isinstance(task, dict) or "type" not in task:
        _fail("'task'", task, "must be an object with 'type' and 'index', e.g. "
                              "{\"type\": \"worker\", \"index\": 0}")
    task_type = "chief" if task["type"] == "master" else task["type"]
    if task_type not in ROLES:
        _fail("task type", task["type"], f"is not one of {', '.join(ROLES)} (or 'master')")
    index = task.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        _fail("task index", index, "must be a whole number >= 0")
    chiefs = len(cluster.get("chief", ()))
    if chiefs != 1:
        _fail("cluster chief count", chiefs, "must be exactly 1 (a 'chief' or 'master' list with "
                                             "one address)")
    if task_type == "evaluator" and index != 0:
        _fail("evaluator index", index, "must be 0: there is one evaluator")
    if len(cluster.get("evaluator", ())) > 1:
        _fail("cluster evaluator count", len(cluster["evaluator"]), "must be at most 1")
    in_cluster = len(cluster.get(task_type, ()))
    if task_type != "evaluator" and index >= in_cluster:
        _fail(f"task index {index} for type", task_type,
              f"is out of range: the cluster has {in_cluster} {task_type} task(s)")
    extra = {k: v for k, v in data.items() if k not in ("cluster", "task")}
    if extra.get("rpc_layer", "grpc") not in RPC_LAYERS:
        _fail("rpc_layer", extra["rpc_layer"], f"must be one of {', '.join(RPC_LAYERS)} (the "
                                               f"only one TensorFlow 2.15 has), or left out")
    return ClusterSpec(cluster=cluster, task_type=task_type, task_index=index, extra=extra)


def check_strategy(spec: ClusterSpec, strategy: str, flags: bool = False):
    """A strategy must fit the cluster: say which one does when it does not.

    flags: the cluster comes from `cluster`/`tfjob` --workers and --ps, so the fixes
    name those flags rather than TF_CONFIG.
    """
    if strategy == "horovod":
        raise UserError("--strategy horovod does not use TF_CONFIG, but it is set; unset it and "
                        "start the ranks with 'estimator-dist cluster --launcher horovod' (or "
                        "horovodrun --gloo)")
    has = "--ps is 0" if flags else "TF_CONFIG's cluster has none"
    add_ps = "add --ps 1 (or more)" if flags else "add \"ps\": [\"host:port\"]"
    shape = (f"--workers {spec.num_workers} and --ps {spec.num_ps} make a cluster" if flags
             else f"TF_CONFIG describes a cluster of {spec.num_workers} worker(s) and "
                  f"{spec.num_ps} ps")
    if strategy == "parameter_server" and not spec.num_ps:
        raise UserError(f"--strategy parameter_server needs ps tasks, but {has}; {add_ps} or use "
                        f"--strategy multi_worker_mirrored")
    if strategy == "multi_worker_mirrored" and spec.num_ps:
        raise UserError(f"--strategy multi_worker_mirrored takes no ps tasks, but "
                        f"{f'--ps is {spec.num_ps}' if flags else f'TF_CONFIG has {spec.num_ps}'}; "
                        f"use --strategy parameter_server or drop {'--ps' if flags else 'them'}")
    if strategy not in CLUSTER_STRATEGIES + ("none",) and spec.is_distributed:
        raise UserError(f"--strategy {strategy} runs on one machine, but {shape}; use "
                        f"{', '.join(CLUSTER_STRATEGIES)} (or none with ps tasks for async "
                        f"between-graph training)")
    if strategy == "none" and spec.num_workers > 1 and not spec.num_ps:
        raise UserError(f"--strategy none in a cluster of {spec.num_workers} workers and no ps would train "
                        f"them independently; use --strategy multi_worker_mirrored, "
                        f"parameter_server, or {add_ps} for async training")


def from_env(strategy: str, environ=os.environ) -> Optional[ClusterSpec]:
    """The validated TF_CONFIG of this process, or None when it is unset or empty."""
    text = environ.get(TF_CONFIG, "").strip()
    if not text:
        if strategy in CLUSTER_STRATEGIES:
            raise UserError(f"--strategy {strategy} needs TF_CONFIG describing the cluster; start "
                            f"the tasks with 'estimator-dist cluster' (or a TFJob) or set it")
        return None
    spec = parse(text)
    check_strategy(spec, strategy)
    return spec


def check_own_port(spec: ClusterSpec):
    """Refuse a task whose TF_CONFIG port another process holds, before TensorFlow's server
    tries it (it failed with a traceback, or "training failed", and gRPC's own log line).
    The evaluator runs no server."""
    if spec.task_type == "evaluator":
        return
    address = spec.cluster[spec.task_type][spec.task_index]
    port = int(address.rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            probe.bind(("", port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return  # e.g. no IPv4 here: left to TensorFlow
            raise UserError(f"TF_CONFIG task {spec.task_type}:{spec.task_index}: its port {port} "
                            f"({address}) is held by another process; stop it, or give this "
                            f"task a free port in TF_CONFIG's cluster") from None


def apply(spec: ClusterSpec, environ=os.environ):
    """Hand TensorFlow the normalised TF_CONFIG (chief for master, no evaluator)."""
    environ[TF_CONFIG] = json.dumps(spec.for_tensorflow())


class local_only:  # noqa: N801 - a context manager that reads like a function
    """Hide TF_CONFIG while a RunConfig is built for single-process work (e.g. an export)."""

    def __init__(self, environ=os.environ):
        self._environ = environ
        self._saved = None

    def __enter__(self):
        self._saved = self._environ.pop(TF_CONFIG, None)
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            self._environ[TF_CONFIG] = self._saved
        return False
