"""Method name -> (server strategy class, client ``LocalUpdate``), one line per method; and the one
place a method is looked up by its name.

A method whose server is FedAvg (the n_k-weighted mean) is registered with ``DriftFedAvg``
itself: it has no strategy module of its own, and its client module's docstring says so. A
method's client side is its ``LocalUpdate`` (clients/<method>.py), which the one generic client
runs; the catalogue (``--list``, the README table, docs/methods.md) is derived from this table.

Both apps (and the runner's checks) resolve a run config here, once (``resolve``): validated
against the whole schema (``spec``: ``strategy``, whose choices are the methods below, the
general keys of ``fl_app.config`` and every method's own keys), its method looked up, and the
method's own checks applied (``method_config``). From there the method is passed down as an
object (``fl_app.common.method.Method``); no module below this one names a method.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Mapping
from typing import Any

from clients import (
    ccvr,
    dp_fedavg,
    fedacg,
    fedasam,
    fedavg,
    fedbn,
    fedcm,
    feddc,
    feddecorr,
    feddyn,
    fedgam,
    fedgam_cv,
    fedgamma,
    fedgela,
    fedinit,
    fedlc,
    fedlesam,
    fedmoswa,
    fednova,
    fedntd,
    fedpgvc,
    fedprox,
    fedpvr,
    fedrs,
    fedsam,
    fedsmoo,
    fedsol,
    fedspeed,
    fedswa,
    mofedsam,
    moon,
    ri_fedavg,
    scaffold,
)
from fl_app.common.execution_checks import check_execution
from fl_app.common.method import Method
from fl_app.common.screening_modes import check_screening
from fl_app.config import GENERAL_KEYS, parse_key_value, toml_value, validate_keys
from protocol.keys import Key
from strategies.base import DriftFedAvg, build_strategy
from strategies.ccvr import CCVRStrategy
from strategies.dp_fedavg import DPFedAvgStrategy
from strategies.fedacg import FedACGStrategy
from strategies.fedadagrad import FedAdagradStrategy
from strategies.fedadam import FedAdamStrategy
from strategies.fedavgm import FedAvgMStrategy
from strategies.fedbn import FedBNStrategy
from strategies.fedcm import FedCMStrategy
from strategies.feddc import FedDCStrategy
from strategies.feddyn import FedDynStrategy
from strategies.fedexp import FedExPStrategy
from strategies.fedgam_cv import FedGAMCVStrategy
from strategies.fedgamma import FedGammaStrategy
from strategies.fedgela import FedGELAStrategy
from strategies.fedlesam import FedLESAMStrategy
from strategies.fedmoswa import FedMoSWAStrategy
from strategies.fednova import FedNovaStrategy
from strategies.fedpgvc import FedPGVCStrategy
from strategies.fedprox import FedProxStrategy
from strategies.fedpvr import FedPVRStrategy
from strategies.fedsmoo import FedSMOOStrategy
from strategies.fedspeed import FedSpeedStrategy
from strategies.fedswa import FedSWAStrategy
from strategies.fedyogi import FedYogiStrategy
from strategies.mofedsam import MoFedSAMStrategy
from strategies.scaffold import ScaffoldStrategy
from tasks.functional.update import LocalUpdate

METHODS: dict[str, Method] = {
    "fedavg": Method(DriftFedAvg, fedavg.UPDATE),
    "fedprox": Method(FedProxStrategy, fedprox.UPDATE),
    "ri-fedavg": Method(DriftFedAvg, ri_fedavg.UPDATE),
    "fedpgvc": Method(FedPGVCStrategy, fedpgvc.UPDATE),
    "feddyn": Method(FedDynStrategy, feddyn.UPDATE),
    "fednova": Method(FedNovaStrategy, fednova.UPDATE),
    "fedbn": Method(FedBNStrategy, fedbn.UPDATE),
    "fedntd": Method(DriftFedAvg, fedntd.UPDATE),
    "moon": Method(DriftFedAvg, moon.UPDATE),
    "dp-fedavg": Method(DPFedAvgStrategy, dp_fedavg.UPDATE),
    "fedsol": Method(DriftFedAvg, fedsol.UPDATE),
    "fedgam": Method(DriftFedAvg, fedgam.UPDATE),
    "fedgam-cv": Method(FedGAMCVStrategy, fedgam_cv.UPDATE),
    "scaffold": Method(ScaffoldStrategy, scaffold.UPDATE),
    "fedpvr": Method(FedPVRStrategy, fedpvr.UPDATE),
    "fedsam": Method(DriftFedAvg, fedsam.UPDATE),
    "fedasam": Method(DriftFedAvg, fedasam.UPDATE),
    "fedsmoo": Method(FedSMOOStrategy, fedsmoo.UPDATE),
    "fedavgm": Method(FedAvgMStrategy, fedavg.UPDATE),
    "fedadam": Method(FedAdamStrategy, fedavg.UPDATE),
    "fedyogi": Method(FedYogiStrategy, fedavg.UPDATE),
    "fedadagrad": Method(FedAdagradStrategy, fedavg.UPDATE),
    "fedrs": Method(DriftFedAvg, fedrs.UPDATE),
    "fedlc": Method(DriftFedAvg, fedlc.UPDATE),
    "feddecorr": Method(DriftFedAvg, feddecorr.UPDATE),
    "fedacg": Method(FedACGStrategy, fedacg.UPDATE),
    "fedexp": Method(FedExPStrategy, fedavg.UPDATE),
    "feddc": Method(FedDCStrategy, feddc.UPDATE),
    "fedspeed": Method(FedSpeedStrategy, fedspeed.UPDATE),
    "fedcm": Method(FedCMStrategy, fedcm.UPDATE),
    "mofedsam": Method(MoFedSAMStrategy, mofedsam.UPDATE),
    "fedgamma": Method(FedGammaStrategy, fedgamma.UPDATE),
    "fedlesam": Method(FedLESAMStrategy, fedlesam.UPDATE),
    "fedinit": Method(DriftFedAvg, fedinit.UPDATE),
    "fedswa": Method(FedSWAStrategy, fedswa.UPDATE),
    "fedmoswa": Method(FedMoSWAStrategy, fedmoswa.UPDATE),
    "fedgela": Method(FedGELAStrategy, fedgela.UPDATE),
    "ccvr": Method(CCVRStrategy, ccvr.UPDATE),
}


DEFAULT_METHOD = "fedavg"  # the run config's default ``strategy``
REFERENCE_METHOD = "fedavg"  # the row a comparison measures every other row against, when it ran


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"unknown strategy {name!r}; valid strategies: {', '.join(METHODS)}")
    return METHODS[name]


def first_paragraph(obj) -> str:
    """The first paragraph of ``obj``'s docstring on one line ("" without a docstring)."""
    return " ".join((inspect.getdoc(obj) or "").split("\n\n")[0].split())


