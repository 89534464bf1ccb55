"""Config: precedence, strict keys, types, YAML errors, save/load."""
import pytest
import yaml

from estimator_dist import config as config_lib
from estimator_dist.errors import UserError

HPARAMS = {"learning_rate": 0.1, "depth": 20, "nesterov": False, "optimizer": "sgd"}


def build(file_data=None, flags=None, overrides=(), run_defaults=None):
    return config_lib.build_config("m", file_data or {}, flags or {}, run_defaults or {},
                                   HPARAMS, tuple(overrides))


def test_precedence_defaults_model_file_flags():
    c = build({"train": {"batch_size": 16, "train_steps": 7}}, {"train_steps": 9},
              run_defaults={"batch_size": 8, "keep_checkpoint_max": 2})
    assert (c.train.batch_size, c.train.train_steps, c.train.keep_checkpoint_max) == (16, 9, 2)


def test_set_overrides_typed():
    c = build({"hparams": {"learning_rate": 0.5}},
              overrides=("depth=32", "nesterov=true", "optimizer=adam"))
    assert dict(c.hparams) == {"learning_rate": 0.5, "depth": 32, "nesterov": True,
                               "optimizer": "adam"}


def test_config_is_frozen():
    c = build()
    with pytest.raises(Exception):
        c.train.batch_size = 3  # noqa
    with pytest.raises(TypeError):
        c.hparams["depth"] = 3


@pytest.mark.parametrize("overrides,message", [
    (("lr=0.1",), "the key 'lr' does not exist in the hparams of model 'm'; valid keys: depth, "
                  "learning_rate, nesterov, optimizer"),
    (("depth=deep",), "--set depth=deep: 'depth' takes a int (its default is of that type); fix the value"),
    (("depth",), "--set 'depth' is not key=value; e.g. --set learning_rate=0.1"),
    (("nesterov=maybe",), "--set nesterov=maybe: 'nesterov' takes a bool"),
])
def test_bad_set(overrides, message):
    with pytest.raises(UserError) as e:
        build(overrides=overrides)
    assert str(e.value).startswith(message)


def test_unknown_file_keys_fail_listing_valid():
    with pytest.raises(UserError, match="the key 'batch' does not exist in config file section "
                                        "'train'; valid keys: .*batch_size.*did you mean 'batch_size'"):
        build({"train": {"batch": 3}})
    with pytest.raises(UserError, match="the key 'trian' does not exist in config file"):
        build({"trian": {}})
    with pytest.raises(UserError, match="the key 'modle' does not exist"):
        config_lib.check_top_level({"modle": "x"})


def test_wrong_type_in_file():
    with pytest.raises(UserError, match="'batch_size' must be int, got '64'"):
        build({"train": {"batch_size": "64"}})
    with pytest.raises(UserError, match="'learning_rate' must be float, got 'fast'"):
        build({"hparams": {"learning_rate": "fast"}})


def test_bad_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: digits\ntrain:\n  batch_size: [1, 2\n")
    with pytest.raises(UserError, match=r"config file '.*run.yaml' line \d+: not valid YAML"):
        config_lib.load_yaml(str(path))
    with pytest.raises(UserError, match="does not exist; check the --config path"):
        config_lib.load_yaml(str(tmp_path / "missing.yaml"))
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="must hold a mapping"):
        config_lib.load_yaml(str(tmp_path / "list.yaml"))


@pytest.mark.parametrize("flags,message", [
    ({"batch_size": 0}, "--batch_size 0: must be > 0"),
    ({"train_steps": -1}, "--train_steps -1: must be > 0"),
    ({"export": "all"}, "--export all: must be one of latest, best, final, none"),
    ({"eval_every": 100, "save_checkpoints_steps": 50}, "--eval_every 100 and --save_checkpoints_steps 50 differ"),
    ({"reader_nice": 20}, "--reader_nice 20: must be 0-19"),
    ({"reader_nice": -1}, "--reader_nice -1: must be 0-19"),
])
def test_validate(flags, message):
    with pytest.raises(UserError) as e:
        config_lib.validate(build(flags=flags))
    assert str(e.value).startswith(message)


def test_checkpoint_every():
    assert config_lib.checkpoint_every(build(flags={"eval_every": 30})) == 30
    assert config_lib.checkpoint_every(build(flags={"train_steps": 100})) == 100
    assert config_lib.checkpoint_every(build(flags={"train_steps": 5000})) == 500


def test_save_and_reload_round_trip(tmp_path):
    c = build({"train": {"batch_size": 16}}, overrides=("depth=8",))
    path = config_lib.save(c, str(tmp_path), extra={"replicas": 2})
    data = yaml.safe_load(open(path))
    assert data["resolved"] == {"replicas": 2}
    data.pop("resolved")
    again = config_lib.build_config("m", data, {}, {}, HPARAMS)
    assert again == c
