"""Run-config key declarations, at the bottom of the layers (``tasks``) so that clients,
strategies and fl_app all import it downwards (it imports nothing of ours).

A method declares its own keys beside the code that reads them with ``Key``: in
``CONFIG_KEYS`` of its client class for a key only the client reads, else of its strategy
class; ``fl_app.registry`` merges them with the general keys (``fl_app.config``) and
validates a run config in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class Key:
    """One run-config key: its default, its type and a check with a human description."""

    default: Any
    check: Callable[[Any], bool] | None = None
    allowed: str = ""
    choices: tuple[str, ...] | None = None

    @property
    def type(self) -> type:
        return type(self.default)


def positive(v: float) -> bool:
    return v > 0


def non_negative(v: float) -> bool:
    return v >= 0


def unit_interval(v: float) -> bool:
    """(0, 1]"""
    return 0 < v <= 1


def at_least(n: int) -> Callable[[Any], bool]:
    return lambda v: v >= n
