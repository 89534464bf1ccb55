"""TF_CONFIG: the one place it is read, checked and normalised before TensorFlow sees it.

Accepted roles: chief (or its old name "master"), worker, ps, evaluator. The
evaluator is not a training task: it is removed from the cluster that training
tasks hand to TensorFlow (MultiWorkerMirroredStrategy would otherwise count it),
and the evaluator itself runs without a strategy. Kubeflow's TFJob operator puts
every replica type, the evaluator included, into `cluster`; both forms work.

The platforms' layouts become one normalised ClusterSpec here (docs/cluster.md):
- workers only, no chief (SageMaker's MultiWorkerMirrored, TensorFlow's MWMS tutorial):
  worker 0 is the chief, as TensorFlow treats it;
- `master` beside ps tasks (SageMaker's parameter servers, started by its toolkit from
  the same cluster): TensorFlow keeps the name `master` (chief_name), which those
  servers know; elsewhere `master` becomes `chief`;
- an evaluator outside `cluster` (AI Platform and Vertex AI never list it): the
  platform's job description says it exists (evaluator_outside).
"""
import errno
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

from estimator_dist.distribute import slurm, specs
from estimator_dist.errors import UserError

TF_CONFIG = "TF_CONFIG"
# Vertex AI's worker pools by position (workerpool0 chief, 1 workers, 2 ps, 3 evaluators),
# in every replica's CLUSTER_SPEC, which lists all four.
VERTEX_CLUSTER_SPEC = "CLUSTER_SPEC"
VERTEX_EVALUATOR_POOL = "workerpool3"
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
    # The chief's job name in TensorFlow's servers: "master" when TF_CONFIG names it so
    # beside ps tasks, which may be servers started outside from the same TF_CONFIG.
    chief_name: str = "chief"
    # An evaluator task that `cluster` does not list (AI Platform, Vertex AI).
    evaluator_outside: bool = False

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
        return bool(self.cluster.get("evaluator")) or self.evaluator_outside

    @property
    def is_distributed(self) -> bool:
        return self.num_workers > 1 or self.num_ps > 0

    @property
    def trains_alone(self) -> bool:
        """One training task and no ps: a one-machine job (Vertex AI and AI Platform set
        TF_CONFIG for those too)."""
        return not self.is_distributed

    @property
    def chief_evaluates(self) -> bool:
        """Estimator's `master` evaluates every checkpoint and runs the exporters itself
        (its legacy layout; it has no evaluator task)."""
        return self.chief_name == "master"

    @property
    def task_name(self) -> str:
        """'worker:0': how a Slurm step's end markers name this task (guards/step_end.py)."""
        return f"{self.task_type}:{self.task_index}"

    @property
    def worker_names(self) -> List[str]:
        """The workers other than the chief, as task_name names them."""
        return [f"worker:{i}" for i in range(len(self.cluster.get("worker", ())))]

    @property
    def marks_its_end(self) -> bool:
        """In a Slurm step every task but a ps marks its end (a ps ends after them)."""
        return self.task_type != "ps"

    def for_tensorflow(self) -> Dict[str, object]:
        """The TF_CONFIG TensorFlow should see for this task."""
        def name(task_type):
            return self.chief_name if task_type == "chief" else task_type

        cluster = {name(k): list(v) for k, v in self.cluster.items() if k != "evaluator"}
        return {**self.extra, "cluster": cluster,
                "task": {"type": name(self.task_type), "index": self.task_index}}


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


