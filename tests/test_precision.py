"""--mixed_precision bfloat16: bfloat16 ops in the graph, float32 variables and outputs, refusals, cpu_note."""
import os

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf import saved_model_pb2

from conftest import make_config, quick_train, run_cli
from estimator_dist.cli import main as cli
from estimator_dist.training import config as config_lib
from estimator_dist.graph import precision
from estimator_dist.training import plan as plan_lib
from estimator_dist.training import estimator as estimator_lib
from estimator_dist.errors import UserError
from input_fns.digits import load_arrays
from test_end_to_end import event_losses

MODES = tf.estimator.ModeKeys
CIFAR_REFUSED = ("--mixed_precision bfloat16: model cifar builds no Keras layers "
                 "(tf.compat.v1.layers ignore the mixed precision policy), so nothing would "
                 "compute in bfloat16; drop the flag or build the model_fn from tf.keras.layers")
FLOAT8_REFUSED = "--mixed_precision float8: must be none, bfloat16 or float16"
CPU_NOTE = ("note: this CPU has no native bfloat16 (no avx512_bf16/amx_bf16): bfloat16 is "
            "emulated and slower than float32")
BF16 = tf.bfloat16.as_datatype_enum


def bfloat16_ops(graph_def):
    """Op types computing in bfloat16 (attr T), e.g. {"Conv2D", "MatMul", ...}."""
    return {n.op for n in graph_def.node if "T" in n.attr and n.attr["T"].type == BF16}


def training_graph(model_dir):
    return text_format.Parse(open(os.path.join(model_dir, "graph.pbtxt")).read(),
                             tf.compat.v1.GraphDef())


def exported_graph(export_dir):
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString(open(os.path.join(export_dir, "saved_model.pb"), "rb").read())
    return saved.meta_graphs[0].graph_def


@pytest.fixture(scope="module")
def digits_runs(tmp_path_factory):
    """digits, same seed and steps, float32 and bfloat16."""
    runs = {}
    for mode in ("none", "bfloat16"):
        model_dir = tmp_path_factory.mktemp(f"digits_{mode}")
        runs[mode] = model_dir, quick_train(model_dir, steps=30, mixed_precision=mode)
    return runs


def test_bfloat16_digits_trains_in_bfloat16_with_float32_variables(digits_runs):
    model_dir, summary = digits_runs["bfloat16"]
    assert {"Conv2D", "MatMul", "Conv2DBackpropFilter"} <= bfloat16_ops(training_graph(model_dir))
    dtypes = tf.train.load_checkpoint(str(model_dir)).get_variable_to_dtype_map()
    assert any(name.startswith("digits_cnn/conv1/kernel") for name in dtypes)
    assert set(dtypes.values()) - {tf.int64} == {tf.float32}, dtypes
    losses = event_losses(model_dir)
    assert len(losses) >= 2 and np.all(np.isfinite(losses)), losses
    assert np.mean(losses[-2:]) < losses[0], losses
    assert summary["metrics"]["accuracy"] > 0.3  # 10 classes: chance is 0.1


