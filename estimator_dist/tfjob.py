"""Kubeflow TFJob (kubeflow.org/v1) manifests whose replicas run the same train command.

The operator gives each replica its TF_CONFIG (every replica type in `cluster`,
the task type lower-cased, "environment": "cloud"); estimator-dist reads it as is.
`--model_dir` must be storage every replica sees (a PVC via --pvc, or a bucket).
"""
import os
import re
import shlex
from typing import Any, Dict, List

import yaml

from estimator_dist.errors import UserError
from estimator_dist.launcher import check_shape

DEFAULT_MOUNT_PATH = "/mnt/estimator-dist"

PORT = 2222
CONTAINER = "tensorflow"  # the operator injects TF_CONFIG into the container of this name
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# A container image reference, as Docker's reference grammar has it (distribution/reference).
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_RE = re.compile(
    rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


def _container(image: str, command: List[str], mount_path: str, pvc: str) -> Dict[str, Any]:
    container = {"name": CONTAINER, "image": image, "command": command,
                 "ports": [{"name": "tfjob-port", "containerPort": PORT}]}
    if pvc:
        container["volumeMounts"] = [{"name": "shared", "mountPath": mount_path}]
    return container


def _replica(count: int, container: Dict[str, Any], pvc: str, restart: str) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"containers": [container]}
    if pvc:
        spec["volumes"] = [{"name": "shared", "persistentVolumeClaim": {"claimName": pvc}}]
    return {"replicas": count, "restartPolicy": restart, "template": {"spec": spec}}


def manifest(name: str, image: str, train_args: List[str], workers: int, ps: int,
             evaluator: bool, namespace: str = "default", pvc: str = "",
             mount_path: str = DEFAULT_MOUNT_PATH) -> Dict[str, Any]:
    """The TFJob as a dict. Chief + (workers - 1) Workers + ps PS (+ an Evaluator).

    restartPolicy ExitCode: the operator restarts a replica on retryable exit codes
    (signals, e.g. preemption) and not on exit code 2 (a user error would only repeat).
    """
    check_job_flags(name, image, namespace, pvc, mount_path)
    strategy = _strategy(train_args)
    check_shape(workers, ps, strategy)
    command = ["estimator-dist", "train"] + list(train_args)
    container = _container(image, command, mount_path, pvc)
    replicas = {"Chief": _replica(1, container, pvc, "ExitCode")}
    if workers > 1:
        replicas["Worker"] = _replica(workers - 1, container, pvc, "ExitCode")
    if ps:
        replicas["PS"] = _replica(ps, container, pvc, "ExitCode")
    if evaluator:
        replicas["Evaluator"] = _replica(1, container, pvc, "ExitCode")
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "tfReplicaSpecs": replicas},
    }


def check_job_flags(name: str, image: str, namespace: str, pvc: str, mount_path: str):
    """The job's own flags, each alone, before anything that combines them with train flags."""
    if not NAME_RE.fullmatch(name) or len(name) > 40:
        raise UserError(f"--name {name!r}: must be a DNS-1123 label of at most 40 characters "
                        f"(lower-case letters, digits, '-')")
    check_kubernetes_names(namespace, pvc, mount_path)
    if not image:
        raise UserError("--image is required: the container image that has estimator-dist installed")
    if not IMAGE_RE.fullmatch(image):
        raise UserError(f"--image {image!r}: not a container image reference "
                        f"([registry[:port]/]name[:tag][@digest]; the name in lower case, no "
                        f"spaces), e.g. 'registry.example.com/team/estimator-dist:1.0'")


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


def check_shared_model_dir(model_dir: str, pvc: str, mount_path: str):
    """Every replica must write the same model_dir: with --pvc it must be on the volume (a
    pod-local model_dir loses the checkpoints with the pod); --mount_path needs --pvc."""
    if not pvc:
        if mount_path != DEFAULT_MOUNT_PATH:
            raise UserError(f"--mount_path {mount_path}: only --pvc is mounted there; add --pvc "
                            f"CLAIM or leave it out")
        return
    root = mount_path.rstrip("/") + "/"
    if not model_dir or not os.path.normpath(model_dir).startswith(root):
        shown = model_dir or "(default runs/MODEL, inside the container)"
        raise UserError(f"--model_dir {shown}: with --pvc {pvc} it must be under --mount_path "
                        f"{mount_path}, where every replica sees it, e.g. "
                        f"{root}runs/my-run")


def _strategy(train_args: List[str]) -> str:
    from estimator_dist.launcher import _strategy_in

    return _strategy_in(train_args)


def to_yaml(job: Dict[str, Any]) -> str:
    header = "# " + shlex.join(job["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]
                                ["containers"][0]["command"]) + "\n"
    return header + yaml.safe_dump(job, sort_keys=False)
