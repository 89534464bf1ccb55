"""TF_CONFIG (and CLUSTER_SPEC) exactly as the platforms write them, and the ps server that
SageMaker's toolkit starts. Each builder names where its format comes from.

- Vertex AI (https://cloud.google.com/vertex-ai/docs/training/distributed-training):
  worker pools by position, workerPoolSpecs[0] the chief ("Primary, chief, scheduler, or
  master"), [1] workers, [2] parameter servers, [3] evaluators; every replica also gets
  CLUSTER_SPEC, `{"cluster": {"workerpool0": [...], ...}, "environment": "cloud", "task":
  {"type": "workerpool0", "index": 0}}` (the "CLUSTER_SPEC format" section; parsed the same
  way by google/xmanager's cloud/utils_test.py and google/yggdrasil-decision-forests'
  util/vertex_ai_test.py). A one-replica job's TF_CONFIG, as Vertex AI's prebuilt container
  logs it (run_module.py "Running task with arguments"): `--cluster={"chief":
  ["cmle-training-workerpool0-e5b9df8b1f-0:2222"]} --task={"type": "chief", "index": 0}
  --job={"python_module": ..., "package_uris": [...], "job_args": [...]}`.
- AI Platform Training (https://cloud.google.com/ai-platform/training/docs/distributed-training-details,
  "The format of TF_CONFIG"): `cluster` maps chief, worker, ps or master to addresses and
  "never contains evaluator as a key, since evaluators are not considered part of the
  training cluster"; `task` {type: chief/master, worker, ps or evaluator, index, trial};
  `job`: the TrainingInput of the job as a dictionary; `environment`: "cloud". Runtime 2.1+
  say `chief`, older jobs `master`. Its example addresses are
  "cmle-training-chief-[ID]-0:2222". The TrainingInput in `job` carries its fields by their
  proto names (scale_tier, package_uris, python_module, region, runtime_version, job_dir,
  run_on_raw_vm, python_version, as AI Platform jobs print it), so its evaluator count is
  `evaluator_count` (int64: a string in JSON).
- SageMaker: aws/sagemaker-tensorflow-training-toolkit, src/sagemaker_tensorflow_container/
  training.py. `_build_tf_config_for_ps`: the first host is `master` (port 2222), the others
  `worker` (2222), every host also runs a `ps` (2223), `"environment": "cloud"`, task
  {"index", "type": "master" | "worker"}; `_run_ps` starts each host's ps itself:
  `tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="ps", task_index=...,
  config=ConfigProto(device_count={"GPU": 0}))` and `server.join()`. `_build_tf_config_for_mwms`:
  only `worker` tasks (port 8890), `"environment": "cloud"`, task {"index", "type": "worker"}.
  Here every host is 127.0.0.1, so each task gets its own free port instead of 2222/2223/8890.
"""
import json
import sys

import tensorflow as tf

VERTEX_JOB = {"python_module": "trainer.task",
              "package_uris": ["gs://bucket/packages/trainer-0.1.tar.gz"],
              "job_args": ["--model_dir=gs://bucket/output"]}
VERTEX_ONE_REPLICA = "cmle-training-workerpool0-e5b9df8b1f-0:2222"


def vertex_tf_config(cluster, task_type, index=0):
    """Vertex AI's TF_CONFIG: `cluster`, `task`, `job` (the Python package spec), "cloud"."""
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index},
                       "job": VERTEX_JOB, "environment": "cloud"})


def vertex_cluster_spec(pools, task_type, index=0):
    """Vertex AI's CLUSTER_SPEC: every worker pool by name, workerpool3 the evaluators."""
    return json.dumps({"cluster": pools, "environment": "cloud",
                       "task": {"type": task_type, "index": index}})


def ai_platform_job(workers=0, ps=0, evaluators=0):
    """AI Platform's `job`: the TrainingInput, by its proto field names (int64 as strings)."""
    job = {"scale_tier": "CUSTOM", "master_type": "n1-standard-8",
           "package_uris": ["gs://bucket/trainer-0.1.tar.gz"], "python_module": "trainer.task",
           "region": "us-central1", "runtime_version": "2.11", "python_version": "3.7",
           "job_dir": "gs://bucket/job", "run_on_raw_vm": True}
    for name, count in (("worker", workers), ("parameter_server", ps),
                        ("evaluator", evaluators)):
        if count:
            job.update({f"{name}_type": "n1-standard-8", f"{name}_count": str(count)})
    return job


def ai_platform_tf_config(cluster, task_type, index, job):
    """AI Platform's TF_CONFIG: the evaluator is never in `cluster`."""
    assert "evaluator" not in cluster
    return json.dumps({"cluster": cluster, "environment": "cloud", "job": job,
                       "task": {"type": task_type, "index": index}})


def sagemaker_ps_cluster(hosts_ports):
    """`_build_tf_config_for_ps`'s cluster for hosts given as (train address, ps address)."""
    cluster = {"master": [hosts_ports[0][0]], "ps": [ps for _, ps in hosts_ports]}
    if len(hosts_ports) > 1:
        cluster["worker"] = [train for train, _ in hosts_ports[1:]]
    return cluster


def sagemaker_ps_tf_config(cluster, host_index):
    """`_build_tf_config_for_ps` for the host at host_index (0: the master)."""
    task = {"index": 0, "type": "master"} if host_index == 0 else \
        {"index": host_index - 1, "type": "worker"}
    return json.dumps({"cluster": cluster, "environment": "cloud", "task": task})


def sagemaker_mwms_tf_config(workers, index):
    """`_build_tf_config_for_mwms`: workers only, worker 0 the chief as TensorFlow treats it."""
    return json.dumps({"cluster": {"worker": list(workers)}, "environment": "cloud",
                       "task": {"index": index, "type": "worker"}})


def serve_ps(cluster_json: str, task_index: int):
    """The toolkit's `_run_ps`: a plain TensorFlow server for job `ps`, until killed."""
    cluster_spec = tf.train.ClusterSpec(json.loads(cluster_json))
    no_gpu_config = tf.compat.v1.ConfigProto(device_count={"GPU": 0})
    server = tf.distribute.Server(cluster_spec, job_name="ps", task_index=task_index,
                                  config=no_gpu_config)
    server.join()


if __name__ == "__main__":
    serve_ps(sys.argv[1], int(sys.argv[2]))
