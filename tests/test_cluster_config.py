"""TF_CONFIG validation: every malformed case is one line naming the field and value."""
import json

import pytest

from estimator_dist.distribute import tf_config as cluster
from estimator_dist.errors import UserError

CL = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}


def tf_config(cluster_spec=CL, task_type="worker", index=0, **extra):
    return json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}, **extra})


def error(text, strategy="parameter_server"):
    with pytest.raises(UserError) as e:
        cluster.from_env(strategy, {"TF_CONFIG": text})
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("text,expected", [
    ("{not json", "TF_CONFIG is not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
    ("[1, 2]", "TF_CONFIG  [1, 2]: must be a JSON object with 'cluster' and 'task'"),
    (json.dumps({"cluster": CL}), "TF_CONFIG 'task' None: must be an object with 'type' and 'index'"),
    (tf_config(task_type="boss"), "TF_CONFIG task type 'boss': is not one of chief, worker, ps, evaluator (or 'master')"),
    (tf_config(index=3), "TF_CONFIG task index 3 for type 'worker': is out of range: the cluster has 1 worker task(s)"),
    (tf_config(index=-1), "TF_CONFIG task index -1: must be a whole number >= 0"),
    (tf_config({"ps": ["h:2"]}, "ps"), "TF_CONFIG cluster chief count 0: must be exactly 1"),
    (tf_config({"chief": ["h:1", "h:2"], "ps": ["h:3"]}, "chief"), "TF_CONFIG cluster chief count 2: must be exactly 1"),
    (tf_config({"chief": ["h:1"], "master": ["h:2"]}, "chief"), "TF_CONFIG cluster"),
    (tf_config({**CL, "evaluator": ["h:9"]}, "evaluator", 1), "TF_CONFIG evaluator index 1: must be 0"),
    (tf_config({**CL, "gpu": ["h:9"]}), "TF_CONFIG cluster key 'gpu': is not a task type"),
    (tf_config({"chief": "h:1", "ps": ["h:2"]}, "chief"), "TF_CONFIG cluster['chief'] 'h:1': must be a list of 'host:port' strings"),
    # Tracebacks (int('a'), RecursionError, TensorFlow's port parser or server factory) or,
    # for port 0 and an empty host, a server that hung ignoring SIGTERM; 99999 was accepted.
    (tf_config({**CL, "worker": {"a": "h:2"}}), "TF_CONFIG cluster['worker'] {'a': 'h:2'}: as a mapping must map task indices"),
    ("[" * 100000, "TF_CONFIG nests its JSON too deeply to read"),
    *[(tf_config({**CL, "worker": [address]}), f"TF_CONFIG address in cluster['worker'] '{address}': "
       f"must be 'host:port' with a host and a port of 1-65535")
      for address in ("h:abc", "h:", ":2222", "h:0", "h:99999", "h:-5", "host with space:1")],
    (tf_config(rpc_layer="bogus"), "TF_CONFIG rpc_layer 'bogus': must be one of grpc"),
])
def test_malformed(text, expected):
    assert error(text).startswith(expected)


def test_strategy_must_fit_cluster():
    no_ps = {"chief": ["h:1"], "worker": ["h:2"]}
    assert "--strategy parameter_server needs ps tasks" in error(tf_config(no_ps), "parameter_server")
    assert "--strategy multi_worker_mirrored takes no ps tasks" in error(tf_config(), "multi_worker_mirrored")
    assert "--strategy mirrored runs on one machine" in error(tf_config(), "mirrored")
    assert "would train them independently" in error(tf_config(no_ps), "none")
    with pytest.raises(UserError, match="needs TF_CONFIG describing the cluster"):
        cluster.from_env("multi_worker_mirrored", {})


def test_master_is_chief_and_evaluator_leaves_cluster():
    text = tf_config({"master": ["h:1"], "worker": ["h:2"], "evaluator": ["h:3"]}, "master",
                     environment="cloud")
    spec = cluster.from_env("multi_worker_mirrored", {"TF_CONFIG": text})
    assert spec.is_chief and spec.num_workers == 2 and spec.has_evaluator
    env = {}
    cluster.apply(spec, env)
    assert json.loads(env["TF_CONFIG"]) == {
        "environment": "cloud", "cluster": {"chief": ["h:1"], "worker": ["h:2"]},
        "task": {"type": "chief", "index": 0}}


def test_unset_is_local_and_valid_configs_pass():
    assert cluster.from_env("mirrored", {}) is None
    assert cluster.from_env("none", {"TF_CONFIG": "  "}) is None
    spec = cluster.from_env("none", {"TF_CONFIG": tf_config()})  # async PS
    assert spec.num_ps == 1 and spec.is_distributed and not spec.is_chief
    evaluator = cluster.from_env("parameter_server", {"TF_CONFIG": tf_config(task_type="evaluator")})
    assert evaluator.is_evaluator


@pytest.mark.parametrize("argv,unknown,hint", [
    (["cluster", "--workers", "2", "--modle", "digits"], "--modle digits", "--model for --modle"),
    (["cluster", "--wrokers", "2", "--train_steps", "5"], "--wrokers 2", "--workers for --wrokers"),
    (["tfjob", "--image", "img:1", "--modle", "digits"], "--modle digits", "--model for --modle"),
    (["tfjob", "--image", "img:1", "--trian_steps=5"], "--trian_steps=5",
     "--train_steps for --trian_steps"),
])
def test_pass_through_typos_get_did_you_mean(argv, unknown, hint, capsys):
    """`train --modle` got "did you mean --model"; the same typo in the flags cluster and tfjob
    pass on to train got only "unrecognized arguments" (from the top-level parser)."""
    from estimator_dist.cli import main as cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"estimator-dist {argv[0]}: error: unrecognized arguments: {unknown} (did you mean "
        f"{hint}?); see 'estimator-dist {argv[0]} --help'\n")


def test_a_port_another_process_holds_is_refused_before_tensorflow_tries_it():
    """TensorFlow's server failed with a traceback (multi_worker_mirrored) or "training failed"
    (parameter_server), after gRPC's own log line."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        spec = cluster.parse(tf_config({**CL, "worker": [f"127.0.0.1:{port}"]}))
        with pytest.raises(UserError, match=f"^TF_CONFIG task worker:0: its port {port} "
                                            f"\\(127.0.0.1:{port}\\) is held by another process"):
            cluster.check_own_port(spec)
    cluster.check_own_port(spec)  # free again
    cluster.check_own_port(cluster.parse(tf_config({**CL, "evaluator": ["h:9"]}, "evaluator")))