def parse(text: str, vertex_cluster_spec: str = "") -> ClusterSpec:
    """Parse and check a TF_CONFIG JSON string; raise UserError naming the field.

    vertex_cluster_spec: Vertex AI's CLUSTER_SPEC (it lists the evaluator pool), if set.
    """
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
    in_cluster = len(cluster.get(task_type, ()))
    if task_type != "evaluator" and index >= in_cluster:
        _fail(f"task index {index} for type", task_type,
              f"is out of range: the cluster has {in_cluster} {task_type} task(s)")
    cluster, task_type, index = _chief_from_workers(cluster, task_type, index)
    chiefs = len(cluster.get("chief", ()))
    if chiefs != 1:
        _fail("cluster chief count", chiefs, "must be exactly 1 (a 'chief' or 'master' list with "
                                             "one address), or 0 beside 'worker' tasks (worker 0 "
                                             "is then the chief)")
    if task_type == "evaluator" and index != 0:
        _fail("evaluator index", index, "must be 0: there is one evaluator")
    if len(cluster.get("evaluator", ())) > 1:
        _fail("cluster evaluator count", len(cluster["evaluator"]), "must be at most 1")
    extra = {k: v for k, v in data.items() if k not in ("cluster", "task")}
    if extra.get("rpc_layer", "grpc") not in RPC_LAYERS:
        _fail("rpc_layer", extra["rpc_layer"], f"must be one of {', '.join(RPC_LAYERS)} (the "
                                               f"only one TensorFlow 2.15 has), or left out")
    outside = not cluster.get("evaluator") and _evaluator_outside(data, vertex_cluster_spec)
    named_master = "master" in data["cluster"]
    return ClusterSpec(cluster=cluster, task_type=task_type, task_index=index, extra=extra,
                       chief_name=_chief_name(named_master, cluster, outside),
                       evaluator_outside=outside)


def _chief_from_workers(cluster, task_type: str, index: int):
    """Workers only, no chief (SageMaker's MultiWorkerMirrored, TensorFlow's MWMS tutorial):
    worker 0 is the chief, as TensorFlow's MultiWorkerMirroredStrategy treats it. Every task
    renames it alike, so TensorFlow sees one consistent chief + workers cluster (Estimator
    needs a chief)."""
    if cluster.get("chief") or not cluster.get("worker"):
        return cluster, task_type, index
    workers = cluster["worker"]
    renamed = {k: v for k, v in cluster.items() if k != "worker"}
    renamed["chief"] = workers[:1]
    if workers[1:]:
        renamed["worker"] = workers[1:]
    if task_type == "worker":
        task_type, index = ("chief", 0) if index == 0 else ("worker", index - 1)
    return renamed, task_type, index


def _chief_name(named_master: bool, cluster, evaluator: bool) -> str:
    """The chief's job name for TensorFlow. SageMaker's toolkit starts the ps servers itself
    from a cluster that says `master`: renamed, the chief was unknown to them ("No worker
    known as /job:chief" at step 1). Estimator keeps `master` (its legacy layout, whose
    master evaluates; it takes no evaluator task, so with one the chief is `chief`)."""
    if named_master and cluster.get("ps") and not evaluator and not cluster.get("evaluator"):
        return "master"
    return "chief"


def _evaluator_outside(data, vertex_cluster_spec: str) -> bool:
    """Whether an evaluator task exists that `cluster` does not list: AI Platform's TF_CONFIG
    "job" is the job's TrainingInput (its fields by their proto names, as `scale_tier`,
    `package_uris`), whose `evaluator_count` counts them; Vertex AI's CLUSTER_SPEC lists
    every worker pool, the fourth (`workerpool3`) the evaluators."""
    job = data.get("job")
    if isinstance(job, dict):
        count = job.get("evaluator_count", 0)
        if isinstance(count, str) and count.isdigit():
            count = int(count)
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            return True
    try:
        pools = json.loads(vertex_cluster_spec).get("cluster", {}) if vertex_cluster_spec else {}
    except (ValueError, AttributeError, RecursionError):
        return False  # a malformed CLUSTER_SPEC tells nothing; TF_CONFIG decides the run
    return isinstance(pools, dict) and bool(pools.get(VERTEX_EVALUATOR_POOL))


