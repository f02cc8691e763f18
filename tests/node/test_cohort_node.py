"""The cohort node (fl_app/node/cohort_client.py) against the per-client path.

A ``CohortClient`` trains its virtual clients in one ``cohort_round``; each client's reply,
state and metrics must be those of its own per-client node (``NodeClient`` around the
``DriftClient`` of the method's ``LocalUpdate``, as ``client_fn`` builds it):

- K = 3 within 1e-5 relative: vmap's batched kernels (grouped/batched matmuls and convolutions)
  sum the same products in another order, a few float32 ulp per step; the partitions have
  different sizes, so the clients' last batches and step counts differ (masking);
- a cohort of one exactly (``cohort_step`` runs it unbatched, with the per-client kernels);
- state (SCAFFOLD's c_i, FedDyn's g_k) kept per virtual client across rounds, and mirrored on
  disk so a resumed cohort run equals an uninterrupted one;
- a failing virtual client is reported failed and the others go on;
- per-client augmentation (crop, flip, cutout) draws the same random numbers as per-client.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays

import fl_app.node.cohort_client as cohort_client
import fl_app.node.drift_client as drift_client
from fl_app.node.client_state import virtual_prefix as state_prefix
from fl_app.node.cohort_client import CohortClient
from fl_app.node.drift_client import DriftClient
from fl_app.node.node_client import NodeClient
from fl_app.registry import METHODS, validate_config
from protocol.cohort import bundle_instructions, split_replies
from tests.kit import assert_arrays_close, assert_same_reply, fake_context
from tests.kit_server import N, cohort_fit, reply_as_fitres

BASE = {"dataset": "synthetic", "model": "logreg", "batch-size": 32, "local-epochs": 1, "momentum": 0.9,
        "weight-decay": 1e-3, "learning-rate": 0.05, "seed": 3}


def config_of(**overrides) -> dict:
    return validate_config({**BASE, **overrides})


def per_client(cfg: dict, method: str, partition: int, state: RecordDict) -> NodeClient:
    """A per-client node of ``partition`` of N, as ``client_fn`` builds it."""
    context = fake_context()
    context.node_config = {"partition-id": partition, "num-partitions": N}
    context.state = state
    return NodeClient(DriftClient(METHODS[method].update, cfg, context, partition, N))


def cohort_node(cfg: dict, method: str, state: RecordDict | None = None) -> CohortClient:
    context = fake_context()
    context.node_config = {"partition-id": 0, "num-partitions": 1}
    context.state = state if state is not None else RecordDict()
    return CohortClient(cfg, context, METHODS[method].update, 0, 1)


def initial(cfg: dict, method: str) -> list[np.ndarray]:
    """The global model (and for SCAFFOLD a non-zero c, so the correction acts)."""
    weights = DriftClient(METHODS[method].update, cfg, fake_context(), 0, N).get_parameters({})
    return weights + ([np.full_like(w, 0.01) for w in weights] if method == "scaffold" else [])


def assert_same_state(node_state: RecordDict, partition: int, state: RecordDict, rel: float) -> None:
    """The cohort node's state entries of virtual client ``partition`` (under its prefix) are
    those of its per-client node's ``state``: the same records, each record's arrays within
    ``rel`` as ``assert_arrays_close`` holds them (exactly when ``rel`` is 0)."""
    prefix = state_prefix(partition)
    mine = {k[len(prefix):]: r for k, r in node_state.array_records.items() if k.startswith(prefix)}
    assert set(mine) == set(state.array_records)
    for key, record in state.array_records.items():
        assert_arrays_close(mine[key].to_numpy_ndarrays(), record.to_numpy_ndarrays(), rel, f"state {key}")


# ---------------------------------------------------------------------- K = 3 and K = 1
@pytest.mark.parametrize("method", ["fedavg", "fedprox", "scaffold", "fedsam", "feddyn"])
def test_cohort_of_three_equals_three_clients_over_two_rounds(method):
    """Round 2 starts from the state round 1 left, per virtual client (c_i, g_k)."""
    cfg = config_of(strategy=method)
    partitions = [3, 0, 4]
    node_state = RecordDict()
    states = {p: RecordDict() for p in partitions}
    arrays = initial(cfg, method)
    for server_round in (1, 2):
        config = {"server-round": server_round}
        got = cohort_fit(cohort_node(cfg, method, node_state), arrays, partitions, config)
        for p in partitions:
            want = per_client(cfg, method, p, states[p]).fit([a.copy() for a in arrays], dict(config))
            assert_same_reply(got[p], want, rel=1e-5)
            assert_same_state(node_state, p, states[p], rel=1e-5)
    if method in ("scaffold", "feddyn"):  # the state really persisted: round 2 reported it carried
        assert all(got[p].metrics["state_arrays_in"] > 0 for p in partitions)


@pytest.mark.parametrize("method", ["fedavg", "scaffold", "feddyn"])
def test_cohort_of_one_is_exact(method):
    cfg = config_of(strategy=method)
    node_state, state = RecordDict(), RecordDict()
    arrays = initial(cfg, method)
    for server_round in (1, 2):
        got = cohort_fit(cohort_node(cfg, method, node_state), arrays, [2], {"server-round": server_round})
        want = per_client(cfg, method, 2, state).fit([a.copy() for a in arrays], {"server-round": server_round})
        assert_same_reply(got[2], want, rel=0)
        assert_same_state(node_state, 2, state, rel=0)


def cohort_capable() -> list[str]:
    return sorted(name for name, m in METHODS.items() if not m.update.client_mods(config_of(strategy=name)))


@pytest.mark.parametrize("method", cohort_capable())
def test_every_cohort_method_equals_per_client(method):
    """Every method without client mods (each is a LocalUpdate), one round,
    weights-only instructions: the virtual clients share the process's cached model, so a method whose prepare kept a
    reference to it (not its own tensors) would show here."""
    # FedPGVC: 2 Linear layers; FedGELA: a body to train
    cfg = config_of(strategy=method, **({"model": "mlp"} if method in ("fedpgvc", "fedgela") else {}))
    arrays = DriftClient(METHODS[method].update, cfg, fake_context(), 0, N).get_parameters({})
    got = cohort_fit(cohort_node(cfg, method), arrays, [1, 2], {"server-round": 1})
    for p in (1, 2):
        want = per_client(cfg, method, p, RecordDict()).fit([a.copy() for a in arrays], {"server-round": 1})
        assert_same_reply(got[p], want, rel=1e-5)


# ----------------------------------------------------------------------------- failures
def test_failed_virtual_client_does_not_fail_the_others(monkeypatch):
    cfg = config_of(strategy="scaffold", **{"inject-faults": "raise:4"})
    node_state = RecordDict()
    arrays = initial(cfg, "scaffold")
    got = cohort_fit(cohort_node(cfg, "scaffold", node_state), arrays, [0, 4, 2], {"server-round": 1})
    assert "injected fault" in got[4]
    for p in (0, 2):
        want = per_client(cfg, "scaffold", p, RecordDict()).fit([a.copy() for a in arrays], {"server-round": 1})
        assert_same_reply(got[p], want, rel=1e-5)
    assert not any(k.startswith(state_prefix(4)) for k in node_state.keys())

    # a failure after training (finish): that client only, its state as before the round
    cfg = config_of(strategy="scaffold")
    original = cohort_client.finished_round

    def finish(job, result, *args):
        if job.partition == 2:
            raise RuntimeError("finish broke")
        return original(job, result, *args)

    monkeypatch.setattr(cohort_client, "finished_round", finish)
    before = {k: r.to_numpy_ndarrays() for k, r in node_state.array_records.items()}
    got = cohort_fit(cohort_node(cfg, "scaffold", node_state), arrays, [0, 2], {"server-round": 2})
    assert got[2] == "RuntimeError: finish broke" and not isinstance(got[0], str)
    prefix = state_prefix(2)
    after = {k: r.to_numpy_ndarrays() for k, r in node_state.array_records.items() if k.startswith(prefix)}
    assert after.keys() == {k for k in before if k.startswith(prefix)}
    assert all(all(np.array_equal(u, v) for u, v in zip(after[k], before[k])) for k in after)


class HookClient(DriftClient):
    """An unmigrated method's client: a client class where its ``LocalUpdate`` belongs (every
    registered method's client side is a LocalUpdate, tests/training/test_cohort.py)."""


