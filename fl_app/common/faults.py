"""What ``inject-faults`` asks for, parsed in one place: a node raises or returns NaN
(``raise:<partition>``, ``nan:<partition>``), attacks (``Attack``, applied by
``fl_app/node/attacks.py``), and the server crashes after a round (``crash-after:<round>``,
``fl_app/server/crash.py``). The run-config check, the nodes and the server all read it here."""

from __future__ import annotations

import math
from dataclasses import dataclass

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