def test_bfloat16_export_computes_in_bfloat16_and_predicts_float32(digits_runs):
    _, summary = digits_runs["bfloat16"]
    (export,) = summary["exports"]
    assert {"Conv2D", "MatMul"} <= bfloat16_ops(exported_graph(export))
    _, _, eval_x, eval_y = load_arrays(False)
    signature = tf.saved_model.load(export).signatures["serving_default"]
    got = signature(image=tf.constant(eval_x[:64]))
    probabilities = got["probabilities"].numpy()
    assert got["probabilities"].dtype == tf.float32 and probabilities.shape == (64, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert np.mean(got["class_ids"].numpy() == eval_y[:64].reshape(-1)) > 0.3


def test_none_has_no_bfloat16_op(digits_runs):
    model_dir, summary = digits_runs["none"]
    assert bfloat16_ops(training_graph(model_dir)) == set()
    assert bfloat16_ops(exported_graph(summary["exports"][0])) == set()


def build_train_graph(p, image_shape):
    """The run's model_fn (as runner builds it) called once in TRAIN mode, in a fresh graph."""
    batch = p.per_replica_batch
    with tf.Graph().as_default():
        features = {"image": tf.zeros([batch] + image_shape, tf.float32)}
        labels = tf.zeros([batch], tf.int32)
        return estimator_lib.build_model_fn(p)(features=features, labels=labels, mode=MODES.TRAIN,
                                        params=p.params())


def test_cifar_model_fn_refused_in_train_mode():
    p = plan_lib.plan(make_config("cifar", synthetic=True, batch_size=8, train_steps=2,
                                mixed_precision="bfloat16"))
    with pytest.raises(UserError) as info:
        build_train_graph(p, [32, 32, 3])
    assert str(info.value) == CIFAR_REFUSED
    assert tf.keras.mixed_precision.global_policy().name == "float32"


def test_cifar_bfloat16_cli_one_line_exit_2(tmp_path):
    proc = run_cli("train", "--model", "cifar", "--synthetic", "--batch_size", "8",
                   "--train_steps", "2", "--mixed_precision", "bfloat16",
                   "--model_dir", str(tmp_path / "r"), timeout=180)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"estimator-dist: error: {CIFAR_REFUSED}"
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not list((tmp_path / "r").glob("model.ckpt*"))


def test_unknown_precision_refused_naming_the_allowed_values(tmp_path, capsys):
    with pytest.raises(UserError, match=FLOAT8_REFUSED):
        config_lib.validate(make_config(mixed_precision="float8"))
    code = cli.main(["train", "--mixed_precision", "float8", "--model_dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err == f"estimator-dist: error: {FLOAT8_REFUSED}\n"
    assert not (tmp_path / "r").exists()


FLOAT16 = tf.float16.as_datatype_enum
LOSS_SCALE_VARIABLES = {"current_loss_scale", "good_steps"}


@pytest.mark.parametrize("strategy,num_devices", [("none", 1), ("mirrored", 2)])
def test_float16_trains_on_this_cpu_with_a_dynamic_loss_scale(strategy, num_devices, tmp_path):
    """Measured: TF 2.15 runs mixed_float16 Keras layers on a CPU, so float16 is allowed here
    and trained for real: float16 kernels, float32 variables, finite falling loss, and the
    loss scaling optimizer's scale saved in the checkpoint (one, shared by the replicas)."""
    summary = quick_train(tmp_path, steps=30, strategy=strategy, num_devices=num_devices,
                          mixed_precision="float16")
    graph = training_graph(tmp_path)
    assert {"Conv2D", "MatMul", "Conv2DBackpropFilter"} <= {
        n.op for n in graph.node if "T" in n.attr and n.attr["T"].type == FLOAT16}
    reader = tf.train.load_checkpoint(str(tmp_path))
    dtypes = reader.get_variable_to_dtype_map()
    assert LOSS_SCALE_VARIABLES <= set(dtypes), sorted(dtypes)
    assert not [n for n in dtypes if n.startswith(("current_loss_scale_", "good_steps_"))]
    assert set(dtypes.values()) - {tf.int64} == {tf.float32}, dtypes
    scale = reader.get_tensor("current_loss_scale")
    assert 1.0 <= scale <= 2.0 ** 15 and np.isfinite(scale)
    losses = event_losses(tmp_path)
    assert len(losses) >= 2 and np.all(np.isfinite(losses)), losses
    assert summary["metrics"]["global_step"] == 30
    assert summary["metrics"]["accuracy"] > 0.2  # 10 classes: chance is 0.1


def test_float32_and_bfloat16_build_no_loss_scale(digits_runs):
    for mode in ("none", "bfloat16"):
        dtypes = tf.train.load_checkpoint(str(digits_runs[mode][0])).get_variable_to_dtype_map()
        assert not LOSS_SCALE_VARIABLES & set(dtypes)


@pytest.mark.parametrize("flags,message", [
    ({"strategy": "tower", "num_devices": 2},
     "--mixed_precision float16 does not work with --strategy tower yet"),
    ({"accumulate_steps": 2}, "--mixed_precision float16 does not work with --accumulate_steps 2"),
    ({"strategy": "mirrored", "num_devices": 2, "gradient_compression": "fp16"},
     "--mixed_precision float16 does not work with --gradient_compression fp16"),
])
def test_float16_refused_where_nothing_scales_the_loss(flags, message):
    with pytest.raises(UserError, match="^" + message):
        plan_lib.plan(make_config(mixed_precision="float16", **flags))


def test_overflowing_gradients_pass_to_the_loss_scaler_until_its_scale_is_1():
    """With float16 an Inf gradient at a loss scale > 1 is the loss scaler's to skip (it halves
    the scale); at scale 1 the guard fails the step as in float32."""
    from estimator_dist.graph import numerics
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        var = tf.Variable([1.0, 2.0], name="w")
        scale = tf.compat.v1.placeholder(tf.float32, [])
        grad = tf.constant([np.inf, 1.0])
        (checked, _), = numerics.guard(tf.constant(1.0), [(grad, var)], overflow_ok=scale > 1.0)
        assert np.isinf(session.run(checked, {scale: 4.0})[0])
        with pytest.raises(tf.errors.InvalidArgumentError, match="gradient of 'w'"):
            session.run(checked, {scale: 1.0})


@pytest.mark.parametrize("flags,has_gpu,expected", [
    ("fpu sse2 avx2 avx512f", False, CPU_NOTE),
    ("fpu sse2 avx2 avx512f avx512_bf16", False, None),
    ("fpu sse2 amx_tile amx_bf16", False, None),
    ("fpu sse2 avx2", True, None),
])
def test_cpu_note(flags, has_gpu, expected, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert precision.cpu_note("bfloat16", str(cpuinfo), has_gpu=has_gpu) == expected
    assert precision.cpu_note("none", str(cpuinfo), has_gpu=False) is None


def test_float16_cpu_note_only_without_a_gpu():
    assert precision.cpu_note("float16", has_gpu=False) == precision.FLOAT16_CPU_NOTE
    assert "meant for GPUs" in precision.FLOAT16_CPU_NOTE
    assert precision.cpu_note("float16", has_gpu=True) is None


def test_cpu_note_without_cpuinfo(tmp_path):
    assert precision.cpu_note("bfloat16", str(tmp_path / "missing"), has_gpu=False) is None


def test_policy_is_float32_again_after_a_model_fn_call():
    p = plan_lib.plan(make_config(mixed_precision="bfloat16", batch_size=8))
    spec = build_train_graph(p, [8, 8, 1])
    assert spec.loss.dtype == tf.float32
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    with tf.Graph().as_default():
        assert tf.keras.layers.Dense(2)(tf.zeros([1, 3])).dtype == tf.float32

    def failing(features, labels, mode, params):
        raise ValueError("boom")

    with pytest.raises(ValueError):
        precision.wrap_model_fn(failing, "bfloat16", "x")(None, None, MODES.TRAIN, {})
    assert tf.keras.mixed_precision.global_policy().name == "float32"


def test_interleaved_calls_restore_the_policy_once_the_last_ends():
    """MirroredStrategy builds replicas in threads that interleave: enter, enter, exit, exit."""
    first, second = precision.bfloat16_policy(), precision.bfloat16_policy()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert tf.keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    second.__exit__(None, None, None)
    assert tf.keras.mixed_precision.global_policy().name == "float32"


def test_mirrored_bfloat16_leaves_no_policy_behind(tmp_path):
    quick_train(tmp_path, steps=4, strategy="mirrored", num_devices=2,
                mixed_precision="bfloat16", export="none")
    assert "MatMul" in bfloat16_ops(training_graph(tmp_path))
    assert tf.keras.mixed_precision.global_policy().name == "float32"
