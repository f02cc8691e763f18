"""Method name -> (server strategy class, client class). One line per method."""

from __future__ import annotations

from typing import NamedTuple

from clients.fedavg import FedAvgClient
from clients.fedprox import FedProxClient
from strategies.fedavg import FedAvgStrategy
from strategies.fedprox import FedProxStrategy


class Method(NamedTuple):
    strategy: type
    client: type


METHODS: dict[str, Method] = {
    "fedavg": Method(FedAvgStrategy, FedAvgClient),
    "fedprox": Method(FedProxStrategy, FedProxClient),
}


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"unknown strategy {name!r}; valid strategies: {', '.join(METHODS)}")
    return METHODS[name]


def method_keys() -> dict:
    """Every method's own run-config keys (``CONFIG_KEYS`` of its strategy class)."""
    keys: dict = {}
    for method in METHODS.values():
        keys.update(getattr(method.strategy, "CONFIG_KEYS", {}))
    return keys
