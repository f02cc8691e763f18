"""Run-config key declarations, at the bottom of the layers (``tasks``) so that clients,
strategies and fl_app all import it downwards (it imports nothing of ours).

A method declares its own keys beside the code that reads them with ``Key``: in the ``keys``
of its ``LocalUpdate`` (``clients/<method>.py``) for a key only the client reads, else in
``CONFIG_KEYS`` of its strategy class (the update then names it in ``reads``);
``fl_app.registry`` merges them with the general keys (``fl_app.config``) and validates a run
config in one place.
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
    """The value when a run does not set the key; its type is the key's type (``type``)."""
    check: Callable[[Any], bool] | None = None
    """True for an allowed value (``positive``, ``unit_interval``, ``at_least(n)``, ...); None: any
    value of the type."""
    allowed: str = ""
    """What ``check`` allows, in words: the refusal's one line and the key reference print it."""
    choices: tuple[str, ...] | None = None
    """The only values allowed, for a key that names one of a few things (a misspelling is answered
    with the closest)."""

    @property
    def type(self) -> type:
        """The type of ``default``: a value of another type is converted where nothing is lost
        (the integer 2 for a float key, the text "true" for a bool key), else refused."""
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


def between(low: float, high: float) -> Callable[[Any], bool]:
    """[low, high] (NaN and infinities refused)."""
    return lambda v: low <= v <= high
