"""The platforms' TF_CONFIG layouts become one normalised ClusterSpec, and each process's Role
follows from it. Formats and their sources: platform_configs.py; the runs: test_platforms.py."""
import json

import pytest

from estimator_dist.distribute import tf_config as cluster_lib
from estimator_dist.errors import UserError
from estimator_dist.distribute import role as role_lib
from estimator_dist.distribute.role import Role
from estimator_dist.training.roles import procedure
import platform_configs as platforms

H = [f"10.0.0.{i}:2222" for i in range(1, 5)]


def spec_of(text, strategy, cluster_spec=None):
    environ = {"TF_CONFIG": text, **({"CLUSTER_SPEC": cluster_spec} if cluster_spec else {})}
    return cluster_lib.from_env(strategy, environ)


def tensorflow_sees(spec):
    environ = {"TF_CONFIG": "set by the platform"}
    cluster_lib.apply(spec, environ)
    return json.loads(environ["TF_CONFIG"]) if "TF_CONFIG" in environ else None


@pytest.mark.parametrize("chief", ["chief", "master"])
@pytest.mark.parametrize("strategy", ["none", "one_device", "mirrored", "central_storage", "tower"])
def test_a_one_replica_job_is_a_local_run_that_tensorflow_runs_without_tf_config(chief, strategy):
    spec = spec_of(platforms.vertex_tf_config({chief: [platforms.VERTEX_ONE_REPLICA]}, chief),
                   strategy)
    assert spec.trains_alone and spec.is_chief
    role = Role.of(strategy, spec)
    assert (role.kind, role.in_cluster, procedure(role).__name__) == \
        (role_lib.LOCAL, False, "run_local")
    assert tensorflow_sees(role.tensorflow_cluster) is None


def test_a_one_task_cluster_keeps_its_cluster_for_a_cluster_strategy():
    """`cluster --workers 1` under multi_worker_mirrored: TensorFlow's MWMS takes it."""
    spec = spec_of(platforms.vertex_tf_config({"chief": [H[0]]}, "chief"), "multi_worker_mirrored")
    role = Role.of("multi_worker_mirrored", spec)
    assert role.kind == role_lib.CHIEF and tensorflow_sees(role.tensorflow_cluster)["cluster"] == \
        {"chief": [H[0]]}


def test_a_chief_alone_beside_an_evaluator_trains_only_and_tensorflow_sees_no_cluster():
    pools = {"workerpool0": [H[0]], "workerpool3": [H[3]]}
    chief = spec_of(platforms.vertex_tf_config({"chief": [H[0]]}, "chief"), "mirrored",
                    platforms.vertex_cluster_spec(pools, "workerpool0"))
    role = Role.of("mirrored", chief)
    assert (role.kind, role.trains_alone, procedure(role).__name__, role.cluster.has_evaluator,
            role.exports_final_itself, role.trains_in_a_group) == \
        (role_lib.CHIEF, True, "run_chief", True, False, False)
    assert role.tensorflow_cluster is None
    evaluator = Role.of("mirrored", spec_of(
        platforms.vertex_tf_config({"chief": [H[0]]}, "evaluator"), "mirrored",
        platforms.vertex_cluster_spec(pools, "workerpool3")))
    assert evaluator.kind == role_lib.EVALUATOR and procedure(evaluator).__name__ == "run_evaluator"


@pytest.mark.parametrize("job, cluster_spec, outside", [
    (platforms.ai_platform_job(workers=1, evaluators=1), None, True),
    ({**platforms.ai_platform_job(workers=1), "evaluator_count": 1}, None, True),
    (platforms.ai_platform_job(workers=1), None, False),
    (platforms.VERTEX_JOB, platforms.vertex_cluster_spec(
        {"workerpool0": [H[0]], "workerpool1": [H[1]], "workerpool3": [H[2]]}, "workerpool0"), True),
    (platforms.VERTEX_JOB, platforms.vertex_cluster_spec(
        {"workerpool0": [H[0]], "workerpool1": [H[1]]}, "workerpool0"), False),
    (platforms.VERTEX_JOB, "{not json", False),  # not TF_CONFIG: ignored
])
def test_an_evaluator_outside_the_cluster_is_read_off_the_platforms_job(job, cluster_spec, outside):
    """AI Platform's `cluster` never lists the evaluator: the chief took the run for one
    without, and exported beside the evaluator."""
    text = platforms.ai_platform_tf_config({"chief": [H[0]], "worker": [H[1]]}, "chief", 0, job)
    spec = spec_of(text, "multi_worker_mirrored", cluster_spec)
    assert (spec.evaluator_outside, spec.has_evaluator) == (outside, outside)
    role = Role.of("multi_worker_mirrored", spec)
    # run_chief: with an evaluator task it leaves the evaluation and export to that task
    assert (role.exports_final_itself, role.cluster.has_evaluator) == (not outside, outside)
    assert tensorflow_sees(spec)["cluster"] == {"chief": [H[0]], "worker": [H[1]]}


