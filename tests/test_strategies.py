"""Strategy factory and device resolution."""
import pytest
import tensorflow as tf

from estimator_dist.distribute import devices as devices_lib
from estimator_dist.distribute import strategies
from estimator_dist.errors import UserError

CPU2 = devices_lib.Devices(("/cpu:0", "/cpu:1"), "CPU")
CPU1 = devices_lib.Devices(("/cpu:0",), "CPU")


def test_names():
    assert strategies.names() == ["central_storage", "horovod", "mirrored",
                                  "multi_worker_mirrored", "none", "one_device",
                                  "parameter_server", "tower"]


def test_unknown_strategy_lists_valid():
    with pytest.raises(UserError) as e:
        strategies.make("mirored", CPU2)
    assert str(e.value) == ("--strategy mirored: unknown; choose one of central_storage, "
                            "horovod, mirrored, multi_worker_mirrored, none, one_device, "
                            "parameter_server, tower; did you mean 'mirrored'?")


def test_cluster_strategies_count_every_worker():
    assert strategies.num_replicas("multi_worker_mirrored", CPU1, workers=3) == 3
    assert strategies.per_replica_batch("parameter_server", 96, CPU1, workers=3) == 32
    with pytest.raises(UserError, match="runs one replica per CPU worker"):
        strategies.check_devices("multi_worker_mirrored", CPU2)


def test_factory_builds_real_strategies():
    assert strategies.make("none", CPU1) is None
    assert isinstance(strategies.make("one_device", CPU1), tf.distribute.OneDeviceStrategy)
    mirrored = strategies.make("mirrored", CPU2)
    assert isinstance(mirrored, tf.distribute.MirroredStrategy)
    assert mirrored.num_replicas_in_sync == 2
    central = strategies.make("central_storage", CPU2)
    assert central.num_replicas_in_sync == 2


def test_single_device_strategies_refuse_many():
    with pytest.raises(UserError, match="--strategy none runs on one device, got --num_devices 2"):
        strategies.make("none", CPU2)


def test_tower_strategy_is_no_tf_distribute_strategy():
    assert strategies.make("tower", CPU2) is None
    assert strategies.num_replicas("tower", CPU2) == 2
    # input_fn yields the whole global batch; the towers split any size.
    assert strategies.per_replica_batch("tower", 63, CPU2) == 63
    assert strategies.variable_device("tower", "cpu", CPU2) == "/cpu:0"
    gpus = devices_lib.Devices(("/gpu:0", "/gpu:1"), "GPU")
    assert strategies.variable_device("tower", "device0", gpus) == "/gpu:0"
    assert strategies.variable_device("tower", "cpu", gpus) == "/cpu:0"
    assert strategies.variable_device("mirrored", "cpu", gpus) is None
    # The default follows the towers: the first GPU, or the CPU between logical CPUs.
    assert strategies.variable_device("tower", "auto", gpus) == "/gpu:0"
    assert strategies.variable_device("tower", "auto", CPU2) == "/cpu:0"


def test_accumulate_steps_strategies():
    for name in ("none", "one_device", "mirrored", "tower"):
        strategies.check_accumulate(name, 4)
    strategies.check_accumulate("central_storage", 1)
    with pytest.raises(UserError) as e:
        strategies.check_accumulate("central_storage", 4)
    assert str(e.value) == ("--accumulate_steps 4 does not work with --strategy central_storage; "
                            "use one of none, one_device, mirrored, tower")


def test_per_replica_batch():
    assert strategies.per_replica_batch("mirrored", 64, CPU2) == 32
    assert strategies.per_replica_batch("none", 63, CPU1) == 63
    with pytest.raises(UserError) as e:
        strategies.per_replica_batch("mirrored", 63, CPU2)
    assert str(e.value) == ("--batch_size 63 is not divisible by the 2 replicas of --strategy "
                            "mirrored; use a multiple of 2 (e.g. 64)")


def test_devices_resolve_cpu_and_gpu():
    assert devices_lib.resolve(0, gpus=0).names == ("/cpu:0",)
    assert devices_lib.resolve(3, gpus=0).names == ("/cpu:0", "/cpu:1", "/cpu:2")
    assert devices_lib.resolve(0, gpus=4).names == ("/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3")
    assert devices_lib.resolve(2, gpus=4).kind == "GPU"
    with pytest.raises(UserError, match=r"--num_devices 5: this machine has 4 GPU\(s\)"):
        devices_lib.resolve(5, gpus=4)
    with pytest.raises(UserError, match="has no GPU and allows at most"):
        devices_lib.resolve(devices_lib.MAX_LOGICAL_CPUS + 1, gpus=0)


def test_session_config_declares_cpu_count():
    config = CPU2.session_config()
    assert config.device_count["CPU"] == 2 and config.allow_soft_placement


def test_scale_lr_multiplies_by_replicas(tmp_path):
    from conftest import make_config
    from estimator_dist.training import plan as plan_lib
    from estimator_dist.graph import train_op

    plain = plan_lib.plan(make_config(strategy="mirrored", num_devices=2, model_dir=str(tmp_path)))
    scaled = plan_lib.plan(make_config(strategy="mirrored", num_devices=2, scale_lr=True,
                                     model_dir=str(tmp_path)))
    assert plain.params()["lr_scale"] == 1.0 and scaled.params()["lr_scale"] == 2.0
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        lr = train_op.learning_rate({**scaled.params(), "lr_schedule": "constant"})
        assert session.run(lr) == pytest.approx(2 * scaled.params()["learning_rate"])