def test_node_refuses_a_method_without_a_local_update(monkeypatch):
    """A cohort run's node (``client_fn``, which resolves the run config) refuses a method whose
    client side is not a ``LocalUpdate`` in one line naming it, before it builds a cohort."""
    import fl_app.registry
    from fl_app.client_app import client_fn
    from fl_app.common.method import Method

    monkeypatch.setitem(fl_app.registry.METHODS, "fedavg", Method(METHODS["fedavg"].strategy, HookClient))
    context = fake_context({**BASE, "strategy": "fedavg", "execution": "cohort", "num-virtual-clients": N})
    context.node_config = {"partition-id": 0, "num-partitions": 1}
    with pytest.raises(TypeError) as err:
        client_fn(context)
    text = str(err.value)
    assert "HookClient" in text and "must be a tasks.functional LocalUpdate" in text and "\n" not in text


def test_bad_bundle_config_is_refused():
    node = cohort_node(config_of(strategy="fedavg"), "fedavg")
    arrays = initial(config_of(strategy="fedavg"), "fedavg")
    bundle = bundle_instructions([(1, FitIns(ndarrays_to_parameters(arrays), {"server-round": 1}))])
    ret = node.fit(parameters_to_ndarrays(bundle.parameters), dict(bundle.config))  # no num-partitions
    assert "num-partitions" in dict(split_replies(reply_as_fitres(ret)))[1]
    with pytest.raises(ValueError, match="one virtual client"):
        node.evaluate(arrays, {"cohort-partitions": "1,2", "num-partitions": N})