def description(method: Method) -> str:
    """The method's description, a complete sentence: the first paragraph of the docstring of
    the method's own module (``own_module``): the module its ``LocalUpdate`` declares, except for
    a method whose update serves other methods too and whose strategy class is its alone (a
    server-side method on FedAvg's update, say): then its strategy module. It is the single source of ``--list
    methods``, of the README's method table and of the first paragraph of the method's section
    in docs/methods.md (the last two generated, ``python -m runner.listing generate``)."""
    return first_paragraph(sys.modules[own_module(method)])


def documentation(method: Method) -> str:
    """The whole docstring of the method's own module (see ``description``): its description,
    then its update rule, state, keys and readings, and its ``Summary:`` line. The method's
    section of docs/methods.md is generated from it (``runner.listing``)."""
    return inspect.getdoc(sys.modules[own_module(method)]) or ""


def own_module(method: Method) -> str:
    """The module whose docstring documents ``method`` (see ``description``): its update's
    (``LocalUpdate.module``), except for a method whose update serves other methods too and
    whose strategy class is its alone (a server-side method on FedAvg's update): its strategy's."""
    users = [m for m in METHODS.values() if m.update is method.update]
    strategy_users = [m for m in METHODS.values() if m.strategy is method.strategy]
    if len(users) > 1 and len(strategy_users) == 1 and method.strategy is not DriftFedAvg:
        return method.strategy.__module__
    return method.update.module


def client_side(method: Method) -> LocalUpdate:
    """The method's ``LocalUpdate``; anything else (an unmigrated client class, say) refused in
    one line, before any training: every schema check and every run resolve reads it here."""
    if not isinstance(method.update, LocalUpdate):
        raise TypeError(f"a method's client side must be a tasks.functional LocalUpdate, got {method.update!r}"
                        " (docs/contributing.md)")
    return method.update


def config_keys(method: Method) -> dict:
    """One method's own run-config keys: ``CONFIG_KEYS`` of its strategy class and the ``keys`` of
    its update, each declared beside the code that reads it (a key both sides read sits on the
    strategy)."""
    return {**getattr(method.strategy, "CONFIG_KEYS", {}), **client_side(method).keys}


