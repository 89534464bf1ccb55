"""The glue between a TF1 user's code and a run: the params every input call gets, the hint
that fits a failure of the user's code, the launcher's exit-code rule."""
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from conftest import make_config
from estimator_dist.errors import UserError
from estimator_dist.launch import supervisor
from estimator_dist.training import plan as plan_lib
from estimator_dist.training.registry import INPUTS, register_input
from estimator_dist.training.user_code import users_code
from support import REPO, run_cli


def documented_params_keys():
    """The params keys docs/elastic.md's table lists, plus those docs/own-model.md names."""
    text = open(os.path.join(REPO, "docs", "elastic.md")).read()
    table = text.split("## Your own input")[1].split("```")[0]
    keys = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    assert {"start_step", "global_batch_size", "batch_slices", "batches_per_step"} <= keys
    return keys | {"batch_size", "num_replicas", "train_steps", "seed"}


@pytest.fixture
def recorded_inputs():
    seen = {}

    def prepare(params):
        seen["prepare"] = dict(params)
        return {"serving_features": {"x": [[2], "float32"]}}

    def input_fn(mode, params):
        seen.setdefault(mode, dict(params))
        return tf.data.Dataset.from_tensors(({"x": np.zeros([2], np.float32)}, 0)).batch(1)

    register_input("keys_with_prepare", prepare=prepare)(input_fn)
    register_input("keys_without_prepare")(input_fn)
    yield seen
    INPUTS.unregister("keys_with_prepare")
    INPUTS.unregister("keys_without_prepare")


@pytest.mark.parametrize("name, call", [("keys_with_prepare", "prepare"),
                                        ("keys_without_prepare", tf.estimator.ModeKeys.TRAIN)])
def test_prepare_and_the_serving_call_get_every_documented_params_key(name, call,
                                                                       recorded_inputs, tmp_path):
    config = make_config(input=name, strategy="mirrored", num_devices=2, batch_size=8,
                         model_dir=str(tmp_path / "run"))
    p = plan_lib.plan(config)
    got = recorded_inputs[call]
    assert documented_params_keys() <= set(got), documented_params_keys() - set(got)
    assert got["start_step"] == 0 and got["global_batch_size"] == 8
    assert got["batch_slices"] == 2 and got["batches_per_step"] == 1
    assert {k: got[k] for k in documented_params_keys()} == \
        {k: p.params()[k] for k in documented_params_keys()}
