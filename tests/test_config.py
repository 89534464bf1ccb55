"""Config: precedence, strict keys, types, YAML errors, save/load."""
import pytest
import yaml

from estimator_dist.training import config as config_lib
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
    (("depth=deep",), "--set depth=deep: 'depth' takes an int (its default is of that type); fix the value"),
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
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe garbage")  # a UnicodeDecodeError traceback
    with pytest.raises(UserError, match=r"^config file '.*binary.yaml' is not UTF-8 text \(byte 0\)"):
        config_lib.load_yaml(str(tmp_path / "binary.yaml"))


def test_a_number_as_a_key_is_an_unknown_key():
    """A TypeError traceback from difflib before."""
    with pytest.raises(UserError, match="^the key '1' does not exist in config file; valid keys"):
        build({1: 2})
    with pytest.raises(UserError, match="^the key '5' does not exist in config file section 'train'"):
        build({"train": {5: 6}})


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


DUPLICATE_MODEL = ("config file '{}' line 3: the key 'model' is given twice (first on line 1); "
                   "YAML would keep only the last, so remove one")


@pytest.mark.parametrize("text,line,key,first", [
    ("model: digits\ntrain: {}\nmodel: tabular\n", 3, "model", 1),
    ("hparams:\n  filters: 8\ntrain:\n  batch_size: 4\nhparams:\n  dropout: 0.1\n", 5, "hparams", 1),
    ("train:\n  batch_size: 4\n  train_steps: 2\n  batch_size: 8\n", 4, "batch_size", 2),
    ("hparams: {a: {b: 1, b: 2}}\n", 1, "b", 1),
])
def test_duplicate_yaml_keys_are_refused_at_any_depth(tmp_path, text, line, key, first):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        config_lib.load_yaml(str(path))
    assert str(e.value) == (f"config file '{path}' line {line}: the key '{key}' is given twice "
                            f"(first on line {first}); YAML would keep only the last, so remove one")


