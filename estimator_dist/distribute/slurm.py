"""Slurm: an srun step's tasks as a cluster, read from the step's own variables.

`srun -n 2 estimator-dist train --strategy multi_worker_mirrored ...` starts the same command
as every task of a step; Slurm tells each which it is (SLURM_PROCID), where its peers run
(SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE) and, when the admin reserves ports for
steps (slurm.conf `MpiParams=ports=...`), which ports the step may use on each node
(SLURM_STEP_RESV_PORTS). This module turns that into the TF_CONFIG the `cluster` launcher
would write (tf_config.from_env reads it as one): task 0 is the chief, then the workers,
then `--ps N` parameter servers, then, with `--evaluator`, the evaluator.

Hosts are in Slurm's own order (the compressed list expanded as `scontrol show hostnames`
does: node9 before node10), tasks laid out block-wise (srun's default distribution): the
first node's tasks first. TensorFlow's SlurmClusterResolver sorted hosts as strings, so its
task 0 was not on Slurm's first node.

Ports: SLURM_STEP_RESV_PORTS when set (Slurm hands a step ports no other step on the node
holds). Without it, a block of ports derived from the job and step ids: two steps running on
one node at once collide only when their (job id x 16 + step id) fall into the same block of
PORT_BLOCKS, e.g. two jobs whose ids differ by a multiple of 625 (not impossible on a busy
cluster; the task then refuses to start, naming the held port). Ask the admin for
`MpiParams=ports=` to rule it out.

Imports no TensorFlow.
"""
import json
import os
import re
from typing import List, Mapping, Optional

from estimator_dist.errors import UserError

NOTE = " (Slurm step, srun)"
# Ports derived from the job id when Slurm reserves none: blocks of PORT_BLOCK ports in
# PORT_LOW..PORT_LOW + PORT_BLOCKS * PORT_BLOCK (clear of Linux's ephemeral range, 32768+,
# would be better, but 20000-32767 has too few blocks; gRPC holds its port from the start).
PORT_LOW = 20000
PORT_BLOCK = 64
PORT_BLOCKS = 625  # 20000..59999
STEP_VARIABLES = ("SLURM_STEP_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS",
                  "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")


def in_step(environ: Mapping[str, str] = os.environ) -> bool:
    """This process is a task of an srun step (a batch script's own shell is not)."""
    return all(environ.get(name) for name in STEP_VARIABLES)


def _fail(what: str, value, allowed: str):
    raise UserError(f"{what} {value!r}: {allowed}{NOTE}")