# ------------------------------------------------------------------------ resume, evaluate
def test_resumed_cohort_equals_uninterrupted(tmp_path):
    """Round 2 on a fresh node (empty context.state: a resumed run) restores each virtual
    client's state from disk (the rows' journal) and equals round 2 on the node that kept it."""
    cfg = config_of(strategy="scaffold")
    arrays = initial(cfg, "scaffold")
    partitions = [1, 3]
    mirror = {"run-dir": str(tmp_path), "checkpoint-every": 1}
    kept = RecordDict()

    def node(state):
        return cohort_node(cfg, "scaffold", state)
    cohort_fit(node(kept), arrays, partitions, {"server-round": 1, "checkpoint-round": 0, **mirror})
    assert [p.name for p in (tmp_path / "client-rows" / "node-0").iterdir()] == ["round-1.npz"]
    round_2 = {"server-round": 2, "checkpoint-round": 1, **mirror}
    resumed_state = RecordDict()
    resumed = cohort_fit(node(resumed_state), arrays, partitions, round_2)
    uninterrupted = cohort_fit(node(kept), arrays, partitions, round_2)
    for p in partitions:
        assert resumed[p].parameters.tensors == uninterrupted[p].parameters.tensors
        assert resumed[p].metrics["ci_norm"] == uninterrupted[p].metrics["ci_norm"]
        assert resumed[p].metrics["state_arrays_in"] == uninterrupted[p].metrics["state_arrays_in"] > 0
    assert resumed_state.keys() == kept.keys()


def test_client_state_on_disk_per_virtual_client(tmp_path, monkeypatch):
    """client-state = "disk" (a Ray simulation): each virtual client's state lives in its own
    mirror between rounds, none in the node's memory, and the rounds equal memory-held state."""
    import fl_app.node.node_client as node_client

    for module in (node_client, cohort_client):
        monkeypatch.setattr(module, "in_ray_worker", lambda: True)
        monkeypatch.setattr(module, "ray_node_id", lambda: "node-a")
    arrays, partitions = initial(config_of(strategy="feddyn"), "feddyn"), [0, 2]
    disk, memory = config_of(strategy="feddyn", **{"client-state": "disk"}), config_of(strategy="feddyn")
    disk_state, memory_state = RecordDict(), RecordDict()
    for server_round in (1, 2, 3):
        config = {"server-round": server_round, "run-dir": str(tmp_path)}
        on_disk = cohort_fit(cohort_node(disk, "feddyn", disk_state), arrays, partitions, config)
        in_memory = cohort_fit(cohort_node(memory, "feddyn", memory_state), arrays, partitions, {**config, "run-dir": ""})
        assert not list(disk_state.keys()) and len(memory_state.array_records) == 2
        for p in partitions:
            assert on_disk[p].parameters.tensors == in_memory[p].parameters.tensors
            assert on_disk[p].metrics["feddyn_grad_norm"] == in_memory[p].metrics["feddyn_grad_norm"]
            assert on_disk[p].metrics["ray_node"] == "node-a"
    assert sorted(p.name for p in (tmp_path / "client-state").iterdir()) == ["partition-0", "partition-2"]


def test_evaluate_one_virtual_client():
    cfg = config_of(strategy="fedavg")
    arrays = initial(cfg, "fedavg")
    got = cohort_node(cfg, "fedavg").evaluate(arrays, {"cohort-partitions": "3", "num-partitions": N})
    assert got == per_client(cfg, "fedavg", 3, RecordDict()).evaluate(arrays, {})


def test_get_properties_is_the_nodes_own_partition():
    context = fake_context()
    context.node_config = {"partition-id": 1, "num-partitions": 2}
    node = CohortClient(config_of(strategy="fedavg"), context, METHODS["fedavg"].update, 1, 2)
    assert node.get_properties({}) == {"partition-id": 1, "num-partitions": 2}


def test_client_fn_builds_a_cohort_node_for_a_cohort_run():
    from fl_app.client_app import client_fn

    context = fake_context({**BASE, "strategy": "fedavg", "execution": "cohort", "num-virtual-clients": N})
    context.node_config = {"partition-id": 0, "num-partitions": 1}
    assert isinstance(client_fn(context).numpy_client, CohortClient)