def keys_read(name: str) -> frozenset[str]:
    """Every run-config key a run of the method ``name`` reads: ``strategy`` and the general
    keys (``fl_app.config.GENERAL_KEYS``), which every run reads, and the method's own
    (``config_keys``: its strategy's ``CONFIG_KEYS`` and its update's ``keys``; the keys its
    update ``reads`` are declared on that strategy). A key outside it changes nothing in the
    run, so the runner refuses it where it would be silently ignored (``runner.plan``)."""
    method = get_method(name)
    return frozenset({*general_keys(), *config_keys(method), *client_side(method).reads})


def readers(key: str) -> tuple[str, ...]:
    """The methods whose runs read the method key ``key`` (every method for a general key)."""
    return tuple(name for name in METHODS if key in keys_read(name))


def method_keys() -> dict:
    """Every method's own run-config keys. A key shared by several methods must be the same
    declaration (one ``Key`` object), never two that could disagree on default or range."""
    keys: dict = {}
    for name, method in METHODS.items():
        for key_name, key in config_keys(method).items():
            if keys.setdefault(key_name, key) is not key:
                raise ValueError(
                    f"run-config key {key_name!r} of method {name!r} is declared twice;"
                    " declare it once and share that declaration"
                )
    return keys


# ----------------------------------------------------------------------- the run-config schema
def general_keys() -> dict[str, Key]:
    """The keys every run has: ``strategy`` (one of the registered methods) first, then
    ``fl_app.config.GENERAL_KEYS``."""
    return {"strategy": Key(DEFAULT_METHOD, choices=method_names()), **GENERAL_KEYS}


def spec() -> dict[str, Key]:
    """All run-config keys: the general ones plus every registered method's own."""
    return {**general_keys(), **method_keys()}


def validate_config(raw: Mapping[str, Any]) -> dict:
    """``raw`` checked against the whole schema (``fl_app.config.validate_keys``): a complete,
    typed config, or ConfigError naming the key, the value and what is allowed. The checks of
    one method need the method (``resolve`` applies them)."""
    return validate_keys(raw, spec())


def parse_override(text: str) -> tuple[str, Any]:
    """One ``KEY=VALUE`` override parsed as TOML would, for any key of the schema."""
    return parse_key_value(text, spec())


def toml_table() -> str:
    """The ``[tool.flwr.app.config]`` body for pyproject.toml, generated from ``spec()``.

    Regenerated in place after adding a key by ``python -m runner.listing generate``.
    """
    return "\n".join(f"{name} = {toml_value(key.default)}" for name, key in spec().items())


# ------------------------------------------------------------------------- resolving a run
def resolve(run_config: Mapping[str, Any]) -> tuple[dict, Method]:
    """The run config validated and its method: the one look-up of a method by its name, for
    the ServerApp, the ClientApp and the runner's checks alike (so all agree); from here the
    method is passed down as an object."""
    cfg = validate_config(run_config)
    method = get_method(cfg["strategy"])
    return method_config(cfg, method), method


def method_config(cfg: dict, method: Method) -> dict:
    """``cfg`` (validated) checked and adjusted for its method (``resolve``): its client side (a
    method whose ``update`` is not a ``LocalUpdate`` is refused in one line, whatever the path),
    the screening modes its strategy allows, a cohort it cannot run (``execution``), then its
    strategy class's own ``resolve_config``."""
    client_side(method)
    check_screening(cfg, method.strategy)
    check_execution(cfg, method)
    return method.strategy.resolve_config(cfg)


# Keys that name one run of a setting and cannot change whether its strategy builds: the seed
# only draws the initial weights, the other two say where the run writes.
PER_RUN_KEYS = ("seed", "run-name", "results-dir")


def check_method(raw: Mapping[str, Any], built: set[str] | None = None) -> dict:
    """The ServerApp's own checks of the method (``resolve``) and its strategy built once, as
    the ServerApp will: method-specific refusals (a BN model for FedBN, enough Linear layers for
    FedPGVC, an optimiser SCAFFOLD cannot use, a screening mode the method does not allow, ...)
    then fail before any launch (the runner's checks, ``runner.checks``). The validated config.

    ``built``: the settings (``setting_key``) whose strategy a caller checking many configs has
    built already; a config of one of them (another seed of a sweep's row) is resolved, its
    strategy not built again, and new settings are added."""
    cfg, method = resolve(raw)
    key = setting_key(cfg)
    if built is None or key not in built:
        build_strategy(method.strategy, cfg)
        if built is not None:
            built.add(key)
    return cfg


def setting_key(cfg: Mapping[str, Any]) -> str:
    """``cfg`` less its ``PER_RUN_KEYS``, as canonical JSON: equal for the seeds of one setting."""
    return json.dumps({k: v for k, v in cfg.items() if k not in PER_RUN_KEYS}, sort_keys=True, default=repr)
