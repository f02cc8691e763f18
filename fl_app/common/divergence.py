"""A run that diverged, told from its recorded rounds: ``divergence`` is one pure
function of a run's metrics.csv rows and its number of classes, applied by the server when it
writes summary.json (``fl_app/server/recording.py``: ``status`` = "diverged" and the reason under
``diverged``) and by every reader of a kept run, older ones included (``runner/results/report.py``
``run_divergence``), so both say the same of the same rows.

A run that blows up usually keeps going: the server rejects non-finite updates and keeps the
previous model on a non-finite aggregate, so a diverging method ends its rounds with its accuracy
at chance and reads as an ordinary, completed row (a method that "does not work") when the cause
is a step size too big for it. Three recorded signals say so, each with a bound far from
what healthy runs reach (measured on the 536 runs kept in docs/results/runs and on
unclipped FedDC and SCAFFOLD runs, which fell to chance):

- ``train_loss`` (the clients' n_k-weighted mean training loss of the round) not finite, or above
  ``LOSS_FACTOR`` (10) x max(its first recorded value, ln(classes)). ln(classes) is the loss of
  a uniform guess, which any model that is training stays near or below; the floor keeps a
  first round that fits one-class clients almost perfectly (a loss of 0.01) from making an
  ordinary later round look like a blow-up. Healthy kept runs reach at most 2.4 x their first
  round; the diverged ones 9 x to 1e33 x.
- a method's state norm (control variates, FedDyn/FedDC/FedSMOO/FedSpeed corrections, FedACG's
  momentum: every column ``<name>_norm`` or ``<name>_norm_mean``, the client mean, other than
  the server's own per-round diagnostics ``DIAGNOSTIC_NORMS``) not finite, or above
  ``NORM_FACTOR`` (1000) x its largest value in its first ``NORM_REFERENCE_ROUNDS`` (3) recorded
  rounds (the largest, so that a state that starts at zero and is built up over the first rounds
  is not measured against a near-zero value). Healthy kept runs grow theirs at most 23 x (FedSMOO's
  H over 100 rounds); diverged ones by 1e10 to 1e26 (a diverged SCAFFOLD run's: 6.6e7).
- accuracy back at chance after clearly exceeding it: the best evaluated round above
  chance + ``CLEAR_ABOVE_CHANCE`` (0.1) of the room above chance (1 - 1/classes; 0.19 for 10
  classes), the final evaluated round within ``AT_CHANCE`` (0.03) of that room of chance (<= 0.127
  for 10 classes: a collapsed model predicts one or two classes, 0.098-0.116 in the runs above),
  and the round before it not clearly above chance either (the last ``CHANCE_ROUNDS``, 2,
  evaluated rounds, both after the best, below the clear margin): the run is down, not swinging.
  A label-skewed run swings by points from one round to the next, and one low final round
  after rounds well above chance is such a swing; two rounds, not more, because a blow-up late
  in a run leaves few (unclipped FedDC fell from 0.966 to 0.159 and 0.116 in its last two
  rounds). Kept healthy runs end at 0.139 or more after peaks of 0.22-0.27; the diverged ones at
  0.098-0.116 after 0.84-0.97. A run that never exceeded chance (a rate too small or too big
  from the start) did not diverge: it never learnt, and stays "completed" as before.

The reason is the signal that fired first (the earliest round; on a tie: loss, then state
norm, then accuracy), with its values, as a JSON-able dict whose ``text`` is one line; its
``signals`` names every signal that fired.
"""

from __future__ import annotations

import math

LOSS_FACTOR = 10.0
NORM_FACTOR = 1e3
NORM_REFERENCE_ROUNDS = 3
CLEAR_ABOVE_CHANCE = 0.10
AT_CHANCE = 0.03
CHANCE_ROUNDS = 2
# the server's own per-round diagnostics of the updates (fl_app/server/drift.py, screening.py): not a state
DIAGNOSTIC_NORMS = ("drift_norm_mean", "drift_norm_max", "step_norm", "screen_median_norm")
SIGNALS = ("train_loss", "state_norm", "accuracy")  # the order of a tie


