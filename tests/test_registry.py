"""Registry: decorator registration, signature checks, duplicates, helpful misses."""
import re

import pytest

from estimator_dist.errors import UserError
from estimator_dist.training import registry
from estimator_dist.training.registry import INPUTS, MODELS, Registry, check_data_flags, snake_case


def fresh():
    return Registry("model", ("features", "labels", "mode", "params", "config"), ("features",))


def test_register_and_get():
    reg = fresh()

    @reg.register("tiny", hparams={"lr": 0.1})
    def model_fn(features, labels, mode, params):
        """A tiny model."""

    entry = reg.get("tiny")
    assert entry.fn is model_fn and entry.hparams == {"lr": 0.1} and entry.doc == "A tiny model."


def test_default_name_is_snake_case():
    reg = fresh()

    @reg.register()
    def MyFancyModel(features, labels):  # noqa: N802
        pass

    assert reg.names() == ["my_fancy_model"]
    assert snake_case("ResNet20Cifar") == "res_net20_cifar"


def test_duplicate_is_an_error():
    reg = fresh()
    reg.register("a")(lambda features: None)
    with pytest.raises(UserError, match="'a' is already registered"):
        reg.register("a")(lambda features: None)


def test_miss_lists_names_and_closest():
    reg = fresh()
    for name in ("digits", "cifar", "tabular"):
        reg.register(name)(lambda features: None)
    with pytest.raises(UserError) as e:
        reg.get("cifra")
    assert str(e.value) == ("unknown model 'cifra'; registered: cifar, digits, tabular; "
                            "did you mean 'cifar'? (register your own with --import my.module)")


@pytest.mark.parametrize("fn", [
    lambda feats, labels: None,          # unknown argument name
    lambda labels, mode: None,           # features missing
    lambda features, labels, extra: None,
])
def test_bad_signature_rejected(fn):
    with pytest.raises(UserError, match="has arguments"):
        fresh().register("bad")(fn)


@pytest.mark.parametrize("args", ["features", "features, labels", "features, mode",
                                  "features, labels, mode, params, config", "features, params"])
def test_every_estimator_signature_accepted(args):
    fn = eval(f"lambda {args}: None")  # noqa: S307
    fresh().register("ok")(fn)


def test_builtins_registered():
    assert "digits" in MODELS and "digits" in INPUTS
    assert MODELS.get("digits").default_input == "digits"


def test_model_fns_need_not_take_params_but_must_take_features():
    """Estimator accepts a model_fn without params (issue 29); the runner hands it only what
    it takes (model_fn_wrap.estimator_call)."""
    try:
        MODELS.register("no_params_here")(lambda features, labels, mode: None)
        assert "no_params_here" in MODELS
    finally:
        MODELS.unregister("no_params_here")
    with pytest.raises(UserError, match=r"required: \(features\); add features$"):
        MODELS.register("no_features_here")(lambda labels, mode: None)


def test_declared_data_flags_refuse_what_the_input_does_not_read(monkeypatch):
    monkeypatch.setattr(registry, "INPUTS", Registry("input", registry.INPUT_FN_ARGS, (),
                                                     others_with_default=True))
    registry.register_input("reads_dir", data_flags=("data_dir",))(lambda mode, params: None)
    registry.register_input("reads_none", data_flags=())(lambda mode, params: None)
    registry.register_input("undeclared")(lambda mode, params: None)
    reads_dir, reads_none, undeclared = (registry.INPUTS.get(n) for n in
                                         ("reads_dir", "reads_none", "undeclared"))
    settings = {"data_dir": "/d", "data_path": "", "label_column": "", "synthetic": False,
                "reader_nice": -1}
    check_data_flags(reads_dir, settings)
    check_data_flags(undeclared, dict(settings, data_path="x.csv", synthetic=True))
    with pytest.raises(UserError) as e:
        check_data_flags(reads_none, settings)
    assert str(e.value) == ("--data_dir '/d': input 'reads_none' does not read it (it reads none "
                            "of --data_dir, --data_path, --label_column, --synthetic, "
                            "--reader_nice); drop it, or use --input reads_dir")
    with pytest.raises(UserError) as e:
        check_data_flags(reads_dir, dict(settings, synthetic=True))
    assert str(e.value) == ("--synthetic: input 'reads_dir' does not read it (it reads only "
                            "--data_dir); drop it")


