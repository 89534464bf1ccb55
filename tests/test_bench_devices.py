"""bench baselines (plain Estimator, Keras fit) run on the project case's devices: its GPUs
when the machine has GPUs (a simulated count: no GPU exists here), else logical CPUs."""
import pytest

from estimator_dist.bench import cases


@pytest.mark.parametrize("driver", ["plain", "keras"])
@pytest.mark.parametrize("n,gpus,expected", [
    (1, 0, ("/cpu:0",)),
    (2, 0, ("/cpu:0", "/cpu:1")),
    (1, 1, ("/gpu:0",)),
    (1, 8, ("/gpu:0",)),
    (2, 2, ("/gpu:0", "/gpu:1")),
    (4, 8, ("/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3")),
])
def test_baselines_use_the_gpus_when_there_are_some_else_logical_cpus(driver, n, gpus, expected):
    assert cases.case_devices({"driver": driver, "num_devices": n}, gpus) == expected


def test_more_devices_than_gpus_is_refused():
    with pytest.raises(ValueError, match="N=4: this machine has 2 GPU"):
        cases.case_devices({"driver": "plain", "num_devices": 4}, 2)


def test_plain_session_config_counts_logical_cpus_only():
    assert cases.plain_session_config(("/gpu:0",)) is None
    assert cases.plain_session_config(("/cpu:0", "/cpu:1")).device_count["CPU"] == 2
    on_gpus = cases.plain_session_config(("/gpu:0", "/gpu:1"))
    assert on_gpus.device_count["CPU"] == 1 and on_gpus.allow_soft_placement


class FakeConfig:
    """Stands in for tf.config: records what a baseline process would make visible."""

    def __init__(self):
        self.visible, self.growth = None, []
        self.experimental = self

    def set_visible_devices(self, devices, kind):
        self.visible = (list(devices), kind)

    def set_memory_growth(self, device, enable):
        self.growth.append((device, enable))


def test_a_gpu_baseline_keeps_its_gpus_with_memory_growth():
    fake = FakeConfig()
    cases.keep_gpus(("/gpu:0", "/gpu:1"), ["G0", "G1", "G2"], config_api=fake)
    assert fake.visible == (["G0", "G1"], "GPU")
    assert fake.growth == [("G0", True), ("G1", True)]
    fake = FakeConfig()
    cases.keep_gpus(("/cpu:0",), [], config_api=fake)
    assert fake.visible is None