def check_strategy(spec: ClusterSpec, strategy: str, flags: bool = False):
    """A strategy must fit the cluster: say which one does when it does not.

    flags: the cluster comes from `cluster`/`tfjob` --workers and --ps, so the fixes
    name those flags rather than TF_CONFIG.
    """
    wants = specs.spec(strategy)
    if wants.uses_horovod:
        raise UserError(f"--strategy {strategy} does not use TF_CONFIG, but it is set; unset it "
                        f"and start the ranks with 'estimator-dist cluster --launcher horovod' "
                        f"(or horovodrun --gloo)")
    has = "--ps is 0" if flags else "TF_CONFIG's cluster has none"
    add_ps = "add --ps 1 (or more)" if flags else "add \"ps\": [\"host:port\"]"
    shape = (f"--workers {spec.num_workers} and --ps {spec.num_ps} make a cluster" if flags
             else f"TF_CONFIG describes a cluster of {spec.num_workers} worker(s) and "
                  f"{spec.num_ps} ps")
    if not wants.chief_may_be_master and spec.chief_name == "master":
        raise UserError(f"--strategy {strategy}: TF_CONFIG names the chief 'master' beside "
                        "ps tasks (SageMaker's parameter-server layout: its ps servers, started "
                        "from that cluster, know the chief by that name), and TensorFlow's "
                        "ParameterServerStrategy takes only 'chief'; use --strategy none "
                        "(Estimator's own asynchronous training on these ps tasks)")
    if wants.cluster_ps == specs.PS_NEEDED and not spec.num_ps:
        raise UserError(f"--strategy {strategy} needs ps tasks, but {has}; {add_ps} or use "
                        f"--strategy multi_worker_mirrored")
    if wants.cluster_ps == specs.PS_REFUSED and spec.num_ps:
        raise UserError(f"--strategy {strategy} takes no ps tasks, but "
                        f"{f'--ps is {spec.num_ps}' if flags else f'TF_CONFIG has {spec.num_ps}'}; "
                        f"use --strategy parameter_server or drop {'--ps' if flags else 'them'}")
    if wants.cluster_ps == specs.ONE_MACHINE and spec.is_distributed:
        raise UserError(f"--strategy {strategy} runs on one machine, but {shape}; use "
                        f"{', '.join(CLUSTER_STRATEGIES)} (or none with ps tasks for async "
                        f"between-graph training)")
    if wants.cluster_ps == specs.PS_FOR_WORKERS and spec.num_workers > 1 and not spec.num_ps:
        raise UserError(f"--strategy {strategy} in a cluster of {spec.num_workers} workers and no "
                        f"ps would train them independently; use --strategy "
                        f"multi_worker_mirrored, parameter_server, or {add_ps} for async training")


def from_env(strategy: str, environ=os.environ, ps: int = 0,
             evaluator: bool = False) -> Optional[ClusterSpec]:
    """The validated TF_CONFIG of this process, or None when it is unset or empty.

    Under an srun step with no TF_CONFIG, a multi-process strategy takes its cluster from the
    step (slurm.py): ps and evaluator say how many of its last tasks are parameter servers
    and whether the last is an evaluator (train's --ps and --evaluator, for Slurm only).
    """
    text = environ.get(TF_CONFIG, "").strip()
    from_slurm = not text and strategy in CLUSTER_STRATEGIES and slurm.in_step(environ)
    if (ps or evaluator) and not from_slurm:
        flag = f"--ps {ps}" if ps else "--evaluator"
        if text:
            where = "TF_CONFIG describes the cluster; drop it"
        elif not slurm.in_step(environ):
            where = f"outside srun run 'estimator-dist cluster {flag}' (or a TFJob)"
        else:
            where = f"give --strategy {' or '.join(CLUSTER_STRATEGIES)}"
        raise UserError(f"{flag}: train takes it only in an srun step (Slurm), for its last "
                        f"tasks; {where}")
    if from_slurm:
        text = slurm.tf_config(environ, ps, evaluator)
    if not text:
        if strategy in CLUSTER_STRATEGIES:
            raise UserError(f"--strategy {strategy} needs TF_CONFIG describing the cluster; start "
                            f"the tasks with 'estimator-dist cluster' (or a TFJob, or srun: "
                            f"docs/slurm.md) or set it")
        return None
    spec = parse(text, environ.get(VERTEX_CLUSTER_SPEC, ""))
    check_strategy(spec, strategy, flags=from_slurm)
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


def apply(spec: Optional[ClusterSpec], environ=os.environ):
    """Hand TensorFlow the normalised TF_CONFIG (chief for master, no evaluator); None: no
    cluster, TensorFlow runs this process alone (a platform's TF_CONFIG for one machine made
    MirroredStrategy assert, CentralStorage fail, OneDevice place ops on /job:chief)."""
    if spec is None:
        environ.pop(TF_CONFIG, None)
    else:
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
