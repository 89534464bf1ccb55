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


def hint_of(fn):
    """The one line users_code makes of fn's failure."""
    with pytest.raises(UserError) as raised:
        users_code(fn, "model 'm' could not build its train graph", "check its hparams")
    return str(raised.value)


def test_a_tf1_only_name_gets_its_compat_v1_name_not_the_hparams_advice():
    line = hint_of(lambda: tf.train.MomentumOptimizer(0.1, 0.9))
    assert "tf.train.MomentumOptimizer is TF1-only: use tf.compat.v1.train.MomentumOptimizer; " \
           "run tf_upgrade_v2" in line and "check its hparams" not in line


def test_tf_contrib_gets_its_replacement():
    line = hint_of(lambda: tf.contrib.layers.batch_norm(tf.ones([2, 2])))
    assert "tf.contrib.layers.batch_norm is TF1-only (tf.contrib is gone in TF 2): " \
           "tf.contrib.layers.batch_norm -> tf.compat.v1.layers.batch_normalization" in line
    assert "check its hparams" not in line


def test_params_used_as_an_object_gets_the_dict_spelling():
    params = {"weight_decay": 2e-4}
    line = hint_of(lambda: params.weight_decay)
    assert "params is a dict here, not tf.contrib.training.HParams: read " \
           "params['weight_decay'] instead of params.weight_decay" in line


def test_a_tf1_dataset_iterator_method_gets_its_compat_v1_function():
    dataset = tf.data.Dataset.range(3)
    line = hint_of(lambda: dataset.make_one_shot_iterator())
    assert "Dataset.make_one_shot_iterator is TF1-only: use " \
           "tf.compat.v1.data.make_one_shot_iterator(dataset)" in line


def test_other_failures_keep_the_callers_advice():
    line = hint_of(lambda: {}["units"])
    assert line.endswith("KeyError: 'units'; check its hparams; --verbose shows the traceback")


CONTRIB_MODEL = '''
import tensorflow as tf
import estimator_dist as ed


@ed.register_model("contrib_net", default_input="digits")
def contrib_net(features, labels, mode, params):
    x = tf.contrib.layers.batch_norm(features["image"])
    logits = tf.compat.v1.layers.dense(tf.compat.v1.layers.flatten(x), 10)
    return ed.classification_spec(logits, labels, mode, params)
'''


def test_a_model_fn_using_tf_contrib_is_one_line_naming_the_replacement(tmp_path):
    (tmp_path / "contrib_model.py").write_text(CONTRIB_MODEL)
    done = run_cli("train", "--import", "contrib_model", "--model", "contrib_net",
                   "--train_steps", "2", "--model_dir", "run", cwd=str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "AttributeError: module 'tensorflow' has no attribute 'contrib'; " \
           "tf.contrib.layers.batch_norm is TF1-only" in done.stderr
    assert "tf.compat.v1.layers.batch_normalization" in done.stderr
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("code, permanent", [
    (1, True), (2, True), (3, True), (4, True), (5, True), (127, True),
    (128, False), (130, False), (143, False), (144, False), (255, False), (-9, False), (-15, False)])
def test_the_launcher_follows_the_tfjob_exit_code_rule(code, permanent):
    assert supervisor.permanent(code) is permanent


# What a worker recreated alone meets at its first step (TF 2.15's collective executor).
INCARNATION_ERROR = ("Collective ops is aborted by: Device /job:worker/replica:0/task:0/device:"
                     "CPU:0 current incarnation doesn't match with one in the group. This usually "
                     "means this worker has restarted but the collective leader hasn't, or this "
                     "worker connects to a wrong cluster.")


def test_a_recreated_workers_incarnation_error_is_a_lost_peer_exit_144():
    from estimator_dist.errors import EXIT_PEER_LOST
    from estimator_dist.guards import peers

    error = tf.errors.FailedPreconditionError(None, None, INCARNATION_ERROR)
    assert peers.is_peer_error(error)
    assert peers.peer_failed(error, 7, None).exit_code == EXIT_PEER_LOST == 144
    assert not peers.is_peer_error(tf.errors.FailedPreconditionError(
        None, None, "Attempting to use uninitialized value dense/kernel"))


# What a Horovod rank's grouped all-reduce met when the other rank crashed in the middle of it.
GLOO_RESET = ("[/tmp/pip-install-hto_e3e3/horovod_a50fa28dc0664c0eb61556a737c48813/third_party/"
              "compatible17_gloo/gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:25523: "
              "Connection reset by peer")


def test_a_horovod_rank_that_meets_another_ranks_end_exits_144_saying_what_it_saw():
    from estimator_dist.errors import EXIT_PEER_LOST
    from estimator_dist.guards import peers

    for text, seen in [("Horovod has been shut down. This was caused by an exception on one of "
                        "the ranks or an attempt to allreduce.", "Horovod has been shut down"),
                       (GLOO_RESET, GLOO_RESET)]:
        error = tf.errors.UnknownError(None, None, text)
        assert peers.is_horovod_shut_down(error)
        lost = peers.rank_ended(error, 12, None)
        assert lost.exit_code == EXIT_PEER_LOST and f"another Horovod rank ended ({seen}; " in \
            str(lost)
    assert not peers.is_horovod_shut_down(tf.errors.UnknownError(None, None, "bad label 11"))
