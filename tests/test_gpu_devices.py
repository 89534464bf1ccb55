"""GPU device logic with a simulated GPU list (no GPU exists here): what each strategy and role
resolves to with 0, 1, 2 and 8 GPUs, which GPUs a process keeps, Horovod's pinning order."""
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from conftest import REPO
from estimator_dist.distribute import devices as devices_lib
from estimator_dist.distribute import horovod as hvd_lib
from estimator_dist.distribute import strategies
from estimator_dist.errors import UserError


class FakeGpu:
    def __init__(self, index):
        self.name = f"/physical_device:GPU:{index}"
        self.device_type = "GPU"


class Recorder:
    """Stands in for tf.config: records what a process would make visible."""

    def __init__(self, gpus):
        self.gpus, self.visible, self.growth = gpus, None, []
        self.experimental = self

    def list_physical_devices(self, kind):
        return list(self.gpus) if kind == "GPU" else []

    def set_visible_devices(self, devices, kind):
        self.visible = [d.name for d in devices]

    def set_memory_growth(self, device, enable):
        self.growth.append((device.name, enable))


@pytest.fixture
def gpus(monkeypatch):
    def install(count):
        recorder = Recorder([FakeGpu(i) for i in range(count)])
        monkeypatch.setattr(devices_lib, "TF_CONFIG_API", recorder)
        return recorder
    return install


# strategy -> devices used with --num_devices 0 (auto) for 0, 1, 2, 8 GPUs
AUTO = {
    "none": ("/cpu:0", 1, 1, 1), "one_device": ("/cpu:0", 1, 1, 1),
    "mirrored": ("/cpu:0", 1, 2, 8), "central_storage": ("/cpu:0", 1, 2, 8),
    "tower": ("/cpu:0", 1, 2, 8), "multi_worker_mirrored": ("/cpu:0", 1, 2, 8),
    "parameter_server": ("/cpu:0", 1, 2, 8),
}


@pytest.mark.parametrize("strategy", sorted(AUTO))
def test_auto_devices_per_strategy_with_0_1_2_and_8_gpus(strategy, gpus):
    cpu, *gpu_counts = AUTO[strategy]
    for count, expected in zip((0, 1, 2, 8), (1,) + tuple(gpu_counts)):
        recorder = gpus(count)
        devs = devices_lib.resolve(0, single_device=strategies.runs_one_device(strategy))
        assert devs.count == expected and devs.kind == ("GPU" if count else "CPU")
        claimed = strategies.gpus_to_claim(strategy, devs)
        if claimed:
            devices_lib.claim_gpus(claimed)
        # The process keeps exactly the GPUs it computes on, each growing its memory.
        want = [f"/physical_device:GPU:{i}" for i in range(expected)] if count else None
        assert recorder.visible == want
        assert recorder.growth == [(g, True) for g in want or []]


def test_a_cluster_worker_hides_the_gpus_it_does_not_count(gpus):
    """8 GPUs, --num_devices 2: the worker sees 2, so the global batch is what was asked."""
    recorder = gpus(8)
    devs = devices_lib.resolve(2)
    devices_lib.claim_gpus(strategies.gpus_to_claim("multi_worker_mirrored", devs))
    assert recorder.visible == ["/physical_device:GPU:0", "/physical_device:GPU:1"]


def test_horovod_pins_the_local_ranks_gpu_and_refuses_more_ranks_than_gpus(gpus):
    recorder = gpus(8)
    ranks = hvd_lib.Ranks(rank=11, size=16, local_rank=3, local_size=8, launched=True)
    hvd_lib.pin_gpu(ranks)
    assert recorder.visible == ["/physical_device:GPU:3"]
    assert recorder.growth == [("/physical_device:GPU:3", True)]
    assert hvd_lib.devices(0, gpus=8).names == ("/gpu:0",)  # its only visible GPU
    crowded = hvd_lib.Ranks(rank=0, size=9, local_rank=0, local_size=9, launched=True)
    with pytest.raises(UserError, match="9 Horovod ranks on this host but 8 GPU"):
        hvd_lib.pin_gpu(crowded)