def _number(value) -> float | None:
    """A recorded cell as a float; None for an empty or non-numeric cell ('' or None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _series(rows: list[dict], column: str) -> list[tuple[int, float]]:
    """(round, value) of the rows that recorded ``column`` (non-finite values kept)."""
    out = []
    for row in rows:
        value = _number(row.get(column))
        if value is not None:
            out.append((int(row.get("round") or 0), value))
    return out


def state_norm_columns(rows: list[dict]) -> list[str]:
    """The columns of ``rows`` that are a method's state norm (module docstring), sorted."""
    names = {k for row in rows for k in row}
    return sorted(k for k in names if (k.endswith("_norm") or k.endswith("_norm_mean")) and k not in DIAGNOSTIC_NORMS)


def _loss_signal(rows: list[dict], num_classes: int) -> dict | None:
    series = _series(rows, "train_loss")
    if not series:
        return None
    first = next((v for _, v in series if math.isfinite(v)), None)
    reference = max(first if first is not None else 0.0, math.log(max(num_classes, 2)))
    bound = LOSS_FACTOR * reference
    for rnd, value in series:
        if not math.isfinite(value) or value > bound:
            why = "not finite" if not math.isfinite(value) else f"above {LOSS_FACTOR:g} x {reference:.3g}"
            return {"signal": "train_loss", "round": rnd, "column": "train_loss", "value": value,
                    "reference": reference, "bound": bound,
                    "text": f"training loss {value:.3g} in round {rnd} ({why}: its first round's or ln(classes),"
                            f" whichever is larger)"}
    return None


def _norm_signal(rows: list[dict]) -> dict | None:
    found = None
    for column in state_norm_columns(rows):
        series = _series(rows, column)
        start = [v for _, v in series[:NORM_REFERENCE_ROUNDS] if math.isfinite(v)]
        reference = max(start, default=0.0)
        bound = NORM_FACTOR * reference
        for rnd, value in series:
            if not math.isfinite(value) or (reference > 0 and value > bound):
                if found is None or rnd < found["round"]:
                    grown = "not finite" if not math.isfinite(value) else f"{value / reference:.2g} x"
                    found = {"signal": "state_norm", "round": rnd, "column": column, "value": value,
                             "reference": reference, "bound": bound,
                             "text": f"{column} {value:.3g} in round {rnd} ({grown} its largest of the first"
                                     f" {NORM_REFERENCE_ROUNDS} rounds, {reference:.3g}; bound {NORM_FACTOR:g} x)"}
                break
    return found


def _accuracy_signal(rows: list[dict], num_classes: int) -> dict | None:
    evaluated = [(r, v) for r, v in _series(rows, "test_accuracy") if math.isfinite(v)]
    if len(evaluated) < 2 or num_classes < 2:
        return None
    chance = 1.0 / num_classes
    clear = chance + CLEAR_ABOVE_CHANCE * (1 - chance)
    near = chance + AT_CHANCE * (1 - chance)
    best_at = max(range(len(evaluated)), key=lambda i: evaluated[i][1])  # the first of equal bests
    best_round, best = evaluated[best_at]
    after = evaluated[best_at + 1:]
    if best < clear or len(after) < CHANCE_ROUNDS or after[-1][1] > near:
        return None
    if any(v >= clear for _, v in after[-CHANCE_ROUNDS:]):
        return None
    fell = len(after)
    while fell > 0 and after[fell - 1][1] < clear:
        fell -= 1
    rnd = after[fell][0]
    final = after[-1][1]
    return {"signal": "accuracy", "round": rnd, "column": "test_accuracy", "value": final,
            "best_accuracy": best, "best_round": best_round, "chance": chance, "bound": near,
            "text": f"test accuracy back at chance ({final:.3f}, chance {chance:.3g}) from round {rnd} on, after"
                    f" {best:.3f} in round {best_round}"}


def divergence(rows: list[dict], num_classes: int) -> dict | None:
    """Why the run of these metrics.csv ``rows`` (as ``read_metrics`` gives them, or as the server
    keeps them: empty cells '' or None) with ``num_classes`` classes diverged, or None when it did
    not (module docstring: signals and bounds). The reason: ``signal`` (train_loss, state_norm or
    accuracy), ``round``, ``column``, ``value``, the bound and what it was measured from,
    ``text`` (one line) and ``signals`` (every signal that fired)."""
    fired = [s for s in (_loss_signal(rows, num_classes), _norm_signal(rows), _accuracy_signal(rows, num_classes))
             if s is not None]
    if not fired:
        return None
    first = min(fired, key=lambda s: (s["round"], SIGNALS.index(s["signal"])))
    return {**first, "signals": [s["signal"] for s in fired]}
