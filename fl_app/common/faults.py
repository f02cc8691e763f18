"""What ``inject-faults`` asks for, parsed in one place: a node raises or returns NaN
(``raise:<partition>``, ``nan:<partition>``), attacks (``Attack``), and the server crashes after
a round (``crash-after:<round>``, ``fl_app/server/crash.py``). The run-config check, the nodes and
the server all read it here.

Where each attack acts (one place per side):

- on the attacker's node (``fl_app/node/attacks.py``): the model-poisoning attacks ``scale``,
  ``flip``, ``noise``, ``adaptive`` and ``gaussian`` rewrite its reply, and ``label-flip`` its
  training labels (``NODE_ATTACKS``);
- at the server, just before screening (``fl_app/server/omniscient.py``): the omniscient attacks
  ``alie``, ``ipm`` and ``mimic`` (``SERVER_ATTACKS``), which are computed from the round's
  honest replies, which no node sees: a simulation-only stand-in for colluding attackers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NODE_ATTACKS = ("scale", "flip", "noise", "adaptive", "gaussian", "label-flip")
SERVER_ATTACKS = ("alie", "ipm", "mimic")
ATTACK_KINDS = NODE_ATTACKS + SERVER_ATTACKS
ATTACK_FORMS = ("scale:<partition>:<factor>[@<round>], flip:<partition>[:<factor>][@<round>], "
                "noise:<partition>:<norm>[@<round>], adaptive:<partition>[:<margin>][@<round>], "
                "gaussian:<partition>[:<sigma>][@<round>], label-flip:<partition>[@<round>], "
                "alie:<partition>[:<z>][@<round>], ipm:<partition>[:<epsilon>][@<round>], mimic:<partition>[@<round>]")
ADAPTIVE_MARGIN = 0.9  # default share of the screening bound an adaptive attacker uses
IPM_EPSILON = 0.1  # Karimireddy et al. (ICLR 2022)'s IPM setting, Xie et al.'s small epsilon
GAUSSIAN_SIGMA = 1.0  # ByzFL's default standard deviation of the Gaussian attack
DEFAULTS = {"flip": 1.0, "adaptive": ADAPTIVE_MARGIN, "ipm": IPM_EPSILON, "gaussian": GAUSSIAN_SIGMA,
            "alie": None}  # alie: z from the paper's z_max formula for the round's n and f
NO_NUMBER = ("label-flip", "mimic")
PARTITION_METRIC = "partition"  # the fit metric naming a reply's partition in a run with SERVER_ATTACKS
POSITIVE = {"flip": "factor", "noise": "norm", "gaussian": "sigma", "ipm": "epsilon", "alie": "z"}


@dataclass(frozen=True)
class Attack:
    """One poisoning attack: ``kind`` in ATTACK_KINDS, its number (None where the kind takes
    none, or for ``alie`` without z: the paper's z_max) and its first round."""

    kind: str
    value: float | None
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
    if kind in NO_NUMBER:
        if numbers:
            raise ValueError(f"{item!r}: {kind} takes no number after the partition")
        return partition, Attack(kind, None, from_round)
    if not numbers and kind in DEFAULTS:
        return partition, Attack(kind, DEFAULTS[kind], from_round)
    if len(numbers) != 1:
        raise ValueError(f"{item!r}: {kind} takes exactly one number after the partition")
    try:
        value = float(numbers[0])
    except ValueError:
        raise ValueError(f"{item!r}: {numbers[0]!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{item!r}: the number must be finite")
    if kind in POSITIVE and value <= 0:
        raise ValueError(f"{item!r}: the {POSITIVE[kind]} must be > 0")
    if kind == "adaptive" and not 0 < value <= 1:
        raise ValueError(f"{item!r}: the margin must be in (0, 1]")
    return partition, Attack(kind, value, from_round)


FAULT_FORMS = f"raise:<partition>, nan:<partition>, crash-after:<round>, {ATTACK_FORMS}"


def parse_faults(text: str) -> dict[int | str, str | int | Attack]:
    """'raise:0,nan:3,crash-after:2,scale:4:100@2' ->
    {0: 'raise', 3: 'nan', 'crash-after': 2, 4: Attack('scale', 100.0, 2)}.
    A bad item raises ValueError naming it."""
    faults: dict = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        kind, _, number = item.partition(":")
        if kind in ATTACK_KINDS:
            partition, attack = parse_attack(item)
            faults[partition] = attack
            continue
        if kind not in ("raise", "nan", "crash-after") or not number.strip().isdigit():
            raise ValueError(f"{item!r}: unknown kind {kind!r} or a missing integer")
        if kind == "crash-after":
            faults[kind] = int(number)
        else:
            faults[int(number)] = kind
    return faults


def server_attacks(text: str) -> dict[int, Attack]:
    """{partition: its attack} of the attacks the server applies (``SERVER_ATTACKS``)."""
    return {k: v for k, v in parse_faults(text).items() if isinstance(v, Attack) and v.kind in SERVER_ATTACKS}
