"""The screening modes a method's strategy allows, and the check of a run config's
``screening`` against them, applied to every run config once (``fl_app.registry.method_config``,
for the ServerApp, the ClientApp and the runner alike). What each mode does, and the screening
itself, is ``fl_app.server.screening``.

A strategy class lists the modes it supports in ``SCREENING`` (``strategies/base.py``); the
selection modes (``krum``, ``multi-krum``) come with ``reject`` (both drop whole replies) and
``bulyan``, ``geometric-median`` and ``centered-clip`` with ``median`` (all replace the weights by
a robust value). ``screen-pre`` (``arc``, ``nnm``, ``bucketing``, chained with ``+``) rewrites the
updates before the rule, so the rule's result is no longer any reply's: it too needs ``median``.
"""

from __future__ import annotations

import difflib

from protocol.keys import ConfigError

ROBUST_MODES = ("median", "trimmed-mean", "bulyan", "geometric-median", "centered-clip")
"""The modes that replace every reply's weights by a robust value."""
LIKE_MEDIAN = ("bulyan", "geometric-median", "centered-clip")  # allowed wherever median is
SELECTION_MODES = ("krum", "multi-krum")  # keep some replies whole, drop the others
BYZANTINE_MODES = ("krum", "multi-krum", "bulyan")  # need screen-attackers >= 1
PRE_STEPS = ("arc", "nnm", "bucketing")
"""Pre-aggregation steps of ``screen-pre``: ``arc`` and ``nnm`` take f = ``screen-attackers`` (>= 1)."""
PRE_RULES = ROBUST_MODES + SELECTION_MODES
"""The screening rules a ``screen-pre`` chain can feed."""
PRE_FORMS = "'none' or a '+' chain of arc, nnm, bucketing, each at most once, applied in the order written"


def parse_pre(text: str) -> tuple[str, ...]:
    """The steps of a ``screen-pre`` value ("arc+nnm" -> ("arc", "nnm"); "none" -> ()); a bad
    one raises ``ConfigError`` in one line naming it and the valid forms."""
    if text.strip() == "none":
        return ()
    steps = tuple(s.strip() for s in text.split("+"))
    bad = [s for s in steps if s not in PRE_STEPS]
    if bad or len(set(steps)) != len(steps) or not steps:
        close = difflib.get_close_matches(bad[0], PRE_STEPS, n=1, cutoff=0.6) if bad else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        why = f"unknown step {bad[0]!r}{hint}" if bad else "a step named twice"
        raise ConfigError(f"run-config key 'screen-pre' = {text!r} is invalid: {why}; valid: {PRE_FORMS}")
    return steps


def allowed_modes(strategy_cls: type) -> tuple[str, ...]:
    """The screening modes a strategy supports: its ``SCREENING``, plus the selection modes
    where it allows ``reject`` (both drop whole replies) and ``bulyan`` where it allows
    ``median`` (both replace the weights by a robust value)."""
    declared = tuple(getattr(strategy_cls, "SCREENING", ("clip", "reject")))
    extra = SELECTION_MODES if "reject" in declared else ()
    extra += LIKE_MEDIAN if "median" in declared else ()
    return declared + extra


def check_screening(cfg: dict, strategy_cls: type) -> None:
    """Refuse a screening mode the method's strategy does not support (``allowed_modes``),
    a Byzantine rule without a declared number of attackers, and a ``screen-pre`` chain
    (``check_pre``) the rule or the strategy cannot take."""
    mode = cfg["screening"]
    check_pre(cfg, strategy_cls)
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


def check_pre(cfg: dict, strategy_cls: type) -> None:
    """Refuse a ``screen-pre`` chain without a rule to feed (``PRE_RULES``), ``arc`` or ``nnm``
    without a declared f >= 1, and any chain for a strategy that does not allow ``median``: the
    rule then aggregates rewritten updates, so its result replaces every reply's weights."""
    pre = cfg.get("screen-pre", "none")
    steps = parse_pre(pre)
    if not steps:
        return
    mode, f = cfg["screening"], cfg.get("screen-attackers", 0)
    if mode not in PRE_RULES:
        raise ConfigError(
            f"run-config key 'screen-pre' = {pre!r} is invalid with screening = {mode!r}: a pre-aggregation feeds"
            f" a rule; valid screening with it: {', '.join(PRE_RULES)}"
        )
    needs_f = [s for s in steps if s in ("arc", "nnm")]
    if needs_f and f < 1:
        raise ConfigError(
            f"run-config key 'screen-attackers' = {f!r} is invalid for screen-pre = {pre!r}: {needs_f[0]} needs the"
            f" number of attackers f (an integer >= 1)"
        )
    if "median" not in getattr(strategy_cls, "SCREENING", ("clip", "reject")):
        why = getattr(strategy_cls, "SCREENING_WHY", "")
        raise ConfigError(
            f"run-config key 'screen-pre' = {pre!r} is invalid for strategy {cfg['strategy']!r}"
            f"{': ' + why if why else ''}; it replaces every reply's weights by the rule's value; valid for it: none"
        )
