"""Who takes part in a round: simulated drop-outs (``drop-rate``) and the rule that stops a
run when too few sampled clients return a usable update (``min-fit-fraction``)."""

from __future__ import annotations

import math

import numpy as np


class RunAborted(RuntimeError):
    """Too few sampled clients succeeded in a round to go on."""


class Participation:
    """``select`` drops clients from a round's instructions; ``shortfall`` says why the round
    had too few usable updates (else '')."""

    def __init__(self, cfg: dict):
        self.seed = cfg["seed"]
        self.drop_rate = cfg["drop-rate"]
        self.min_fit_fraction = cfg["min-fit-fraction"]
        self.sampled = 0

    def select(self, server_round: int, instructions: list) -> tuple[list, int]:
        """The instructions kept and how many were dropped: each sampled client is dropped with
        probability drop-rate, reproducibly from the seed and round."""
        kept, dropped = instructions, 0
        if self.drop_rate > 0 and instructions:
            rng = np.random.default_rng([self.seed, server_round, 0xD809])
            keep = rng.random(len(instructions)) >= self.drop_rate
            dropped = int((~keep).sum())
            kept = [ins for ins, k in zip(instructions, keep) if k]
        self.sampled = len(kept)
        return kept, dropped

    def shortfall(self, server_round: int, accepted: int, returned: int, failed: int) -> str:
        """Why the round cannot go on: fewer than ``min-fit-fraction`` of the clients sampled by
        ``select`` returned a usable update ('' when enough did)."""
        needed = self.min_fit_fraction * self.sampled
        if accepted >= needed:
            return ""
        return (
            f"round {server_round}: only {accepted} of {self.sampled} sampled clients returned "
            f"a usable update ({failed} failed, {returned - accepted} rejected); "
            f"min-fit-fraction = {self.min_fit_fraction} needs {math.ceil(needed)}"
        )
