"""The omniscient attacks of ``inject-faults`` (``alie``, ``ipm``, ``mimic``), applied at the server
to the accepted replies of a round just before screening: a simulation-only stand-in for f
colluding attackers who see what an omniscient attacker sees in the literature, the round's
honest updates, which no node sees. The attacking clients train as usual (their methods keep
their own state); here their replies are replaced by one vector computed from the honest ones.

Each reply k is one row x_k (float64): its update Delta_k = w_k - w_t over the screened model
arrays (the floating-point ones the server aggregates, as ``fl_app.server.screening`` counts
them), followed by its floating extra arrays after the weights as sent (a method's delta c_i),
so an attacker's extras follow its reply as screening's do: they come from the same rule, and
``mimic`` copies its target's whole contribution. Integer buffers and client-local entries
(``screen_skip``) stay as the attacker's node computed them, and so do its example count and
metrics. Honest rows are those of the partitions without an attack active this round; n = the
round's accepted replies, f = those of partitions with an active attack (any kind). Every
attacker of one kind sends the same vector, as in the papers. The replies carry their
partition (``fl_app.common.faults.PARTITION_METRIC``, which the nodes of such a run report), so
both execution paths are treated alike; summed cohort replies are refused for such a run
(``fl_app.common.execution_checks.sum_problem``). A round without an honest reply leaves the
attackers' replies as computed (logged): there is nothing to craft from.

- ``alie:<p>[:<z>]`` (Baruch et al., "A Little Is Enough", NeurIPS 2019): x = mu - z sigma per
  coordinate, mu and sigma the mean and standard deviation (ddof = 1, as in both codes below;
  0 with a single honest row) of the honest rows. z defaults to the paper's z_max for the
  round's n and f: s = floor(n/2 + 1) - f (the honest workers the attackers need on their side
  for a majority; at least 1 here, where f >= n/2 would leave none), z_max = Phi^-1((n - s)/n)
  (the largest z with Phi(z) < (n - s)/n, Phi the standard normal CDF): n = 10, f = 3 gives
  s = 3 and z = Phi^-1(0.7) = 0.5244. Karimireddy et al.'s code (the ICLR 2022 bucketing paper's
  experiments) takes Phi^-1((n - f - s)/(n - f)) (0.1800 for n = 10, f = 3) and ByzFL a fixed
  z = 1.5 with mu + z sigma; give ``alie:<p>:<z>`` for either value.
- ``ipm:<p>[:<epsilon>]`` (Xie et al., "Fall of Empires", UAI 2020): x = -epsilon x mean of the
  honest rows (epsilon 0.1 by default: the bucketing paper's setting, the paper's small epsilon
  that a mean-based rule lets through; ByzFL's default is 2).
- ``mimic:<p>`` (Karimireddy et al., ICLR 2022): x = the row of one honest client, the honest
  reply of the lowest partition in the round, as ByzFL's ``Mimic`` (a fixed index, 0 by default)
  over the honest replies in partition order. The paper's attacker picks the client maximising
  the variance along a direction it estimates over warm-up rounds (its code's
  ``MimicVariantAttacker``); that choice is not implemented.
"""

from __future__ import annotations

import logging
import math
from statistics import NormalDist

import numpy as np
from flwr.common import FitRes, ndarrays_to_parameters, parameters_to_ndarrays

from fl_app.common.faults import PARTITION_METRIC, SERVER_ATTACKS, Attack, parse_faults
from fl_app.server.screening import screened

log = logging.getLogger("flwr.fl_drift")


def alie_z(n: int, f: int) -> float:
    """The paper's z_max for n workers of which f attack: Phi^-1((n - s)/n), s = floor(n/2 + 1) - f
    (at least 1)."""
    s = max(1, math.floor(n / 2 + 1) - f)
    return NormalDist().inv_cdf((n - s) / n)


def attack_row(attack: Attack, honest: np.ndarray, n: int, f: int) -> np.ndarray:
    """The one row every attacker of ``attack``'s kind sends, from the honest rows ``honest``
    (m x d, float64, m >= 1) of a round of n replies, f of them attackers' (module docstring)."""
    if attack.kind == "alie":
        z = alie_z(n, f) if attack.value is None else attack.value
        sigma = honest.std(axis=0, ddof=1) if len(honest) > 1 else np.zeros(honest.shape[1])
        return honest.mean(axis=0) - z * sigma
    if attack.kind == "ipm":
        return -attack.value * honest.mean(axis=0)
    return honest[0].copy()  # mimic: the honest reply of the lowest partition


