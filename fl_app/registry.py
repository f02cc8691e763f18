"""Method name -> (server strategy class, client class). One line per method.

A method whose server is FedAvg (the n_k-weighted mean) is registered with ``DriftFedAvg``
itself: it has no strategy module of its own, and its client module's docstring says so.
"""

from __future__ import annotations

import inspect
import sys
from typing import NamedTuple

from clients.dp_fedavg import DPFedAvgClient
from clients.fedasam import FedASAMClient
from clients.fedavg import FedAvgClient
from clients.fedbn import FedBNClient
from clients.feddyn import FedDynClient
from clients.fedgam import FedGAMClient
from clients.fedgam_cv import FedGAMCVClient
from clients.fednova import FedNovaClient
from clients.fedntd import FedNTDClient
from clients.fedpgvc import FedPGVCClient
from clients.fedprox import FedProxClient
from clients.fedpvr import FedPVRClient
from clients.fedsam import FedSAMClient
from clients.fedsmoo import FedSMOOClient
from clients.fedsol import FedSOLClient
from clients.moon import MoonClient
from clients.ri_fedavg import RIFedAvgClient
from clients.scaffold import ScaffoldClient
from strategies.base import DriftFedAvg
from strategies.dp_fedavg import DPFedAvgStrategy
from strategies.fedadagrad import FedAdagradStrategy
from strategies.fedadam import FedAdamStrategy
from strategies.fedavgm import FedAvgMStrategy
from strategies.fedbn import FedBNStrategy
from strategies.feddyn import FedDynStrategy
from strategies.fedgam_cv import FedGAMCVStrategy
from strategies.fednova import FedNovaStrategy
from strategies.fedpgvc import FedPGVCStrategy
from strategies.fedprox import FedProxStrategy
from strategies.fedpvr import FedPVRStrategy
from strategies.fedsmoo import FedSMOOStrategy
from strategies.fedyogi import FedYogiStrategy
from strategies.scaffold import ScaffoldStrategy


class Method(NamedTuple):
    strategy: type
    client: type


METHODS: dict[str, Method] = {
    "fedavg": Method(DriftFedAvg, FedAvgClient),
    "fedprox": Method(FedProxStrategy, FedProxClient),
    "ri-fedavg": Method(DriftFedAvg, RIFedAvgClient),
    "fedpgvc": Method(FedPGVCStrategy, FedPGVCClient),
    "feddyn": Method(FedDynStrategy, FedDynClient),
    "fednova": Method(FedNovaStrategy, FedNovaClient),
    "fedbn": Method(FedBNStrategy, FedBNClient),
    "fedntd": Method(DriftFedAvg, FedNTDClient),
    "moon": Method(DriftFedAvg, MoonClient),
    "dp-fedavg": Method(DPFedAvgStrategy, DPFedAvgClient),
    "fedsol": Method(DriftFedAvg, FedSOLClient),
    "fedgam": Method(DriftFedAvg, FedGAMClient),
    "fedgam-cv": Method(FedGAMCVStrategy, FedGAMCVClient),
    "scaffold": Method(ScaffoldStrategy, ScaffoldClient),
    "fedpvr": Method(FedPVRStrategy, FedPVRClient),
    "fedsam": Method(DriftFedAvg, FedSAMClient),
    "fedasam": Method(DriftFedAvg, FedASAMClient),
    "fedsmoo": Method(FedSMOOStrategy, FedSMOOClient),
    "fedavgm": Method(FedAvgMStrategy, FedAvgClient),
    "fedadam": Method(FedAdamStrategy, FedAvgClient),
    "fedyogi": Method(FedYogiStrategy, FedAvgClient),
    "fedadagrad": Method(FedAdagradStrategy, FedAvgClient),
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
    the method's own module. That is its client module, except for a method whose client class
    serves other methods too and whose strategy class is its alone (a server-side method on
    FedAvg's client, say): then its strategy module. It is the single source of ``--list
    methods``, of the README's method table and of the first paragraph of the method's section
    in docs/methods.md (the last two generated, ``python -m runner.listing generate``)."""
    return first_paragraph(sys.modules[own_class(method).__module__])


def documentation(method: Method) -> str:
    """The whole docstring of the method's own module (see ``description``): its description,
    then its update rule, state, keys and readings, and its ``Summary:`` line. The method's
    section of docs/methods.md is generated from it (``runner.listing``)."""
    return inspect.getdoc(sys.modules[own_class(method).__module__]) or ""


def own_class(method: Method) -> type:
    """The class whose module documents ``method`` (see ``description``)."""
    users = [m for m in METHODS.values() if m.client is method.client]
    strategy_users = [m for m in METHODS.values() if m.strategy is method.strategy]
    if len(users) > 1 and len(strategy_users) == 1 and method.strategy is not DriftFedAvg:
        return method.strategy
    return method.client


def config_keys(method: Method) -> dict:
    """One method's own run-config keys: ``CONFIG_KEYS`` of its strategy class and of its
    client class, each declared beside the code that reads it (a key both sides read sits on
    the strategy). A subclass's dict hides its parent's, so it lists the keys its inherited
    hooks read (``FedGAMCVClient``)."""
    return {**getattr(method.strategy, "CONFIG_KEYS", {}), **getattr(method.client, "CONFIG_KEYS", {})}


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
