"""Kubeflow TFJob (kubeflow.org/v1) manifests whose replicas run the same train command.

The operator gives each replica its TF_CONFIG (every replica type in `cluster`,
the task type lower-cased, "environment": "cloud"); estimator-dist reads it as is.
A job of one replica in all gets no TF_CONFIG (training-operator release-1.9), so it
runs as a one-machine run. `--model_dir` must be storage every replica sees: a PVC
via --pvc (a bucket too, mounted as a volume by its CSI driver).
"""
import os
import re
import shlex
from typing import Any, Dict, List

import yaml

from estimator_dist.errors import UserError
from estimator_dist.distribute import specs
from estimator_dist.launch.cluster import _strategy_in, check_shape

DEFAULT_MOUNT_PATH = "/mnt/estimator-dist"

PORT = 2222
CONTAINER = "tensorflow"  # the operator injects TF_CONFIG into the container of this name
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # DNS-1123 label
# The job's name: the operator validates it as a DNS-1035 label (a letter first).
JOB_NAME_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_MAX = 63
# The strategy of a job of one replica: it gets no TF_CONFIG, so it runs on one machine.
ONE_REPLICA_STRATEGY = specs.ONE_PROCESS_MULTI_DEVICE
GPU_RESOURCE = "nvidia.com/gpu"  # NVIDIA's device plugin
# A container image reference, as Docker's reference grammar has it (distribution/reference).
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_RE = re.compile(
    rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


def _container(image: str, command: List[str], mount_path: str, pvc: str,
               gpus: int = 0) -> Dict[str, Any]:
    container = {"name": CONTAINER, "image": image, "command": command,
                 "ports": [{"name": "tfjob-port", "containerPort": PORT}]}
    if pvc:
        container["volumeMounts"] = [{"name": "shared", "mountPath": mount_path}]
    if gpus:  # without a limit the pod gets no GPU and trains on its CPU, silently
        container["resources"] = {"limits": {GPU_RESOURCE: gpus}}
    return container


def gpus_of(replica_type: str, gpus: int, evaluator_gpus: int) -> int:
    """GPUs a replica asks for: the training ones --gpus, the evaluator --evaluator_gpus, a
    ps none (its variables live on its CPU)."""
    return {"Chief": gpus, "Worker": gpus, "Evaluator": evaluator_gpus}.get(replica_type, 0)


def with_num_devices(train_args: List[str], gpus: int) -> List[str]:
    """The pods' train flags, with `--num_devices GPUS` when --gpus is given and they set none."""
    given = any(a == "--num_devices" or a.startswith("--num_devices=") for a in train_args)
    return list(train_args) + (["--num_devices", str(gpus)] if gpus > 0 and not given else [])


def check_gpus(gpus: int, evaluator_gpus: int, num_devices: int):
    if gpus < 0 or evaluator_gpus < 0:
        raise UserError(f"--gpus {gpus} --evaluator_gpus {evaluator_gpus}: must be >= 0")
    if num_devices and num_devices != gpus:
        raise UserError(f"--num_devices {num_devices} with --gpus {gpus}: each pod computes on "
                        f"the GPUs it asks for; give --num_devices {gpus} or leave it out (0: "
                        f"every GPU of the pod)")


def _replica(count: int, container: Dict[str, Any], pvc: str, restart: str) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"containers": [container]}
    if pvc:
        spec["volumes"] = [{"name": "shared", "persistentVolumeClaim": {"claimName": pvc}}]
    return {"replicas": count, "restartPolicy": restart, "template": {"spec": spec}}


def manifest(name: str, image: str, train_args: List[str], workers: int, ps: int,
             evaluator: bool, namespace: str = "default", pvc: str = "",
             mount_path: str = DEFAULT_MOUNT_PATH, gpus: int = 0,
             evaluator_gpus: int = 0) -> Dict[str, Any]:
    """The TFJob as a dict. Chief + (workers - 1) Workers + ps PS (+ an Evaluator).

    restartPolicy ExitCode: the operator restarts a replica on retryable exit codes
    (signals, e.g. preemption) and not on exit code 2 (a user error would only repeat).
    """
    check_job_flags(name, image, namespace, pvc, mount_path)
    strategy = _strategy(train_args)
    check_shape(workers, ps, strategy)
    check_one_replica(workers, ps, evaluator, strategy)
    check_service_names(name, workers, ps, evaluator)
    command = ["estimator-dist", "train"] + list(train_args)
    replicas = {rtype: _replica(n, _container(image, command, mount_path, pvc,
                                              gpus_of(rtype, gpus, evaluator_gpus)),
                                pvc, "ExitCode")
                for rtype, n in replica_counts(workers, ps, evaluator).items()}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "tfReplicaSpecs": replicas},
    }


def check_job_flags(name: str, image: str, namespace: str, pvc: str, mount_path: str):
    """The job's own flags, each alone, before anything that combines them with train flags."""
    if not JOB_NAME_RE.fullmatch(name) or len(name) > LABEL_MAX:
        raise UserError(f"--name {name!r}: the TFJob operator takes only a DNS-1035 label: a "
                        f"lower-case letter first, then lower-case letters, digits or '-', no "
                        f"'-' at the end, at most {LABEL_MAX} characters; e.g. "
                        f"{suggested_name(name)!r}")
    check_kubernetes_names(namespace, pvc, mount_path)
    if not image:
        raise UserError("--image is required: the container image that has estimator-dist installed")
    if not IMAGE_RE.fullmatch(image):
        raise UserError(f"--image {image!r}: not a container image reference "
                        f"([registry[:port]/]name[:tag][@digest]; the name in lower case, no "
                        f"spaces), e.g. 'registry.example.com/team/estimator-dist:1.0'")


