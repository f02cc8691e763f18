"""Model-poisoning attacks for testing defences (``inject-faults`` items ``scale``, ``flip``, ``noise``,
``adaptive``).

Each attack rewrites a client's weight update Delta = w_k - w_t (w_t = the weights the client
received, w_k = its trained weights) before the reply leaves the client:

- ``scale:<partition>:<factor>``  Delta -> factor * Delta (any finite factor);
- ``flip:<partition>[:<factor>]`` Delta -> -factor * Delta (factor > 0, default 1: a plain
  sign flip);
- ``noise:<partition>:<norm>``    Delta -> Gaussian noise rescaled to L2 norm ``norm`` (> 0),
  drawn from a generator seeded by (seed, partition, round), so a run repeats exactly;
- ``adaptive:<partition>[:<margin>]`` Delta -> -(margin * B / ||Delta||) * Delta (margin in
  (0, 1], default 0.9): a sign flip scaled to stay just inside the run's screening bound B,
  which the attacker knows from the run config and estimates with its own honest update norm
  standing for the round's median: B = ``screen-clip-norm`` under ``clip`` when that is > 0,
  else ``screen-clip-multiple`` x ||Delta|| under ``clip``, and ``screen-reject-multiple`` x
  ||Delta|| under every other screening (the bound of ``reject``, the norm filter the
  attacker must pass if the server adds one). With honest updates of similar norms it
  passes ``reject`` and is not cut by ``clip``, while pulling against the honest direction
  with up to that many times an honest client's weight.

A suffix ``@R`` (R >= 1) starts the attack at round R (``scale:3:100@5``); without it the
attack acts from round 1. Only floating-point arrays of the model state change (integer
buffers such as BatchNorm's ``num_batches_tracked`` are sent as trained), and the norm of
``noise`` is taken over those arrays. Arrays after the model state (a method's extras, such
as SCAFFOLD's delta c_i) are sent as computed: the attack is on the model update only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ATTACK_KINDS = ("scale", "flip", "noise", "adaptive")
ATTACK_FORMS = ("scale:<partition>:<factor>[@<round>], flip:<partition>[:<factor>][@<round>], "
                "noise:<partition>:<norm>[@<round>], adaptive:<partition>[:<margin>][@<round>]")
ADAPTIVE_MARGIN = 0.9  # default share of the screening bound an adaptive attacker uses


@dataclass(frozen=True)
class Attack:
    """One poisoning attack: ``kind`` in ATTACK_KINDS, its number and its first round."""

    kind: str
    value: float
    from_round: int = 1


def parse_attack(item: str) -> tuple[int, Attack]:
    """'scale:3:100@5' -> (3, Attack('scale', 100.0, 5)); ValueError naming what is wrong."""
    body, at, start = item.partition("@")
    from_round = 1
    if at:
        if not start.strip().isdigit() or int(start) < 1:
            raise ValueError(f"{item!r}: the round after '@' must be an integer >= 1")
        from_round = int(start)
    kind, *fields = [f.strip() for f in body.split(":")]
    if not fields or not fields[0].isdigit():
        raise ValueError(f"{item!r}: the partition must be a non-negative integer")
    partition, numbers = int(fields[0]), fields[1:]
    if kind in ("flip", "adaptive") and not numbers:
        numbers = ["1" if kind == "flip" else str(ADAPTIVE_MARGIN)]
    if len(numbers) != 1:
        raise ValueError(f"{item!r}: {kind} takes exactly one number after the partition")
    try:
        value = float(numbers[0])
    except ValueError:
        raise ValueError(f"{item!r}: {numbers[0]!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{item!r}: the number must be finite")
    if kind in ("flip", "noise") and value <= 0:
        raise ValueError(f"{item!r}: the {'factor' if kind == 'flip' else 'norm'} must be > 0")
    if kind == "adaptive" and not 0 < value <= 1:
        raise ValueError(f"{item!r}: the margin must be in (0, 1]")
    return partition, Attack(kind, value, from_round)


def screening_bound(cfg: dict, own_norm: float) -> float:
    """The update norm the run's screening lets through, as an adaptive attacker estimates it
    from the run config with its own honest update norm standing for the round's median."""
    if cfg.get("screening") == "clip":
        if cfg.get("screen-clip-norm", 0.0) > 0:
            return cfg["screen-clip-norm"]
        return cfg.get("screen-clip-multiple", 1.0) * own_norm
    return cfg.get("screen-reject-multiple", 3.0) * own_norm


def attacked_reply(fault, reply: list[np.ndarray], received: list[np.ndarray], num_weights: int,
                   seed: int, partition: int, server_round: int, cfg: dict | None = None) -> list[np.ndarray]:
    """``reply`` with its weight update poisoned when ``fault`` is an Attack active this round;
    otherwise ``reply`` itself. ``received`` holds what the server sent (w_t first),
    ``num_weights`` is the number of model state arrays at the front of both lists; ``cfg``
    (the run config) gives the screening bound that ``adaptive`` stays inside."""
    if not isinstance(fault, Attack) or server_round < fault.from_round:
        return reply
    floating = [i for i in range(num_weights) if np.issubdtype(reply[i].dtype, np.floating)]
    deltas = {i: reply[i].astype(np.float64) - received[i].astype(np.float64) for i in floating}
    if fault.kind == "scale":
        new = {i: fault.value * d for i, d in deltas.items()}
    elif fault.kind == "flip":
        new = {i: -fault.value * d for i, d in deltas.items()}
    elif fault.kind == "adaptive":
        norm = math.sqrt(sum(float((d**2).sum()) for d in deltas.values()))
        s = fault.value * screening_bound(cfg or {}, norm) / norm if norm > 0 else 0.0
        new = {i: -s * d for i, d in deltas.items()}
    else:  # noise of L2 norm fault.value over all floating arrays
        rng = np.random.default_rng([seed, partition, server_round, 0xA77AC])
        new = {i: rng.standard_normal(d.shape) for i, d in deltas.items()}
        norm = math.sqrt(sum(float((n**2).sum()) for n in new.values()))
        new = {i: n * (fault.value / norm) for i, n in new.items()} if norm > 0 else new
    out = list(reply)
    for i, d in new.items():
        out[i] = (received[i].astype(np.float64) + d).astype(reply[i].dtype)
    return out
