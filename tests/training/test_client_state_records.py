"""Client state kept by the per-method client classes that preceded the method layer
(ScaffoldClient, FedDynClient, MoonClient, FedSMOOClient, FedBNClient) resumes on the one generic
``DriftClient``: a ``context.state`` holding their records, under their names and in the order they
wrote them, is what the method's ``LocalUpdate`` starts its round from (a run's client-state mirror
taken before the change continues as it would have)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from torch import nn

from clients import fedbn, feddyn, fedsmoo, moon, scaffold
from fl_app.node.drift_client import DriftClient
from protocol.layout import bn_indices, cv_names_in_state_order, trainable_param_names
from tasks.datasets import input_shape
from tasks.functional import local_round
from tasks.functional.update import LocalUpdate
from tasks.models import build_model, get_weights
from tests.kit import make_client


# The order each old client wrote its record in (its save_state call in clients/<method>.py).
def old_cv_order(model: nn.Module) -> list[str]:
    """ControlVariateClient's c_i and FedSMOOClient's mu_i: trainable parameters, state_dict order."""
    return cv_names_in_state_order(model, trainable_param_names(model, {}))


def old_parameter_order(model: nn.Module) -> list[str]:
    """FedDynClient's g_k (FedSMOOClient's h_i): ``named_parameters`` order."""
    return [n for n, _ in model.named_parameters()]


def old_state_dict_order(model: nn.Module) -> list[str]:
    """MoonClient's previous model: every state_dict entry (weights and buffers), in its order."""
    return list(model.state_dict())


def old_bn_order(model: nn.Module) -> list[str]:
    """FedBNClient's own BN entries: the state_dict entries at ``bn_indices``."""
    names = list(model.state_dict())
    return [names[i] for i in bn_indices(model)]


@dataclass(frozen=True)
class OldClient:
    update: LocalUpdate
    records: dict[str, Callable[[nn.Module], list[str]]]  # old record name -> its order
    like_weights: bool  # the record holds model weights (values near w_t), not a correction
    seen: Callable  # (begin's context, the prepared round) -> {record: {entry: the tensor the round runs on}}


OLD_CLIENTS = {
    "scaffold": OldClient(scaffold.UPDATE, {"cv-ci": old_cv_order}, False, lambda ctx, job: {"cv-ci": ctx["ci"]}),
    "feddyn": OldClient(feddyn.UPDATE, {"feddyn-grad": old_parameter_order}, False,
                        lambda ctx, job: {"feddyn-grad": ctx["grad"]}),
    "moon": OldClient(moon.UPDATE, {"moon-prev": old_state_dict_order}, True,
                      lambda ctx, job: {"moon-prev": {**ctx["prev_params"], **ctx["prev_buffers"]}}),
    "fedsmoo": OldClient(fedsmoo.UPDATE, {"feddyn-grad": old_parameter_order, "smoo-mu": old_cv_order}, False,
                         lambda ctx, job: {"feddyn-grad": ctx["grad"], "smoo-mu": ctx["mu"]}),
    "fedbn": OldClient(fedbn.UPDATE, {"fedbn-bn": old_bn_order}, True,
                       lambda ctx, job: {"fedbn-bn": {**job.params, **job.buffers}}),
}
CFG = {"dataset": "mnist", "model": "lenet-bn", "batch-size": 6, "local-epochs": 1, "learning-rate": 0.1}


def old_record(names: list[str], w_t: dict[str, np.ndarray], like_weights: bool, seed: int) -> list[np.ndarray]:
    """Distinct values for each entry of ``names``, in that order: near w_t for weights (a BN
    running variance stays positive, a batch counter is an integer), small otherwise."""
    rng = np.random.default_rng(seed)
    out = []
    for name in names:
        ref = w_t[name]
        if not np.issubdtype(ref.dtype, np.floating):
            out.append(np.asarray(ref + 5))
            continue
        noise = 0.05 * rng.standard_normal(ref.shape)
        out.append((ref + noise if like_weights else noise).astype(ref.dtype))
    return out


def client(old: OldClient, x, y, records: dict[str, list[np.ndarray]]) -> DriftClient:
    """A client of ``old``'s method on a fresh ``context.state`` holding ``records``."""
    c = make_client(old.update, {"strategy": old.update.name, **CFG}, x, y)
    for name, arrays in records.items():
        c.context.state[name] = ArrayRecord(numpy_ndarrays=arrays)
    return c


def handed_round(old: OldClient, x, y, w_t: dict[str, np.ndarray], by_name: dict[str, dict]) -> tuple[list, dict]:
    """(reply, fit metrics) of a round of ``old``'s method on a client without records, handed
    ``by_name`` ({record: {entry: array}}) directly: its ``personal`` entries in place of the sent
    ones, its ``state`` as the round's state (each tensor in the model entry's layout)."""
    c = client(old, x, y, {})
    personal = by_name.get(old.update.personal.record, {}) if old.update.personal is not None else {}
    job = c.prepare_round([personal.get(n, a).copy() for n, a in w_t.items()], {"server-round": 2})
    entries = c.model.state_dict()
    for key, arrays in old.update.state.items():
        job.state[key] = {n: torch.empty_like(entries[n]).copy_(torch.as_tensor(a))
                          for n, a in by_name[arrays.record].items()}
    reply, _, metrics = c.finish_round(job, local_round(job))
    return reply, metrics


@pytest.mark.parametrize("method", list(OLD_CLIENTS))
def test_a_record_of_the_old_client_layout_resumes_identically(method):
    old = OLD_CLIENTS[method]
    x, y = torch.randn(6, 1, 28, 28, generator=torch.Generator().manual_seed(0)), torch.arange(6)
    model = build_model("lenet-bn", input_shape("mnist"), seed=0)
    sent = get_weights(model)
    w_t = dict(zip(model.state_dict(), sent))
    order = {record: names(model) for record, names in old.records.items()}
    records = {record: old_record(names, w_t, old.like_weights, seed) for seed, (record, names) in enumerate(order.items())}
    resumed = client(old, x, y, records)

    # the round's state and begin's context hold each array at the entry the old client wrote it for
    job = resumed.prepare_round([a.copy() for a in sent], {"server-round": 2})
    seen = old.seen(old.update.begin(job.params, job.state, job.server, job.hp), job)
    for record, names in order.items():
        for name, arr in zip(names, records[record]):
            assert torch.equal(seen[record][name].cpu(), torch.as_tensor(arr)), (record, name)

    reply, _, metrics = resumed.fit([a.copy() for a in sent], {"server-round": 2})
    # identically: the round a client runs when handed the same values by entry name
    by_name = {record: dict(zip(names, records[record])) for record, names in order.items()}
    want, want_metrics = handed_round(old, x, y, w_t, by_name)
    assert len(reply) == len(want) and all(np.array_equal(a, b) for a, b in zip(reply, want))
    assert metrics == want_metrics
    # the records are there to act: a node without them trains another update
    fresh, _, _ = client(old, x, y, {}).fit([a.copy() for a in sent], {"server-round": 2})
    assert not all(np.allclose(a, b, atol=1e-6) for a, b in zip(fresh, reply))
    # and the client keeps them in the old layout (an old client would read them back)
    for record, names in order.items():
        kept = resumed.load_state(record)
        assert [(a.shape, a.dtype) for a in kept] == [(w_t[n].shape, w_t[n].dtype) for n in names], record
