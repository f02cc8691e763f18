"""Paired comparisons of two rows over seeds: the mean difference, its 95% confidence interval
(Student t over seeds) and a verdict on a claimed ordering.

Seeds pair runs: for one seed every method sees the same partitioning (``PartitionSpec`` holds
the seed, not the method) and the same clients each round (``SeededClientManager`` draws from
(seed, draw index) only), so the difference of two methods on one seed removes the split's and
the sampling's share of the variance. The interval is

    mean(d) +- t_{0.975, n-1} * sd(d) / sqrt(n),   d_s = acc_better(s) - acc_worse(s),

over the n seeds both rows ran; its verdict is ``holds`` when the whole interval is above 0,
``refuted`` when it is below 0, ``undecided`` when it contains 0 (or n < 2: no interval).
No scipy: the t quantiles for df 1..30 are the standard table's (3 decimals); beyond 30 the
Cornish-Fisher expansion of t around the normal quantile (error below 1e-3 there).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# t_{0.975, df} for df = 1..30 (two-sided 95%), the standard table.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
Z975 = 1.959964

HOLDS, REFUTED, UNDECIDED = "holds", "refuted", "undecided"


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom = {df} is invalid: must be >= 1")
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Paired:
    """Mean paired difference over ``n`` seeds with its 95% interval [low, high] (NaN for n < 2)."""

    n: int
    mean: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        if self.n < 2 or math.isnan(self.low):
            return UNDECIDED
        if self.low > 0:
            return HOLDS
        if self.high < 0:
            return REFUTED
        return UNDECIDED


def paired_difference(a: dict[int, float], b: dict[int, float]) -> Paired:
    """a - b paired by seed (the keys): only seeds present, and finite, in both count."""
    seeds = sorted(s for s in a.keys() & b.keys() if _finite(a[s]) and _finite(b[s]))
    d = [a[s] - b[s] for s in seeds]
    n = len(d)
    if n == 0:
        return Paired(0, math.nan, math.nan, math.nan)
    mean = sum(d) / n
    if n < 2:
        return Paired(1, mean, math.nan, math.nan)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return Paired(n, mean, mean - half, mean + half)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(frozen=True)
class Claim:
    """A paper's ordering ``better > worse``, with where the paper states it."""

    better: str
    worse: str
    source: str = ""

    def text(self) -> str:
        return f"{self.better} > {self.worse}"


CLAIM = re.compile(r"^\s*([^\s<>()]+)\s*([<>])\s*([^\s<>()]+)\s*(?:\((.*)\))?\s*$")


def parse_claims(claims: list, rows: list[str]) -> list[Claim]:
    """Claims written ``"A > B (source)"`` or ``"A < B (source)"``, A and B rows of the
    experiment; a ``<`` claim is stored turned round (better first). A malformed claim or an
    unknown row raises ValueError naming it and the valid choices."""
    out = []
    for text in claims:
        m = CLAIM.match(str(text))
        if not m:
            raise ValueError(f"claim {text!r} is invalid: write \"A > B (source)\" or \"A < B (source)\"")
        left, rel, right, source = m.groups()
        for name in (left, right):
            if name not in rows:
                raise ValueError(f"claim {text!r} names {name!r}, not a row of the experiment; valid: {rows}")
        better, worse = (left, right) if rel == ">" else (right, left)
        out.append(Claim(better, worse, (source or "").strip()))
    return out


def decimals_for(*values: float, least: int = 4, most: int = 8) -> int:
    """Decimals that show every non-zero value as non-zero (``least`` to ``most``): a tiny
    difference consistent over seeds has a tiny interval that decides a verdict, and printing it
    as '-0.0000 [-0.0001, -0.0000] refuted' would contradict the verdict beside it. Values below
    1e-8 in size (float rounding of equal accuracies) count as zero."""
    digits = least
    while digits < most and any(1e-8 <= abs(v) < 0.5 * 10.0**-digits for v in values if math.isfinite(v)):
        digits += 1
    return digits


def fmt_paired(p: Paired) -> str:
    """'+0.0123 [+0.0050, +0.0196]', the mean alone for one seed, '-' for none; 4 decimals, more
    where one would otherwise read as 0 (``decimals_for``)."""
    if p.n == 0:
        return "-"
    d = decimals_for(p.mean, p.low, p.high)  # the NaN bounds of one seed are skipped
    if p.n < 2:
        return f"{p.mean:+.{d}f} (1 seed, no interval)"
    return f"{p.mean:+.{d}f} [{p.low:+.{d}f}, {p.high:+.{d}f}]"