def reply_row(arrays: list[np.ndarray], w_t: list[np.ndarray], skip: frozenset[int]) -> np.ndarray:
    """One reply as a row: Delta over the screened model arrays, then its floating extras."""
    n = len(w_t)
    parts = [(arrays[i].astype(np.float64) - w_t[i].astype(np.float64)).ravel()
             for i in range(n) if screened(i, w_t[i], skip)]
    parts += [a.astype(np.float64).ravel() for a in arrays[n:] if np.issubdtype(a.dtype, np.floating)]
    return np.concatenate(parts) if parts else np.zeros(0)


def row_reply(row: np.ndarray, arrays: list[np.ndarray], w_t: list[np.ndarray], skip: frozenset[int]
              ) -> list[np.ndarray]:
    """``arrays`` with the row's values in place (w_t + Delta on the screened model arrays, the
    extras as they are in the row), each in its own dtype; the other arrays unchanged."""
    n, out, start = len(w_t), list(arrays), 0
    for i, a in enumerate(arrays):
        if i < n and not screened(i, w_t[i], skip) or i >= n and not np.issubdtype(a.dtype, np.floating):
            continue
        piece = row[start:start + a.size].reshape(a.shape)
        start += a.size
        out[i] = (w_t[i].astype(np.float64) + piece if i < n else piece).astype(a.dtype)
    return out


class OmniscientAttacks:
    """Applies the run's omniscient attacks to each round's accepted replies (``DriftServer.screen``)."""

    def __init__(self, cfg: dict, skip=()):
        self.attacks = {k: v for k, v in parse_faults(cfg["inject-faults"]).items() if isinstance(v, Attack)}
        self.active = any(a.kind in SERVER_ATTACKS for a in self.attacks.values())
        self.skip = frozenset(skip)

    def apply(self, server_round: int, accepted: list, w_t: list[np.ndarray] | None) -> list:
        """``accepted`` ((proxy, FitRes) in partition order) with the replies of this round's
        omniscient attackers replaced (module docstring); the list itself when none attacks."""
        if not self.active or not accepted or w_t is None:
            return accepted
        partitions = [self.partition_of(client, res) for client, res in accepted]
        live = {p: a for p, a in self.attacks.items() if server_round >= a.from_round}
        targets = [k for k, p in enumerate(partitions) if p in live and live[p].kind in SERVER_ATTACKS]
        if not targets:
            return accepted
        honest = sorted((k for k, p in enumerate(partitions) if p not in live), key=lambda k: partitions[k])
        if not honest:
            log.warning("round %d: no honest reply to craft the omniscient attacks from; the attackers' replies "
                        "are sent as computed", server_round)
            return accepted
        arrays = {k: parameters_to_ndarrays(accepted[k][1].parameters) for k in honest + targets}
        rows = np.stack([reply_row(arrays[k], w_t, self.skip) for k in honest])
        n, f = len(accepted), sum(p in live for p in partitions)
        crafted = {}  # one row per distinct attack (kind and number): its attackers send the same
        out = list(accepted)
        for k in targets:
            attack = live[partitions[k]]
            key = (attack.kind, attack.value)
            if key not in crafted:
                crafted[key] = attack_row(attack, rows, n, f)
            client, res = accepted[k]
            new = row_reply(crafted[key], arrays[k], w_t, self.skip)
            out[k] = (client, FitRes(res.status, ndarrays_to_parameters(new), res.num_examples, res.metrics))
        log.info("round %d: omniscient attacks replaced the replies of partitions %s (n = %d, f = %d)",
                 server_round, sorted(partitions[k] for k in targets), n, f)
        return out

    @staticmethod
    def partition_of(client, res) -> int:
        """The partition a reply names (``PARTITION_METRIC``); a reply without one is refused in one line."""
        value = res.metrics.get(PARTITION_METRIC)
        if not isinstance(value, int):
            raise RuntimeError(f"the reply of node {client.cid} names no partition (fit metric {PARTITION_METRIC!r}),"
                               " which the omniscient attacks of inject-faults need")
        return value
