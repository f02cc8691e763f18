"""Method name -> (server strategy class, client class). One line per method."""

from __future__ import annotations

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
from strategies.dp_fedavg import DPFedAvgStrategy
from strategies.fedadagrad import FedAdagradStrategy
from strategies.fedadam import FedAdamStrategy
from strategies.fedasam import FedASAMStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.fedavgm import FedAvgMStrategy
from strategies.fedbn import FedBNStrategy
from strategies.feddyn import FedDynStrategy
from strategies.fedgam import FedGAMStrategy
from strategies.fedgam_cv import FedGAMCVStrategy
from strategies.fednova import FedNovaStrategy
from strategies.fedntd import FedNTDStrategy
from strategies.fedpgvc import FedPGVCStrategy
from strategies.fedprox import FedProxStrategy
from strategies.fedpvr import FedPVRStrategy
from strategies.fedsam import FedSAMStrategy
from strategies.fedsmoo import FedSMOOStrategy
from strategies.fedsol import FedSOLStrategy
from strategies.fedyogi import FedYogiStrategy
from strategies.moon import MoonStrategy
from strategies.ri_fedavg import RIFedAvgStrategy
from strategies.scaffold import ScaffoldStrategy


class Method(NamedTuple):
    strategy: type
    client: type


METHODS: dict[str, Method] = {
    "fedavg": Method(FedAvgStrategy, FedAvgClient),
    "fedprox": Method(FedProxStrategy, FedProxClient),
    "ri-fedavg": Method(RIFedAvgStrategy, RIFedAvgClient),
    "fedpgvc": Method(FedPGVCStrategy, FedPGVCClient),
    "feddyn": Method(FedDynStrategy, FedDynClient),
    "fednova": Method(FedNovaStrategy, FedNovaClient),
    "fedbn": Method(FedBNStrategy, FedBNClient),
    "fedntd": Method(FedNTDStrategy, FedNTDClient),
    "moon": Method(MoonStrategy, MoonClient),
    "dp-fedavg": Method(DPFedAvgStrategy, DPFedAvgClient),
    "fedsol": Method(FedSOLStrategy, FedSOLClient),
    "fedgam": Method(FedGAMStrategy, FedGAMClient),
    "fedgam-cv": Method(FedGAMCVStrategy, FedGAMCVClient),
    "scaffold": Method(ScaffoldStrategy, ScaffoldClient),
    "fedpvr": Method(FedPVRStrategy, FedPVRClient),
    "fedsam": Method(FedSAMStrategy, FedSAMClient),
    "fedasam": Method(FedASAMStrategy, FedASAMClient),
    "fedsmoo": Method(FedSMOOStrategy, FedSMOOClient),
    "fedavgm": Method(FedAvgMStrategy, FedAvgClient),
    "fedadam": Method(FedAdamStrategy, FedAvgClient),
    "fedyogi": Method(FedYogiStrategy, FedAvgClient),
    "fedadagrad": Method(FedAdagradStrategy, FedAvgClient),
}


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"unknown strategy {name!r}; valid strategies: {', '.join(METHODS)}")
    return METHODS[name]


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
