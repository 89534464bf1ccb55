"""--jit: XLA auto-clustering of the training graph, on CPU too, quiet unless --verbose."""
import json

import numpy as np
import pytest
import tensorflow as tf

from conftest import quick_train, run_cli
from estimator_dist.distribute import devices as devices_lib

FLAGS = ["--model", "digits", "--train_steps", "30", "--batch_size", "32", "--seed", "1",
         "--save_checkpoints_steps", "30", "--export", "none"]


def xla_ops(config):
    """The XLA launch ops in the graph a session with `config` actually runs."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [16, 32])
        w = tf.compat.v1.get_variable("w", [32, 8])
        loss = tf.reduce_mean(tf.square(tf.nn.relu(tf.matmul(x, w))))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        metadata = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train, {x: np.ones([16, 32], np.float32)},
                        options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                        run_metadata=metadata)
    return {n.op for g in metadata.partition_graphs for n in g.node if n.op.startswith("_Xla")}


def test_session_config_clusters_cpu_ops_only_with_jit():
    cpu = devices_lib.resolve(1, gpus=0)
    assert xla_ops(cpu.session_config(jit=True)) == {"_XlaCompile", "_XlaRun"}
    assert xla_ops(cpu.session_config(jit=False)) == set()


def cli_train(tmp_path, name, *extra):
    summary = tmp_path / f"{name}.json"
    proc = run_cli("train", *FLAGS, "--model_dir", str(tmp_path / name),
                   "--summary_json", str(summary), *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads(summary.read_text())


# One strategy: every strategy's sessions take the same session config (runner.session_config).
def test_jit_training_compiles_with_xla_quietly_and_matches_without(tmp_path):
    verbose, jit = cli_train(tmp_path, "verbose", "--jit", "--verbose")
    assert "Compiled cluster using XLA" in verbose.stderr
    quiet, jit_quiet = cli_train(tmp_path, "quiet", "--jit")
    assert "XLA" not in quiet.stdout + quiet.stderr, quiet.stderr
    assert jit_quiet["metrics"]["loss"] == pytest.approx(jit["metrics"]["loss"], rel=1e-3)
    plain = quick_train(tmp_path / "plain", steps=30, export="none")
    # Same seed, same batches: XLA's fused kernels round differently, nothing more.
    assert jit["metrics"]["loss"] == pytest.approx(plain["metrics"]["loss"], rel=0.02)
    assert jit["global_step"] == plain["global_step"] == 30
