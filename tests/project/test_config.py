"""Run-config schema: pyproject defaults, validation messages, overrides."""

import tomllib

import pytest

from fl_app.config import ConfigError
from fl_app.registry import method_names, parse_override, spec, toml_table, validate_config
from tests.kit import ROOT


def test_pyproject_table_matches_spec():
    """Flower reads defaults from pyproject; they must equal the schema's defaults."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    expected = tomllib.loads(toml_table())
    assert table == expected
    assert set(table) == set(spec())


def test_defaults_validate():
    cfg = validate_config({})
    assert cfg["strategy"] == "fedavg" and cfg["num-server-rounds"] >= 1


def test_unknown_strategy_lists_every_valid_name():
    with pytest.raises(ConfigError) as err:
        validate_config({"strategy": "nosuch"})
    msg = str(err.value)
    assert "'nosuch'" in msg and "strategy" in msg
    for name in method_names():
        assert name in msg


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("learning-rate", -0.1, "> 0"),
        ("learning-rate", 0, "> 0"),
        ("fraction-fit", 1.5, "(0, 1]"),
        ("alpha", 0.0, "> 0"),
        ("num-server-rounds", 0, ">= 1"),
        ("batch-size", "big", "expected a int"),
        ("momentum", 1.0, "[0, 1)"),
        ("partitioner", "random", "dirichlet, shard, iid"),
        ("dataset", "imagenet", "mnist"),
        ("learning-rate", float("nan"), "must be a finite number > 0"),  # it said "expected a float"
        ("learning-rate", "nan", "must be a finite number > 0"),  # as --set learning-rate=nan gives it
        ("momentum", float("inf"), "must be a finite number in [0, 1)"),
    ],
)
def test_bad_value_names_key_value_and_rule(key, value, fragment):
    with pytest.raises(ConfigError) as err:
        validate_config({key: value})
    msg = str(err.value)
    assert f"'{key}'" in msg and repr(value) in msg and fragment in msg


def test_unknown_key_rejected():
    """Each unknown key with its closest valid one, and where the list is, not the ~140 keys."""
    with pytest.raises(ConfigError, match="unknown run-config key") as err:
        validate_config({"learning_rate": 0.1})
    assert "'learning_rate' (did you mean 'learning-rate'?)" in str(err.value) and "--list keys" in str(err.value)
    assert "batch-size" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate_config({"zzzz": 1, "local-epoch": 2})
    assert str(err.value).startswith("unknown run-config keys 'local-epoch' (did you mean 'local-epochs'?), 'zzzz';")


def test_model_must_fit_dataset():
    with pytest.raises(ConfigError, match="logreg"):
        validate_config({"dataset": "synthetic", "model": "cnn"})
    with pytest.raises(ConfigError, match="image dataset"):
        validate_config({"dataset": "mnist", "model": "logreg"})


def test_int_accepted_for_float_and_types_coerced():
    cfg = validate_config({"learning-rate": 1, "num-server-rounds": 4.0})
    assert cfg["learning-rate"] == 1.0 and isinstance(cfg["learning-rate"], float)
    assert cfg["num-server-rounds"] == 4 and isinstance(cfg["num-server-rounds"], int)


def test_parse_override():
    assert parse_override("learning-rate=0.05") == ("learning-rate", 0.05)
    assert parse_override("dataset='cifar10'") == ("dataset", "cifar10")
    assert parse_override("num-server-rounds=7") == ("num-server-rounds", 7)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("learning-rate")
    with pytest.raises(ConfigError, match="unknown run-config key 'nope'"):
        parse_override("nope=1")


@pytest.mark.parametrize("name", method_names())
def test_every_method_validates_with_defaults(name):
    """Each registered method's own hooks run inside validation (resolve_config)."""
    cfg = validate_config({"strategy": name})
    assert cfg["strategy"] == name


def test_model_choices_come_from_the_model_builders():
    """One list of models (tasks.models.BUILDERS): the schema's choices and the image/flat split
    derive from it, so a model added there is valid at once and fits exactly one kind of data."""
    from fl_app.config import FLAT_MODELS, IMAGE_MODELS, MODELS
    from tasks.models import BUILDERS

    assert spec()["model"].choices == MODELS == tuple(BUILDERS)
    assert set(IMAGE_MODELS) | set(FLAT_MODELS) == set(BUILDERS)
    assert not set(IMAGE_MODELS) & set(FLAT_MODELS)
    for name in FLAT_MODELS:
        validate_config({"dataset": "synthetic", "model": name})
    for name in IMAGE_MODELS:
        validate_config({"dataset": "mnist", "model": name})


def test_a_method_key_declared_twice_is_refused(monkeypatch):
    """Two declarations of one key could disagree on default or range, and the merge would keep
    one of them silently; method_keys refuses that (a shared key reuses one declaration)."""
    from dataclasses import replace

    from clients.fedavg import UPDATE
    from fl_app import registry
    from protocol.keys import Key

    clash = replace(UPDATE, name="clash", keys={"sam-rho": Key(0.5)})  # FedSAM declares its own sam-rho
    methods = {**registry.METHODS, "clash": registry.Method(registry.METHODS["fedavg"].strategy, clash)}
    monkeypatch.setattr(registry, "METHODS", methods)
    with pytest.raises(ValueError, match="'sam-rho' of method 'clash' is declared twice"):
        registry.method_keys()


def test_every_method_key_is_listed_with_its_method():
    """``--list`` shows each method's keys from both sides (strategy and client)."""
    from fl_app.registry import METHODS, config_keys
    from runner.listing import methods

    lines = methods()
    for name, method in METHODS.items():
        line = next(line for line in lines if line.split()[:1] == [name])
        for key in config_keys(method):
            assert key in line, (name, key)