def test_yaml_merge_key_override_is_not_a_duplicate(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: &b {batch_size: 4, train_steps: 2}\ntrain:\n  <<: *b\n  batch_size: 8\n")
    assert config_lib.load_yaml(str(path))["train"] == {"batch_size": 8, "train_steps": 2}


SEED_RANGE = "must be 0..2147483646 (TensorFlow's graph-seed range); leave it out for no seed"


@pytest.mark.parametrize("seed", [-7, -1])
def test_negative_seed_flag_is_refused_not_taken_for_no_seed(seed):
    with pytest.raises(UserError) as e:
        build(flags={"seed": seed})
    assert str(e.value) == f"--seed {seed}: {SEED_RANGE}"


@pytest.mark.parametrize("file_data,flags,message", [
    ({"train": {"seed": -7}}, {}, f"--seed -7: {SEED_RANGE}"),
    ({}, {"seed": 99999999999999999999}, f"--seed 99999999999999999999: {SEED_RANGE}"),
    ({}, {"seed": 2**31 - 1}, f"--seed 2147483647: {SEED_RANGE}"),
    ({}, {"train_steps": 99999999999999999999999},
     "--train_steps 99999999999999999999999: must be at most 9223372036854775807 (the global step "
     "is an int64); give a smaller step count"),
    ({}, {"min_delta": float("nan"), "early_stop": "loss"},
     "--min_delta nan: must be a finite number; give one such as 0.0"),
    ({}, {"min_delta": float("inf"), "early_stop": "loss"},
     "--min_delta inf: must be a finite number; give one such as 0.0"),
    ({"train": {"min_delta": float("nan"), "early_stop": "loss"}}, {},
     "--min_delta nan: must be a finite number; give one such as 0.0"),
])
def test_validate_ranges_name_the_flag(file_data, flags, message):
    with pytest.raises(UserError) as e:
        config_lib.validate(build(file_data, flags))
    assert str(e.value) == message


def test_seed_limits_and_no_seed_pass():
    for flags in ({}, {"seed": 0}, {"seed": 2**31 - 2}):
        config_lib.validate(build(flags=flags))
    # A saved config.yaml of an unseeded run holds the internal "no seed" value.
    assert build().train.seed == config_lib.NO_SEED
    config_lib.validate(build({"train": {"seed": config_lib.NO_SEED}}))


def test_min_delta_nan_in_yaml_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  early_stop: loss\n  min_delta: .nan\n")
    with pytest.raises(UserError, match=r"^--min_delta nan: must be a finite number"):
        config_lib.validate(build(config_lib.load_yaml(str(path))))


IGNORED = [
    ({"variable_device": "device0"},
     "--variable_device device0: only --strategy tower reads it; add --strategy tower or leave "
     "it out"),
    ({"variable_device": "device0", "strategy": "mirrored"},
     "--variable_device device0: only --strategy tower reads it; add --strategy tower or leave "
     "it out"),
    ({"best_metric": "accuracy"},
     "--best_metric accuracy: only --export best reads it; add --export best or leave it out"),
    ({"best_metric": "accuracy", "export": "latest"}, "--best_metric accuracy: only --export best"),
    ({"higher_is_better": True},
     "--higher_is_better: only --early_stop METRIC and --export best read it; add one of them or "
     "leave it out"),
    ({"patience": 7},
     "--patience 7: only --early_stop METRIC reads it; add --early_stop (e.g. --early_stop loss) "
     "or leave it out"),
    ({"min_delta": 0.5},
     "--min_delta 0.5: only --early_stop METRIC reads it; add --early_stop (e.g. --early_stop "
     "loss) or leave it out"),
    ({"warm_start_vars": "nomatch.*"},
     "--warm_start_vars nomatch.*: only --warm_start_from reads it; add --warm_start_from "
     "DIR_OR_CHECKPOINT or leave it out"),
]


@pytest.mark.parametrize("flags,message", IGNORED)
def test_a_flag_that_would_be_ignored_is_refused(flags, message):
    with pytest.raises(UserError) as e:
        config_lib.validate(build(flags=flags))
    assert str(e.value).startswith(message)


def test_ignored_setting_in_a_config_file_is_refused():
    with pytest.raises(UserError, match=r"^--patience 5: only --early_stop METRIC reads it"):
        config_lib.validate(build({"train": {"patience": 5}}))


@pytest.mark.parametrize("flags", [
    {"strategy": "tower", "variable_device": "device0"},
    {"strategy": "tower", "variable_device": "cpu"},
    {"variable_device": "cpu"},
    {"export": "best", "best_metric": "accuracy"},
    {"export": "best", "higher_is_better": True},
    {"early_stop": "accuracy", "higher_is_better": True},
    {"early_stop": "loss", "patience": 2, "min_delta": 0.01},
    {"best_metric": "loss", "patience": 3, "min_delta": 0.0, "warm_start_vars": ".*"},  # defaults
])
def test_the_flags_they_need_make_them_pass(flags):
    config_lib.validate(build(flags=flags))


def test_a_saved_tower_run_re_resolved_for_one_cpu_still_validates(tmp_path):
    """evaluate/export rebuild a saved config with --strategy none (commands.saved_config)."""
    saved = build(flags={"strategy": "tower", "variable_device": "device0", "num_devices": 2})
    data = yaml.safe_load(open(config_lib.save(saved, str(tmp_path))))
    again = config_lib.without_ignored(
        config_lib.build_config("m", data, {"strategy": "none", "num_devices": 1}, {}, HPARAMS))
    config_lib.validate(again)
    assert (again.distribute.strategy, again.distribute.variable_device) == ("none", "auto")
    # ... while the same file trained again as it is keeps its tower setting.
    assert config_lib.build_config("m", data, {}, {}, HPARAMS).distribute == saved.distribute


def test_an_hparam_with_a_none_default_takes_a_set_value():
    hparams = {"opt": None, "depth": 20}
    for text, value in (("3", 3), ("0.5", 0.5), ("true", True), ("adam", "adam"), ("[1", "[1")):
        c = config_lib.build_config("m", {}, {}, {}, hparams, (f"opt={text}",))
        assert c.hparams["opt"] == value
    c = config_lib.build_config("m", {"hparams": {"opt": [1, 2]}}, {}, {}, hparams)
    assert c.hparams["opt"] == [1, 2]
