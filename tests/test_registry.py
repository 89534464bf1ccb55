"""Registry: decorator registration, signature checks, duplicates, helpful misses."""
import pytest

from estimator_dist.errors import UserError
from estimator_dist.registry import INPUTS, MODELS, Registry, snake_case


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
