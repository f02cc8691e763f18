"""What ``inject-faults`` asks for, parsed in one place: a node raises or returns NaN
(``raise:<partition>``, ``nan:<partition>``), attacks (``fl_app/node/attacks.py``), and the
server crashes after a round (``crash-after:<round>``, ``fl_app/server/crash.py``)."""

from __future__ import annotations

from fl_app.node.attacks import ATTACK_FORMS, ATTACK_KINDS, Attack, parse_attack

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
