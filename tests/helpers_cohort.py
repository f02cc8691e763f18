"""The one check that a cohort client's round equals its own ``local_round``, shared by the
equivalence tests of every family of local updates (tests/test_functional*.py)."""

from __future__ import annotations

import pytest
import torch


def assert_cohort_client_equals(together, k: int, alone, rel: float, skip_buffers: tuple[str, ...] = ()) -> None:
    """Client ``k`` of ``together`` (a ``CohortResult``) against ``alone`` (its ``RoundResult``):
    the same number of steps; weights, buffers (but ``skip_buffers``), state and reply within
    ``rel`` of the largest magnitude (exactly equal when ``rel`` is 0); the same fit metrics."""
    assert together.metrics[k]["num_steps"] == alone.metrics["num_steps"]
    pairs = [(together.params[n][k], alone.params[n]) for n in alone.params]
    pairs += [(together.buffers[n][k], alone.buffers[n]) for n in alone.buffers if n not in skip_buffers]
    pairs += [(together.states[k][s][n], alone.state[s][n]) for s in alone.state for n in alone.state[s]]
    pairs += [(together.replies[k][r][n], alone.reply[r][n]) for r in alone.reply for n in alone.reply[r]]
    for u, v in pairs:
        if rel == 0:
            assert torch.equal(u, v)
        else:
            assert (u - v).abs().max() <= rel * v.abs().max().clamp_min(1e-12)
    for key, value in alone.metrics.items():
        assert together.metrics[k][key] == pytest.approx(value, rel=max(rel, 1e-12))