def suggested_name(name: str) -> str:
    """`name` made a DNS-1035 label, for the fix in the message."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    label = label if label[:1].isalpha() else f"job-{label}".rstrip("-")
    return label[:LABEL_MAX].rstrip("-")


def replica_counts(workers: int, ps: int, evaluator: bool) -> Dict[str, int]:
    """Replica type -> count, as the manifest lists them (workers counts the chief)."""
    counts = {"Chief": 1, "Worker": workers - 1, "PS": ps, "Evaluator": int(evaluator)}
    return {rtype: n for rtype, n in counts.items() if n}


def check_service_names(name: str, workers: int, ps: int, evaluator: bool):
    """The operator names each replica's pod and service NAME-TYPE-INDEX; a service name
    is a DNS-1035 label too, so the longest must fit in 63 characters."""
    longest = max((f"{name}-{rtype.lower()}-{n - 1}"
                   for rtype, n in replica_counts(workers, ps, evaluator).items()), key=len)
    if len(longest) > LABEL_MAX:
        room = LABEL_MAX - (len(longest) - len(name))
        raise UserError(f"--name {name!r}: the operator names this job's services up to "
                        f"{longest!r} ({len(longest)} characters), over the {LABEL_MAX} of a "
                        f"DNS label; give a name of at most {room} characters")


def check_one_replica(workers: int, ps: int, evaluator: bool, strategy: str):
    """A job of one replica gets no TF_CONFIG from the operator: a cluster strategy there
    exits 2 in its pod ("needs TF_CONFIG") and fails the job."""

    if sum(replica_counts(workers, ps, evaluator).values()) == 1 and \
            strategy in specs.tf_config_strategies():
        raise UserError(f"--strategy {strategy} with --workers 1 and no --ps or --evaluator: the "
                        f"TFJob operator gives a job of one replica no TF_CONFIG, so its pod "
                        f"would exit 2; use --strategy {ONE_REPLICA_STRATEGY} (every GPU of the "
                        f"pod) or none, or leave --strategy out, or add --workers 2 or "
                        f"--evaluator")


def default_strategy(workers: int, ps: int, evaluator: bool):
    """The strategy when the train flags give none: a one-replica job runs on one machine;
    None: the cluster's default (launcher.cluster_strategy)."""
    one = sum(replica_counts(workers, ps, evaluator).values()) == 1
    return ONE_REPLICA_STRATEGY if one else None


# A DNS-1123 subdomain (a PersistentVolumeClaim's name): dot-separated labels, 253 at most.
SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_kubernetes_names(namespace: str, pvc: str, mount_path: str):
    """What Kubernetes would refuse when the job is applied, refused here instead."""
    if not NAME_RE.fullmatch(namespace) or len(namespace) > 63:
        raise UserError(f"--namespace {namespace!r}: must be a DNS-1123 label of at most 63 "
                        f"characters (lower-case letters, digits, '-'), e.g. default")
    if pvc and (not SUBDOMAIN_RE.fullmatch(pvc) or len(pvc) > 253):
        raise UserError(f"--pvc {pvc!r}: must be a PersistentVolumeClaim name (lower-case "
                        f"letters, digits, '-', '.'), e.g. training-data")
    if pvc and not mount_path.startswith("/"):
        raise UserError(f"--mount_path {mount_path!r}: must be an absolute path in the "
                        f"container, e.g. /mnt/estimator-dist")


def check_shared_model_dir(model_dir: str, pvc: str, mount_path: str, replicas: int = 1):
    """Every replica must write the same model_dir: on the --pvc volume (a pod-local
    model_dir is private to its pod: the evaluator never sees a checkpoint, and they die
    with the pod); --mount_path needs --pvc. A storage URL was refused with the train
    flags (paths.py): a bucket is mounted as a volume."""
    if not pvc and mount_path != DEFAULT_MOUNT_PATH:
        raise UserError(f"--mount_path {mount_path}: only --pvc is mounted there; add --pvc "
                        f"CLAIM or leave it out")
    if not pvc:
        if replicas > 1:
            shown = model_dir or "runs/MODEL (the default)"
            raise UserError(f"--model_dir {shown}: each of this job's {replicas} replicas runs in "
                            f"a pod of its own, where that path is private (the others never see "
                            f"its checkpoints); add --pvc CLAIM and a --model_dir under "
                            f"--mount_path (e.g. {DEFAULT_MOUNT_PATH}/runs/my-run)")
        return
    root = mount_path.rstrip("/") + "/"
    if not model_dir or not os.path.normpath(model_dir).startswith(root):
        shown = model_dir or "(default runs/MODEL, inside the container)"
        raise UserError(f"--model_dir {shown}: with --pvc {pvc} it must be under --mount_path "
                        f"{mount_path}, where every replica sees it, e.g. "
                        f"{root}runs/my-run")


def _strategy(train_args: List[str]) -> str:
    return _strategy_in(train_args)


def to_yaml(job: Dict[str, Any]) -> str:
    """The manifest, after a comment with the replicas' command (and, for a job with workers,
    how to resize it: docs/elastic.md)."""
    replicas = job["spec"]["tfReplicaSpecs"]
    header = "# " + shlex.join(replicas["Chief"]["template"]["spec"]["containers"][0]
                               ["command"]) + "\n"
    if "Worker" in replicas:
        header += (f"# Resize: kubectl delete tfjob {job['metadata']['name']} -n "
                   f"{job['metadata']['namespace']} (every pod gets "
                   f"SIGTERM; the chief saves the step they stop at), then apply a manifest "
                   f"written with another --workers and the same --model_dir: it resumes there "
                   f"with the same global batch (docs/elastic.md)\n")
    return header + yaml.safe_dump(job, sort_keys=False)
