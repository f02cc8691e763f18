"""runner.results.stats: the t quantiles, the paired interval and the verdicts, against hand computations."""

import math

import pytest

from runner.results.stats import HOLDS, REFUTED, UNDECIDED, Paired, fmt_paired, paired_difference, t975


def test_t_quantiles_table_and_expansion():
    assert t975(1) == 12.706 and t975(2) == 4.303 and t975(4) == 2.776 and t975(30) == 2.042
    assert t975(40) == pytest.approx(2.021, abs=1e-3)   # table value
    assert t975(120) == pytest.approx(1.980, abs=1e-3)  # table value
    assert t975(31) < t975(30)
    with pytest.raises(ValueError, match="degrees of freedom = 0"):
        t975(0)


def test_paired_interval_by_hand():
    # d = 0.02, 0.03, 0.01, 0.04, 0.05 (seed 9 only in a: left out); mean 0.03,
    # sd = sqrt(0.001 / 4) = 0.0158114, t(df 4) = 2.776: half = 2.776 * 0.0158114 / sqrt(5) = 0.019629.
    a = {0: 0.92, 1: 0.93, 2: 0.91, 3: 0.94, 4: 0.95, 9: 0.5}
    b = {0: 0.90, 1: 0.90, 2: 0.90, 3: 0.90, 4: 0.90}
    p = paired_difference(a, b)
    assert p.n == 5
    assert p.mean == pytest.approx(0.03)
    assert p.low == pytest.approx(0.03 - 0.019629, abs=1e-6)
    assert p.high == pytest.approx(0.03 + 0.019629, abs=1e-6)
    assert p.verdict == HOLDS
    assert paired_difference(b, a).verdict == REFUTED


def test_pairing_removes_the_shared_seed_effect():
    """Unpaired, the seeds' spread (0.80 .. 0.95) would swamp a constant +0.01; paired it holds."""
    b = {0: 0.80, 1: 0.95, 2: 0.87}
    a = {0: 0.811, 1: 0.959, 2: 0.880}
    assert paired_difference(a, b).verdict == HOLDS


def test_undecided_cases():
    assert paired_difference({0: 0.9, 1: 0.8}, {0: 0.85, 1: 0.85}).verdict == UNDECIDED  # crosses 0
    one = paired_difference({0: 0.9}, {0: 0.8, 1: 0.7})
    assert one.n == 1 and math.isnan(one.low) and one.verdict == UNDECIDED
    assert paired_difference({0: 0.9}, {1: 0.9}).n == 0
    assert paired_difference({0: 0.9, 1: 0.9}, {0: 0.9, 1: 0.9}).verdict == UNDECIDED  # [0, 0]
    assert paired_difference({0: math.nan, 1: 0.9, 2: 0.8}, {0: 0.1, 1: 0.8, 2: 0.7}).n == 2
    assert Paired(3, 0.0, 0.0, 0.1).verdict == UNDECIDED  # touching 0 is not above it


def test_printed_difference_never_reads_zero_beside_a_verdict():
    """A consistent difference of -0.00002 over 5 seeds (two rows that differ by a fraction of one
    test example) is refuted; at 4 decimals it printed '-0.0000 [-0.0000, -0.0000]', contradicting the
    verdict. Decimals are added until every non-zero number shows (at most 8)."""
    a = {s: 0.90 for s in range(5)}
    b = {s: 0.90002 for s in range(5)}
    b[4] = 0.90003
    p = paired_difference(a, b)
    assert p.verdict == REFUTED
    assert fmt_paired(p) == "-0.00002 [-0.00003, -0.00002]"
    assert fmt_paired(Paired(3, 0.0123, 0.005, 0.0196)) == "+0.0123 [+0.0050, +0.0196]"  # 4 decimals as before
    assert fmt_paired(Paired(2, 0.0, 0.0, 0.0)) == "+0.0000 [+0.0000, +0.0000]"  # equal rows: zero is zero
    assert fmt_paired(Paired(2, 1e-17, -1e-17, 3e-17)) == "+0.0000 [-0.0000, +0.0000]"  # float noise of equal rows
    assert fmt_paired(Paired(1, 3e-5, math.nan, math.nan)) == "+0.00003 (1 seed, no interval)"
    assert fmt_paired(Paired(0, math.nan, math.nan, math.nan)) == "-"