PIN_ORDER = textwrap.dedent('''
    import sys
    import tensorflow as tf
    from estimator_dist.distribute import devices
    from estimator_dist.distribute import horovod

    class Probe:
        """tf.config for two fake GPUs; on the pinning call it checks TensorFlow's runtime has
        not started: a runtime setting can still change (it cannot once the first op ran,
        the same rule visibility and memory growth follow)."""
        experimental = None
        def __init__(self):
            self.experimental = self
        def list_physical_devices(self, kind):
            return ["gpu0", "gpu1"] if kind == "GPU" else []
        def set_visible_devices(self, chosen, kind):
            try:
                tf.config.threading.set_intra_op_parallelism_threads(1)
                print("pinned before the runtime started")
            except RuntimeError:
                print("pinned AFTER the runtime started")
        def set_memory_growth(self, device, enable):
            pass

    class Gpu(str):
        name = property(str.__str__)

    devices.TF_CONFIG_API = Probe()
    Probe.list_physical_devices = lambda self, kind: [Gpu("gpu0"), Gpu("gpu1")] if kind == "GPU" else []
    if sys.argv[1] == "eager_op_first":
        tf.constant(1.0) + 1.0
    ranks = horovod.init()
    print("agreed", horovod.agree_on(7))
''')


@pytest.mark.parametrize("order,expected", [("as_the_run_does", "pinned before the runtime started"),
                                            ("eager_op_first", "pinned AFTER the runtime started")])
def test_horovod_pins_before_any_tensorflow_op_runs(order, expected):
    """hvd.init() then the pinning, then the first eager op (the rank agreement): the control
    shows the probe fails when an op ran first."""
    pytest.importorskip("horovod.tensorflow")
    result = subprocess.run([sys.executable, "-c", PIN_ORDER, order], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert expected in result.stdout and "agreed 7" in result.stdout


def test_gpu_strategies_choose_nccl_and_keep_one_gpus_variables_on_it():
    gpu2 = devices_lib.Devices(("/gpu:0", "/gpu:1"), "GPU")
    gpu1 = devices_lib.Devices(("/gpu:0",), "GPU")
    cpu2 = devices_lib.Devices(("/cpu:0", "/cpu:1"), "CPU")
    nccl = tf.distribute.experimental.CommunicationImplementation.NCCL
    auto = tf.distribute.experimental.CommunicationImplementation.AUTO
    assert strategies.communication(gpu2).implementation == nccl
    assert strategies.communication(cpu2).implementation == auto
    assert strategies.parameter_device(gpu1) == "/gpu:0"
    assert strategies.parameter_device(gpu2) == strategies.parameter_device(cpu2) == "/cpu:0"


@pytest.mark.parametrize("gpu,expected", [("1", 1), ("", 0)])
def test_make_gpu_1_builds_horovod_with_nccl(gpu, expected):
    """The Makefile's Horovod build line (a dry run: nothing is built)."""
    result = subprocess.run(["make", "-n", "-B", "horovod", f"GPU={gpu}"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    build = [line for line in result.stdout.splitlines() if "pip install" in line and
             "horovod" in line]
    assert len(build) == 1 and build[0].count("HOROVOD_GPU_OPERATIONS=NCCL") == expected


@pytest.mark.parametrize("count,setting,expected", [
    (2, "auto", "/gpu:0"), (8, "auto", "/gpu:0"), (0, "auto", "/cpu:0"),
    (2, "cpu", "/cpu:0"), (2, "device0", "/gpu:0"), (0, "device0", "/cpu:0"),
])
def test_tower_variables_default_to_the_first_gpu_and_to_the_cpu_without_gpus(
        count, setting, expected, gpus):
    """--variable_device auto (the default): the towers' one set of variables, and so the
    gradient combine and update, on GPU:0 when the towers are GPUs (on /cpu:0 every gradient
    and variable crossed PCIe each step); the explicit values keep meaning what they say."""
    from conftest import make_config
    from estimator_dist.training import plan as plan_lib
    gpus(count)
    flags = {"strategy": "tower", "num_devices": 0 if count else 2, "batch_size": 16}
    if setting != "auto":
        flags["variable_device"] = setting
    p = plan_lib.plan(make_config(**flags))
    assert p.config.distribute.variable_device == setting
    assert strategies.variable_device("tower", setting, p.devices) == expected
    assert f"variables on {expected} |" in plan_lib.describe(p)


def test_a_ps_task_keeps_no_gpu(gpus, monkeypatch):
    """Issue 30 item 6: a ps task's variables landed on its GPU:0; it hides every GPU, while a
    worker of the same cluster keeps the GPUs it computes on."""
    import json

    from conftest import make_config
    from estimator_dist.training import plan as plan_lib

    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    seen = {}
    for task in ("ps", "worker"):
        recorder = gpus(2)
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                    "task": {"type": task, "index": 0}}))
        plan_lib.plan(make_config(strategy="parameter_server", num_devices=1, batch_size=16))
        seen[task] = recorder.visible
    assert seen == {"ps": [], "worker": ["/physical_device:GPU:0"]}