@pytest.mark.parametrize("flags", ["data_dir", ("data_dirs",)])
def test_data_flags_must_name_data_flags(flags):
    with pytest.raises(UserError, match="must be a tuple of data_dir, data_path"):
        registry.register_input("bad_flags", data_flags=flags)


def test_builtin_inputs_declare_what_they_read():
    assert {n: INPUTS.get(n).data_flags for n in ("cifar", "digits", "tabular")} == {
        "cifar": ("data_dir", "synthetic", "reader_nice"), "digits": ("synthetic",),
        "tabular": ("data_dir", "data_path", "label_column", "synthetic")}


@pytest.mark.parametrize("nice", [0, 5, 19])
def test_reader_nice_given_is_refused_by_an_input_without_reader_threads(nice, monkeypatch):
    """-1 is "not given" (the default 19 where there is a reader); 0 is a value given."""
    monkeypatch.setattr(registry, "INPUTS", Registry("input", registry.INPUT_FN_ARGS, (),
                                                     others_with_default=True))
    registry.register_input("threads", data_flags=("reader_nice",))(lambda mode, params: None)
    registry.register_input("no_threads", data_flags=("synthetic",))(lambda mode, params: None)
    registry.register_input("undeclared")(lambda mode, params: None)
    threads, no_threads, undeclared = (registry.INPUTS.get(n) for n in
                                       ("threads", "no_threads", "undeclared"))
    settings = {"data_dir": "", "data_path": "", "label_column": "", "synthetic": False}
    check_data_flags(no_threads, dict(settings, reader_nice=-1))
    check_data_flags(threads, dict(settings, reader_nice=nice))
    check_data_flags(undeclared, dict(settings, reader_nice=nice))
    with pytest.raises(UserError) as e:
        check_data_flags(no_threads, dict(settings, reader_nice=nice))
    assert str(e.value) == (f"--reader_nice {nice}: input 'no_threads' does not read it (it reads "
                            f"only --synthetic); drop it, or use --input threads")


@pytest.mark.parametrize("hparams, message", [
    # The run's batch_size silently replaced it, and --set batch_size=5 did nothing.
    ({"batch_size": 3}, "model 'bad_hparams': an hparam may not be named batch_size: the run "
                        "puts its own setting of that name into params"),
    # A traceback from YAML when config.yaml was written, leaving an empty model_dir.
    ({"fn": object()}, "model 'bad_hparams': hparam 'fn' = <object object at "),
    ({"nested": {"a": 1}}, "model 'bad_hparams': hparam 'nested' = {'a': 1} is not a plain value"),
])
def test_hparams_the_run_would_replace_or_cannot_save_are_refused(hparams, message):
    with pytest.raises(UserError, match=f"^{re.escape(message)}"):
        registry.register_model("bad_hparams", hparams=hparams)(lambda features, params: None)
    assert "bad_hparams" not in MODELS.names()
    registry.register_model("fine_hparams", hparams={"units": [8, 4], "name": None})(
        lambda features, params: None)
    assert "fine_hparams" in MODELS.names()
    MODELS._entries.pop("fine_hparams")


def test_run_params_are_what_the_run_puts_into_params():
    from estimator_dist.training import plan as plan_lib
    from conftest import make_config

    p = plan_lib.plan(make_config("digits"))
    meta = set(p.input_meta)  # what the input's prepare() adds (eval_examples for digits)
    assert set(p.params()) - set(p.config.hparams) - meta == set(registry.RUN_PARAMS)
