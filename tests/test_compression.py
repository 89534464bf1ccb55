"""--gradient_compression: gradients all-reduced in 16 bits, applied in float32 (compression.py)."""
import re

import numpy as np
import pytest
import tensorflow as tf

import estimator_dist
from conftest import make_config, run_cli
from estimator_dist.training import plan as plan_lib
from estimator_dist.distribute import strategies
from estimator_dist.errors import UserError
from estimator_dist.training.registry import register_model
from tiny_models import max_difference, train, weights

@pytest.mark.parametrize("setting,tolerance", [("fp16", 2e-3), ("bf16", 2e-2)])
def test_mirrored_trains_like_float32_within_the_16_bit_precision(setting, tolerance, tmp_path):
    """Mirrored N=2, 5 SGD steps: near the float32 all-reduce's weights, and not equal to them
    (the 16-bit path really ran); checkpoints stay float32."""
    train(tmp_path / "none", "tiny_v1", "mirrored", 2, steps=5, batch_size=6)
    train(tmp_path / setting, "tiny_v1", "mirrored", 2, steps=5, batch_size=6,
          gradient_compression=setting)
    expected, got = weights(tmp_path / "none"), weights(tmp_path / setting)
    assert 1e-6 < max_difference(got, expected) <= tolerance
    assert all(v.dtype == np.float32 for v in got.values())


@register_model("huge_gradient", hparams={"optimizer": "sgd", "learning_rate": 1e-9, "epochs": 0},
                default_input="tiny")
def huge_gradient(features, labels, mode, params):
    """Each replica's gradient, 40,000 (its half of 80,000), fits float16; their sum does not."""
    w = tf.compat.v1.get_variable("w", [6], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.stack([tf.reduce_sum(features["x"] * w, 1)] * 3, 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = 80000.0 * tf.reduce_sum(w) + 0.0 * tf.reduce_mean(logits)
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=estimator_dist.minimize(loss, params))


def test_an_overflowing_float16_sum_is_named_with_its_fix(tmp_path):
    train(tmp_path / "bf16", "huge_gradient", "mirrored", 2, steps=2, batch_size=6,
          gradient_compression="bf16")  # bfloat16 has float32's range
    with pytest.raises(Exception) as failed:
        train(tmp_path / "fp16", "huge_gradient", "mirrored", 2, steps=2, batch_size=6,
              gradient_compression="fp16")
    message = str(failed.value)
    assert re.search(r"the gradient of 'w(/replica_1)?' after its fp16 all-reduce \(float16 "
                     r"overflows past 65504\) is Inf", message), message
    assert "use --gradient_compression bf16 (float32's range) or none" in message


@pytest.mark.parametrize("flags,message", [
    ({"strategy": "none"}, "--gradient_compression fp16 means nothing with --strategy none "
                           "(no all-reduce of gradients); use it with mirrored, "
                           "multi_worker_mirrored, horovod, or leave it out"),
    ({"strategy": "tower", "num_devices": 2}, "means nothing with --strategy tower"),
    ({"strategy": "central_storage", "num_devices": 2}, "means nothing with --strategy central_storage"),
    ({"strategy": "mirrored", "num_devices": 2, "accumulate_steps": 2},
     "--gradient_compression fp16 does not work with --accumulate_steps 2"),
])
def test_refused_where_it_means_nothing(flags, message, tmp_path):
    config = make_config("digits", gradient_compression="fp16", model_dir=str(tmp_path / "run"),
                         **flags)
    with pytest.raises(UserError, match=re.escape(message)):
        plan_lib.plan(config)
    assert not (tmp_path / "run").exists()


def test_cli_refuses_an_unknown_setting_and_horovod_bf16(tmp_path):
    result = run_cli("train", "--gradient_compression", "int8", "--model_dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().endswith("--gradient_compression int8: must be none, fp16, bf16")
    with pytest.raises(UserError, match="--strategy horovod compresses to fp16 only"):
        strategies.check_compression("horovod", "bf16", 1)


def test_two_workers_all_reduce_the_gradients_in_float16(tmp_path):
    """A real 2-worker multi_worker_mirrored cluster: the gradients' collective is DT_HALF, and
    the only float32 collectives left are the loss Estimator reports, the preemption vote, the
    exchange of the workers' first-batch fingerprints (identical_batches.py) and the
    checkpoint's sync-on-read reads."""
    result = run_cli("cluster", "--workers", "2", "--model", "digits", "--train_steps", "4",
                     "--gradient_compression", "fp16", "--export", "none",
                     "--model_dir", str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    graph = (tmp_path / "graph.pbtxt").read_text()
    nodes = graph.split("\nnode {")
    reduces = {re.search(r'name: "([^"]+)"', n).group(1): re.search(
        r'key: "T"\s*value \{\s*type: (\w+)', n).group(1)
        for n in nodes if 'op: "CollectiveReduceV2"' in n}
    halves = [name for name, dtype in reduces.items() if dtype == "DT_HALF"]
    others = [name for name, dtype in reduces.items()
              if dtype == "DT_FLOAT" and not name.startswith("save/")]
    assert len(halves) == 1 and len(others) == 3, reduces
    # The float16 pack carries every trainable variable's gradient (one Momentum slot each).
    split = next(n for n in nodes if f'input: "{halves[0]}"' in n and 'op: "SplitV"' in n)
    num_split = int(re.search(r'key: "num_split"\s*value \{\s*i: (\d+)', split).group(1))
    reader = tf.train.load_checkpoint(str(tmp_path))
    slots = [k for k in reader.get_variable_to_shape_map() if k.endswith("/Momentum")]
    assert num_split == len(slots) == 10
