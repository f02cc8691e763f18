"""Clients of a registered method on in-memory data, prepared as the ClientApp prepares them
(``DriftClient.prepare_round``, the update's ``prepare`` step included), and the check that the
cohort path (``fl_app.node.cohort_client.train_cohort``: one vmap for all clients) trains each
of them as its own ``local_round`` does, within the cohort's tolerance (1e-5 relative in
float32, ``tasks/functional/rounds.py``)."""

from __future__ import annotations

import pytest
import torch

from fl_app.node.cohort_client import train_cohort
from fl_app.node.drift_client import DriftClient
from tasks.datasets import input_shape
from tasks.functional import local_round
from tasks.models import build_model, get_weights


def initial_weights(client: DriftClient, seed: int = 0) -> list:
    """A seeded initial model of the client's architecture, as arrays the server would send."""
    return get_weights(build_model(client.cfg["model"], input_shape(client.cfg["dataset"]), seed=seed))


def assert_cohort_equals_per_client(clients: list[DriftClient], weights: list, rel: float = 1e-5,
                                    float64: bool = False) -> None:
    """Every client's round of ``weights`` through the cohort path (all in one ``train_cohort``)
    against its own ``local_round``: weights, buffers, the client's new state and its reply
    beyond the weights, each array within ``rel`` of its largest magnitude; the same steps; the
    fit metrics within ``rel`` (1e-6 at least: both drivers sum the steps' losses in float32);
    both in float64 when asked
    (``in_float64``). Each path prepares its own rounds (a round's batch-order generator is
    consumed by training)."""
    config = {"server-round": 3}
    convert = in_float64 if float64 else list
    together = train_cohort(convert([c.prepare_round(weights, config) for c in clients]))
    for client, cohort in zip(clients, together):
        alone = local_round(convert([client.prepare_round(weights, config)])[0])
        assert cohort.metrics["num_steps"] == alone.metrics["num_steps"]
        pairs = [(name, {**cohort.params, **cohort.buffers}[name], v)
                 for name, v in {**alone.params, **alone.buffers}.items()]
        pairs += [(f"state {s}.{n}", cohort.state[s][n], v) for s in alone.state for n, v in alone.state[s].items()]
        pairs += [(f"reply {r}.{n}", cohort.reply[r][n], v) for r in alone.reply for n, v in alone.reply[r].items()]
        for name, u, v in pairs:
            assert torch.isfinite(u).all(), name
            assert (u - v).abs().max() <= rel * v.abs().max().clamp_min(1e-12), name
        for key, value in alone.metrics.items():  # both drivers sum the losses in float32
            assert cohort.metrics[key] == pytest.approx(value, rel=max(rel, 1e-6)), key


def in_float64(jobs: list) -> list:
    """The prepared rounds ``jobs`` with their model (one float64 copy, shared: a cohort's clients
    run one skeleton), weights, floating buffers, data and received buffers in float64, for a
    method whose float32 rounding differences between the paths grow too fast to compare."""
    import copy
    from dataclasses import replace

    model = copy.deepcopy(jobs[0].model).double()

    def wide(tree):
        return {n: t.double() if t.is_floating_point() else t.clone() for n, t in tree.items()}

    out = []
    for job in jobs:
        buffers = wide(job.buffers)
        out.append(replace(job, model=model, params=wide(job.params), buffers=buffers, x=job.x.double(),
                           server={**job.server, "buffers": buffers}))
    return out
