"""The run header (training/plan.py describe()): the first line of every run says how it trains."""
from conftest import make_config
from estimator_dist.training import plan as plan_lib


def header(tmp_path, **flags):
    config = make_config("digits", (), model_dir=str(tmp_path), **flags)
    return plan_lib.describe(plan_lib.plan(config))


def test_the_header_names_gradient_compression_when_it_is_on(tmp_path):
    """It named accumulation but not --gradient_compression, which changes what the all-reduce
    sends (and the numbers a run gives)."""
    line = header(tmp_path, strategy="mirrored", num_devices=2, batch_size=8,
                  gradient_compression="fp16")
    assert ("global batch 8 = 4 x 2 replica(s), gradients all-reduced in fp16 "
            "(--gradient_compression; applied in float32) | model_dir") in line, line


def test_the_header_says_nothing_of_compression_when_it_is_off(tmp_path):
    line = header(tmp_path, strategy="mirrored", num_devices=2, batch_size=8)
    assert "compression" not in line and "global batch 8 = 4 x 2 replica(s) | model_dir" in line