def test_sagemakers_parameter_server_layout_keeps_master_for_the_outside_ps_servers():
    hosts = [(H[0], "10.0.0.1:2223"), (H[1], "10.0.0.2:2223")]
    cluster = platforms.sagemaker_ps_cluster(hosts)
    master = spec_of(platforms.sagemaker_ps_tf_config(cluster, 0), "none")
    worker = spec_of(platforms.sagemaker_ps_tf_config(cluster, 1), "none")
    assert (master.task_type, master.chief_name, master.chief_evaluates) == ("chief", "master", True)
    for spec, task in ((master, {"type": "master", "index": 0}),
                       (worker, {"type": "worker", "index": 0})):
        assert tensorflow_sees(spec) == {"cluster": cluster, "environment": "cloud", "task": task}
    role = Role.of("none", master)
    # run_chief: Estimator's `master` evaluated every checkpoint; the chief exports the last
    assert (role.cluster.chief_evaluates, role.cluster.has_evaluator, role.exports_final_itself) \
        == (True, False, True)
    with pytest.raises(UserError) as refused:
        spec_of(platforms.sagemaker_ps_tf_config(cluster, 0), "parameter_server")
    assert str(refused.value) == (
        "--strategy parameter_server: TF_CONFIG names the chief 'master' beside ps tasks "
        "(SageMaker's parameter-server layout: its ps servers, started from that cluster, know "
        "the chief by that name), and TensorFlow's ParameterServerStrategy takes only 'chief'; "
        "use --strategy none (Estimator's own asynchronous training on these ps tasks)")


def test_master_becomes_chief_without_ps_or_beside_an_evaluator():
    """Estimator's `master` evaluates itself and takes no evaluator task; TensorFlow's
    strategies take only `chief`. No outside server can know `master` without ps tasks."""
    no_ps = json.dumps({"cluster": {"master": [H[0]], "worker": [H[1]]}, "environment": "cloud",
                        "task": {"type": "master", "index": 0}})
    with_evaluator = platforms.ai_platform_tf_config(
        {"master": [H[0]], "worker": [H[1]], "ps": [H[2]]}, "master", 0,
        platforms.ai_platform_job(workers=1, ps=1, evaluators=1))
    for text, strategy in ((no_ps, "multi_worker_mirrored"), (with_evaluator, "parameter_server")):
        spec = spec_of(text, strategy)
        assert spec.chief_name == "chief" and tensorflow_sees(spec)["task"]["type"] == "chief"


def test_sagemakers_multi_worker_mirrored_layout_makes_worker_0_the_chief():
    workers = H[:3]
    specs = [spec_of(platforms.sagemaker_mwms_tf_config(workers, i), "multi_worker_mirrored")
             for i in range(3)]
    assert [(s.task_type, s.task_index) for s in specs] == [("chief", 0), ("worker", 0),
                                                            ("worker", 1)]
    assert {json.dumps(tensorflow_sees(s)["cluster"]) for s in specs} == \
        {json.dumps({"chief": [H[0]], "worker": H[1:3]})}
    assert Role.of("multi_worker_mirrored", specs[0]).kind == role_lib.CHIEF
    assert specs[2].cluster["worker"][specs[2].task_index] == H[2]  # its own address
    with pytest.raises(UserError, match=r"^TF_CONFIG task index 3 for type 'worker': is out of "
                                        r"range: the cluster has 3 worker task\(s\)"):
        spec_of(platforms.sagemaker_mwms_tf_config(workers, 3), "multi_worker_mirrored")


def test_a_cluster_chief_without_an_evaluator_evaluates_the_final_checkpoint():
    spec = spec_of(json.dumps({"cluster": {"chief": [H[0]], "worker": [H[1]], "ps": [H[2]]},
                               "task": {"type": "chief", "index": 0}}), "parameter_server")
    role = Role.of("parameter_server", spec)
    # run_chief then evaluates and exports the final checkpoint, and writes --summary_json
    assert procedure(role).__name__ == "run_chief" and role.exports_final_itself
    assert not role.cluster.has_evaluator and not role.cluster.chief_evaluates
    worker = Role.of("parameter_server", spec_of(json.dumps(
        {"cluster": spec.cluster, "task": {"type": "worker", "index": 0}}), "parameter_server"))
    assert procedure(worker).__name__ == "run_worker" and not worker.exports_final_itself
