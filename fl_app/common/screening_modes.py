"""The screening modes a method's strategy allows, and the check of a run config's
``screening`` against them, applied to every run config once (``fl_app.registry.method_config``,
for the ServerApp, the ClientApp and the runner alike). What each mode does, and the screening
itself, is ``fl_app.server.screening``.

A strategy class lists the modes it supports in ``SCREENING`` (``strategies/base.py``); the
selection modes (``krum``, ``multi-krum``) come with ``reject`` (both drop whole replies) and
``bulyan`` with ``median`` (both replace the weights by a robust value).
"""

from __future__ import annotations

from protocol.keys import ConfigError

ROBUST_MODES = ("median", "trimmed-mean", "bulyan")  # replace every reply's weights by a robust value
SELECTION_MODES = ("krum", "multi-krum")  # keep some replies whole, drop the others
BYZANTINE_MODES = ("krum", "multi-krum", "bulyan")  # need screen-attackers >= 1


def allowed_modes(strategy_cls: type) -> tuple[str, ...]:
    """The screening modes a strategy supports: its ``SCREENING``, plus the selection modes
    where it allows ``reject`` (both drop whole replies) and ``bulyan`` where it allows
    ``median`` (both replace the weights by a robust value)."""
    declared = tuple(getattr(strategy_cls, "SCREENING", ("clip", "reject")))
    extra = SELECTION_MODES if "reject" in declared else ()
    extra += ("bulyan",) if "median" in declared else ()
    return declared + extra


def check_screening(cfg: dict, strategy_cls: type) -> None:
    """Refuse a screening mode the method's strategy does not support (``allowed_modes``),
    and a Byzantine rule without a declared number of attackers."""
    mode = cfg["screening"]
    if mode == "none":
        return
    allowed = allowed_modes(strategy_cls)
    if mode not in allowed:
        why = getattr(strategy_cls, "SCREENING_WHY", "")
        raise ConfigError(
            f"run-config key 'screening' = {mode!r} is invalid for strategy {cfg['strategy']!r}"
            f"{': ' + why if why else ''}; valid choices for it: {', '.join(('none',) + allowed)}"
        )
    if mode in BYZANTINE_MODES and cfg.get("screen-attackers", 0) < 1:
        raise ConfigError(
            f"run-config key 'screen-attackers' = {cfg.get('screen-attackers', 0)!r} is invalid for "
            f"screening = {mode!r}: declare the number of attackers f to resist (an integer >= 1)"
        )