# ---------------------------------------------------------------------------- augmentation
@pytest.mark.parametrize("partitions,rel", [([0, 1, 2], 1e-5), ([1], 0)])
def test_augmented_cohort_equals_per_client(monkeypatch, partitions, rel):
    """Image clients with crop, flip and cutout: each virtual client's batches are augmented by
    its own generator, in its own step order, as its per-client round does."""
    sizes = {0: 6, 1: 5, 2: 8}  # batches of 4: 4+2, 4+1, 4+4 (masked steps)

    def partition(spec, partition_id, device, test_fraction=0.0):
        gen = torch.Generator().manual_seed(partition_id)
        n = sizes[partition_id]
        return (torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen)), None

    monkeypatch.setattr(drift_client, "partition_on_device", partition)
    cfg = validate_config({**BASE, "dataset": "mnist", "model": "cnn-small", "batch-size": 4,
                           "augment": "crop,flip,cutout", "strategy": "fedavg"})
    arrays = initial(cfg, "fedavg")
    got = cohort_fit(cohort_node(cfg, "fedavg"), arrays, partitions, {"server-round": 2})
    plain = validate_config({**cfg, "augment": "none"})
    for p in partitions:
        want = per_client(cfg, "fedavg", p, RecordDict()).fit([a.copy() for a in arrays], {"server-round": 2})
        assert_same_reply(got[p], want, rel=rel)
        unaugmented = per_client(plain, "fedavg", p, RecordDict()).fit([a.copy() for a in arrays], {})
        assert not np.allclose(unaugmented[0][0], want[0][0])  # the augmentation really acted


def test_non_finite_virtual_client_keeps_its_state_the_others_move_on():
    """In a cohort, a client whose reply has NaN (the server leaves it out) keeps the state of its
    last counted round, as on the per-client path (tests/training/test_client_state.py); the client beside
    it in the same vmapped round keeps what its per-client node keeps."""
    cfg = config_of(strategy="scaffold")
    node_state, state0 = RecordDict(), RecordDict()
    arrays = initial(cfg, "scaffold")
    cohort_fit(cohort_node(cfg, "scaffold", node_state), arrays, [3, 0], {"server-round": 1})
    per_client(cfg, "scaffold", 0, state0).fit([a.copy() for a in arrays], {"server-round": 1})
    before = {k: [a.copy() for a in r.to_numpy_ndarrays()] for k, r in node_state.array_records.items()
              if k.startswith(state_prefix(3))}
    assert before  # c_3 was kept in round 1
    poisoned = [a.copy() for a in arrays]
    poisoned[0].flat[0] = np.nan
    config = {"server-round": 2, "num-partitions": N}
    bundle = bundle_instructions([(3, FitIns(ndarrays_to_parameters(poisoned), config)),
                                  (0, FitIns(ndarrays_to_parameters(arrays), config))])
    node = cohort_node(cfg, "scaffold", node_state)
    got = dict(split_replies(reply_as_fitres(node.fit(parameters_to_ndarrays(bundle.parameters),
                                                      dict(bundle.config)))))
    assert not all(np.isfinite(a).all() for a in parameters_to_ndarrays(got[3].parameters))
    for key, want in before.items():
        for a, b in zip(node_state[key].to_numpy_ndarrays(), want):
            np.testing.assert_array_equal(a, b)
    want0 = per_client(cfg, "scaffold", 0, state0).fit([a.copy() for a in arrays], {"server-round": 2})
    assert_same_reply(got[0], want0, rel=1e-5)
    assert_same_state(node_state, 0, state0, rel=1e-5)


def test_label_flip_and_the_partition_metric_on_a_cohort_node():
    """A label-flipping virtual client trains on y -> C - 1 - y as its own node would, and in a run
    with an omniscient attack every virtual client names its partition, as a per-client node does."""
    cfg = config_of(strategy="fedavg", **{"inject-faults": "label-flip:2,alie:0"})
    arrays = initial(cfg, "fedavg")
    got = cohort_fit(cohort_node(cfg, "fedavg"), arrays, [0, 2, 3], {"server-round": 1})
    for p in (0, 2, 3):
        want = per_client(cfg, "fedavg", p, RecordDict()).fit([a.copy() for a in arrays], {"server-round": 1})
        assert_same_reply(got[p], want, rel=1e-5)
        assert got[p].metrics["partition"] == p
    honest = per_client(config_of(strategy="fedavg"), "fedavg", 2, RecordDict()).fit([a.copy() for a in arrays],
                                                                                   {"server-round": 1})
    assert not np.allclose(parameters_to_ndarrays(got[2].parameters)[0], honest[0][0], rtol=1e-3)
