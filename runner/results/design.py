"""Rows identical by design: two rows of an experiment file whose declared settings make them
train the same model, step for step, so that a table showing both shows one result twice.

Read from the settings alone, never from the numbers: a row's run config (the file's
[run-config], the row's [methods.<label>] keys and grid point, every other key at its default)
is brought to a canonical form (``canonical``) and two rows are identical by design when their
canonical forms are equal at every grid point (``identical_rows``). The canonical form is the
row's strategy with the general keys and that strategy's own keys (``fl_app.registry
.config_keys``), after the declared reductions below; keys that only name, file or report a run
(``BOOKKEEPING``) are left out, as are other methods' keys, which the strategy never reads.

A reduction is a statement of the methods' maths, each from the module docstring it cites: with
these key values, this method's update and server are another method's with those key values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fl_app.config import GENERAL_KEYS
from fl_app.registry import config_keys, get_method

# Keys that name, file or report a run and never change what it trains.
BOOKKEEPING = frozenset({"run-name", "results-dir", "data-dir", "tuning-protocol", "target-accuracy", "split-picture",
                         "tracking", "tensorboard", "checkpoint-every", "keep-checkpoint", "wait-for-nodes", "resume"})


@dataclass(frozen=True)
class Reduction:
    """``method`` with every key of ``when`` at its value trains as ``becomes`` with ``sets``."""

    method: str
    when: Mapping[str, object]
    becomes: str
    sets: Mapping[str, object] = field(default_factory=dict)
    why: str = ""

    def applies(self, cfg: Mapping) -> bool:
        return cfg.get("strategy") == self.method and all(cfg.get(k) == v for k, v in self.when.items())


REDUCTIONS = (
    # clients/gam.py: the paper variant's G = g + alpha rho grad f(w + rho g/||g||) is g at alpha = 0;
    # clients/fedgam_cv.py: d = G - c_i + c, c_i and delta c_i as SCAFFOLD's (the direction reading);
    # strategies/fedgam_cv.py: SCAFFOLD's server with D = |S_t|.
    Reduction("fedgam-cv", {"gam-variant": "paper", "gam-cv-alpha": 0.0}, "scaffold",
              {"cv-divisor": "participants", "scaffold-correction": "direction"},
              "FedGAM-CV without its GAM term (gam-cv-alpha = 0) is SCAFFOLD with the divisor |S_t|"),
    # strategies/scaffold.py: D = |S_t| and D = N agree when every client trains every round.
    Reduction("scaffold", {"cv-divisor": "participants", "fraction-fit": 1.0, "drop-rate": 0.0, "inject-faults": ""},
              "scaffold", {"cv-divisor": "total"},
              "SCAFFOLD's divisor |S_t| is N under full participation"),
)


def canonical(cfg: Mapping) -> dict:
    """The settings that decide what a run with the validated config ``cfg`` trains: the
    reductions applied until none applies, then the strategy, the general keys and the
    strategy's own keys, bookkeeping left out."""
    cfg = dict(cfg)
    for _ in range(len(REDUCTIONS) + 1):
        rule = next((r for r in REDUCTIONS if r.applies(cfg)), None)
        if rule is None:
            break
        cfg = {**cfg, **rule.sets, "strategy": rule.becomes}
    own = config_keys(get_method(cfg["strategy"]))
    keys = (set(GENERAL_KEYS) | set(own)) - BOOKKEEPING
    return {"strategy": cfg["strategy"], **{k: cfg[k] for k in sorted(keys) if k in cfg}}


def identical_rows(configs: Mapping[str, list[Mapping]]) -> list[tuple[str, ...]]:
    """The groups of two or more listed names (in the order of ``configs``) identical by design:
    {listed name: its validated configs, one per grid point in the grid's order} with equal
    canonical forms at every point."""
    groups: list[tuple[list, list[str]]] = []
    for name, points in configs.items():
        forms = [canonical(c) for c in points]
        match = next((g for g in groups if g[0] == forms), None)
        if match is None:
            groups.append((forms, [name]))
        else:
            match[1].append(name)
    return [tuple(names) for _, names in groups if len(names) > 1]