def _split_top(text: str) -> List[str]:
    """Split at the commas outside brackets: 'a[1-2],b' -> ['a[1-2]', 'b']."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _ranges(body: str) -> List[str]:
    """'1-3,07' -> ['1', '2', '3', '07']: zero padding kept as written (node[01-10])."""
    out = []
    for item in body.split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            _fail("SLURM_STEP_NODELIST range", item, "must be N or N-M")
        if not high:
            out.append(low)
            continue
        width = len(low) if low.startswith("0") or len(low) == len(high) else 0
        out.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return out


def expand_hostnames(nodelist: str) -> List[str]:
    """A compressed Slurm host list, expanded as `scontrol show hostnames` does, in its
    order: 'node[9-10],gpu[01-02]' -> node9, node10, gpu01, gpu02 (never string-sorted)."""
    hosts: List[str] = []
    for part in filter(None, _split_top(nodelist.strip())):
        pieces = re.split(r"(\[[^\]]*\])", part)
        expanded = [""]
        for piece in pieces:
            if piece.startswith("["):
                if not piece.endswith("]"):
                    _fail("SLURM_STEP_NODELIST", nodelist, "has an unclosed '['")
                choices = _ranges(piece[1:-1])
            else:
                if "[" in piece or "]" in piece:
                    _fail("SLURM_STEP_NODELIST", nodelist, "has unbalanced brackets")
                choices = [piece]
            expanded = [e + c for e in expanded for c in choices]
        hosts.extend(expanded)
    return hosts


def expand_tasks_per_node(text: str) -> List[int]:
    """SLURM_STEP_TASKS_PER_NODE: '2(x3),1' -> [2, 2, 2, 1]."""
    counts: List[int] = []
    for item in text.strip().split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            _fail("SLURM_STEP_TASKS_PER_NODE", text, "must be like 2(x3),1")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def reserved_ports(text: str) -> List[int]:
    """SLURM_STEP_RESV_PORTS: '23001-23003,23010' -> [23001, 23002, 23003, 23010]."""
    ports: List[int] = []
    for item in filter(None, text.strip().split(",")):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            _fail("SLURM_STEP_RESV_PORTS", text, "must be like 23001-23003")
        ports.extend(range(int(low), int(high or low) + 1))
    return ports


def derived_ports(job_id: int, step_id: int, count: int) -> List[int]:
    """`count` ports for a step when Slurm reserves none: a block chosen by job and step id
    (the collision odds are in the module's docstring)."""
    if count > PORT_BLOCK:
        _fail("tasks on one node", count, f"at most {PORT_BLOCK} without reserved ports; ask "
                                          f"the admin for slurm.conf MpiParams=ports=")
    block = (job_id * 16 + step_id % 16) % PORT_BLOCKS
    start = PORT_LOW + block * PORT_BLOCK
    return list(range(start, start + count))


def _int(environ, name: str) -> int:
    value = environ.get(name, "")
    if not value.isdigit():
        _fail(name, value, "must be a whole number")
    return int(value)


def task_roles(ntasks: int, ps: int, evaluator: bool) -> List[str]:
    """Role per SLURM_PROCID: chief:0, worker:0.., ps:0.., evaluator:0 (the last)."""
    workers = ntasks - ps - int(evaluator)
    if ps < 0:
        _fail("--ps", ps, "must be >= 0")
    if workers < 1:
        extra = f" + {ps} ps" if ps else ""
        extra += " + 1 evaluator" if evaluator else ""
        _fail("srun -n", ntasks, f"is too few tasks for a chief{extra}; give srun -n "
                                 f"{ps + int(evaluator) + 1} or more")
    names = ["chief:0"] + [f"worker:{i}" for i in range(workers - 1)]
    names += [f"ps:{i}" for i in range(ps)]
    return names + (["evaluator:0"] if evaluator else [])


def task_addresses(environ: Mapping[str, str] = os.environ) -> List[str]:
    """host:port of every task of the step, by SLURM_PROCID (block distribution)."""
    ntasks = _int(environ, "SLURM_STEP_NUM_TASKS")
    hosts = expand_hostnames(environ["SLURM_STEP_NODELIST"])
    per_node = expand_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
    if len(per_node) != len(hosts) or sum(per_node) != ntasks:
        _fail("SLURM_STEP_TASKS_PER_NODE", environ["SLURM_STEP_TASKS_PER_NODE"],
              f"does not fit {len(hosts)} node(s) and {ntasks} task(s)")
    distribution = environ.get("SLURM_DISTRIBUTION", "block").split(":")[0]
    if distribution not in ("block", ""):
        _fail("srun --distribution", distribution, "the tasks' order must be block (srun's "
                                                   "default): drop --distribution or give "
                                                   "--distribution=block")
    most = max(per_node)
    resv = environ.get("SLURM_STEP_RESV_PORTS", "").strip()
    if resv:
        ports = reserved_ports(resv)
        if len(ports) < most:
            _fail("SLURM_STEP_RESV_PORTS", resv, f"has fewer ports than the {most} tasks on a "
                                                 f"node; ask the admin for a larger "
                                                 f"MpiParams=ports= range")
    else:
        ports = derived_ports(_int(environ, "SLURM_JOB_ID"), _int(environ, "SLURM_STEP_ID"),
                              most)
    return [f"{host}:{ports[local]}" for host, count in zip(hosts, per_node)
            for local in range(count)]


def tf_config(environ: Mapping[str, str] = os.environ, ps: int = 0,
              evaluator: bool = False) -> str:
    """This task's TF_CONFIG, laid out as the `cluster` launcher writes it (the evaluator in
    the cluster), from the srun step's variables."""
    addresses = task_addresses(environ)
    names = task_roles(len(addresses), ps, evaluator)
    procid = _int(environ, "SLURM_PROCID")
    if procid >= len(names):
        _fail("SLURM_PROCID", procid, f"is out of range for {len(names)} task(s)")
    _check_own_place(environ, addresses[procid])
    cluster = {}
    for name, address in zip(names, addresses):
        cluster.setdefault(name.split(":")[0], []).append(address)
    task_type, index = names[procid].split(":")
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": int(index)},
                       "environment": "cloud"})


def _check_own_place(environ, address: str):
    """The block layout put this task where Slurm did (SLURMD_NODENAME): else the layout is
    not block and every address may be wrong."""
    node = environ.get("SLURMD_NODENAME")
    host = address.rpartition(":")[0]
    if node and node != host:
        _fail("task layout", f"{host} != {node}", "Slurm placed this task on another node than "
                                                  "a block distribution would; give srun "
                                                  "--distribution=block")


def check_one_process_step(strategy: str, environ: Mapping[str, str] = os.environ):
    """`srun -n 4 train --strategy mirrored` (or none, or horovod without a Horovod launcher)
    trained 4 independent copies into one model_dir. A TF_CONFIG set by the user, or ranks
    started by horovodrun, are a cluster of their own."""
    from estimator_dist.distribute import specs

    if not in_step(environ) or environ.get("TF_CONFIG", "").strip() or \
            "HOROVOD_RANK" in environ or specs.spans_tf_config(strategy):
        return
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "1")
    if tasks.isdigit() and int(tasks) > 1:
        _fail("srun -n", int(tasks), f"runs --strategy {strategy} as {tasks} separate runs into "
                                     f"one model_dir; give --strategy multi_worker_mirrored or "
                                     f"parameter_server (with --ps), or srun -n 1 (Horovod: "
                                     f"horovodrun inside the job, docs/slurm.md)")


def restart_count(environ: Mapping[str, str] = os.environ) -> Optional[int]:
    """SLURM_RESTART_COUNT: how often a batch job was requeued (None outside one)."""
    value = environ.get("SLURM_RESTART_COUNT", "")
    return int(value) if value.isdigit() else None
