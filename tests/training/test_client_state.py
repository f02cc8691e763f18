"""client-state = "disk": in simulation a stateful client keeps its state in
``<run-dir>/client-state/<client>/`` between its rounds instead of in ``context.state``, with
the same results; outside Ray (a deployed SuperNode) it keeps using ``context.state``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

import fl_app.node.node_client as node
from clients import feddyn, scaffold
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import fake_context, make_client

CI_STATE = scaffold.UPDATE.state["ci"].record  # the context.state record SCAFFOLD keeps c_i under
ScaffoldClient = scaffold.UPDATE  # the update make_client builds its client with
FedDynClient = feddyn.UPDATE


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(24, 60, generator=g), torch.randint(0, 10, (24,), generator=g)


def run_rounds(client_cls, mode: str, run_dir, rounds=3, forget: bool = False):
    """One client fitted ``rounds`` times, a fresh client object per round (as in simulation)
    on one node context; returns (replies, metrics, state arrays left in context.state).
    ``forget``: each round on a new node context and run folder, so no state is kept."""
    x, y = _data()
    context = fake_context()
    weights = get_weights(build_model("logreg", input_shape("synthetic"), seed=0))
    cfg = {"client-state": mode, "learning-rate": 0.1, "batch-size": 8}
    replies, metrics, held = [], [], []
    for r in range(1, rounds + 1):
        if forget:
            context, folder = fake_context(), run_dir / f"forgot-{r}"
            folder.mkdir(parents=True)
        else:
            folder = run_dir
        client = make_client(client_cls, cfg, x, y, context=context)
        config = {"server-round": r, "run-dir": str(folder), "checkpoint-every": 0, "checkpoint-round": 0}
        extra = [np.zeros_like(a) for a in weights] if client_cls is ScaffoldClient else []
        reply, _, m = node.NodeClient(client).fit([a.copy() for a in weights] + extra, config)
        replies.append(reply)
        metrics.append({k: v for k, v in m.items() if not k.endswith("_seconds")})
        held.append(sum(len(rec) for rec in context.state.array_records.values()))
        weights = reply[: len(weights)]
    return replies, metrics, held


@pytest.fixture
def in_simulation(monkeypatch):
    monkeypatch.setattr(node, "in_ray_worker", lambda: True)
    monkeypatch.setattr(node, "ray_node_id", lambda: "node-a")


@pytest.mark.parametrize("client_cls", [ScaffoldClient, FedDynClient], ids=["scaffold", "feddyn"])
def test_disk_state_gives_the_same_rounds_and_holds_nothing_in_memory(client_cls, in_simulation, tmp_path):
    (tmp_path / "mem").mkdir()
    (tmp_path / "disk").mkdir()
    mem = run_rounds(client_cls, "memory", tmp_path / "mem")
    disk = run_rounds(client_cls, "disk", tmp_path / "disk")
    for a, b in zip(mem[0], disk[0]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert mem[1] == disk[1]
    assert [m["state_arrays_in"] for m in disk[1]] == [0, 2, 2]  # carried in from the disk
    assert all(m["ray_node"] == "node-a" for m in disk[1])
    assert mem[2] == [2, 2, 2] and disk[2] == [0, 0, 0]  # the node context holds no arrays
    files = sorted(p.name for p in (tmp_path / "disk" / "client-state" / "partition-0").iterdir())
    assert files == ["round-3.npz"]  # one file per client: older rounds are removed
    assert not (tmp_path / "mem" / "client-state").exists()


@pytest.mark.parametrize("mode", ["memory", "disk"])
@pytest.mark.parametrize("client_cls", [ScaffoldClient, FedDynClient], ids=["scaffold", "feddyn"])
def test_round_two_trains_from_the_kept_state(client_cls, mode, in_simulation, tmp_path):
    """Round 2 of a client that kept its round-1 state (SCAFFOLD's c_i, FedDyn's g_k; in
    context.state, or on disk) differs from round 2 of the same client from the same global
    model without it: the kept state is read back and used, not only stored."""
    (tmp_path / "kept").mkdir()
    kept, _, _ = run_rounds(client_cls, mode, tmp_path / "kept", rounds=2)
    forgot, _, _ = run_rounds(client_cls, mode, tmp_path / "forgot", rounds=2, forget=True)
    for a, b in zip(kept[0], forgot[0]):  # round 1: no state either way
        np.testing.assert_array_equal(a, b)
    assert not all(np.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(kept[1], forgot[1]))


@pytest.mark.parametrize("client_cls", [ScaffoldClient, FedDynClient], ids=["scaffold", "feddyn"])
def test_the_round_starts_from_the_state_kept_in_context_state(client_cls):
    """What round 1 leaves in ``context.state`` is what round 2's local update is given (the
    round's ``state``, bit for bit), and it alone carries round 1 into round 2: a new node
    context holding a copy of those records trains round 2 identically, an empty one does not."""
    x, y = _data()
    context = fake_context()
    weights = get_weights(build_model("logreg", input_shape("synthetic"), seed=0))
    extra = [np.zeros_like(a) for a in weights] if client_cls is ScaffoldClient else []
    cfg = {"learning-rate": 0.1, "batch-size": 8}
    reply, _, _ = make_client(client_cls, cfg, x, y, context=context).fit([a.copy() for a in weights] + extra,
                                                                          {"server-round": 1})
    w1 = [a.copy() for a in reply[: len(weights)]] + extra
    (key, arrays), = client_cls.state.items()
    stored = context.state[arrays.record].to_numpy_ndarrays()
    assert stored and all(np.any(a) for a in stored)
    client = make_client(client_cls, cfg, x, y, context=context)
    job = client.prepare_round([a.copy() for a in w1], {"server-round": 2})
    given = job.state[key]
    assert list(given) == client.names(arrays)
    for name, a in zip(given, stored):
        np.testing.assert_array_equal(given[name].numpy(), a)

    def round_two(ctx):
        return make_client(client_cls, cfg, x, y, context=ctx).fit([a.copy() for a in w1], {"server-round": 2})[0]

    copied = fake_context()
    copied.state[arrays.record] = ArrayRecord(numpy_ndarrays=[a.copy() for a in stored])
    kept, same, fresh = round_two(context), round_two(copied), round_two(fake_context())
    for a, b in zip(kept, same):
        np.testing.assert_array_equal(a, b)
    assert not all(np.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(kept, fresh))


def test_deployed_supernode_keeps_context_state(monkeypatch, tmp_path):
    monkeypatch.setattr(node, "in_ray_worker", lambda: False)
    _, metrics, held = run_rounds(ScaffoldClient, "disk", tmp_path)
    assert held == [2, 2, 2] and "ray_node" not in metrics[0]
    assert not (tmp_path / "client-state").exists()


def test_state_is_read_back_from_the_newest_file(in_simulation, tmp_path):
    run_rounds(ScaffoldClient, "disk", tmp_path, rounds=2)
    from fl_app.node.client_state import ClientStateMirror

    saved = ClientStateMirror(str(tmp_path), "partition-0").load(2)
    assert set(saved) == {CI_STATE} and len(saved[CI_STATE]) == 2 and np.any(saved[CI_STATE][0])


TIMING = ("round_seconds", "fit_phase_seconds", "fit_seconds", "prepare_seconds", "train_seconds",
          "aggregate_seconds", "evaluate_seconds")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["scaffold", "feddyn"])
def test_simulation_with_disk_state_matches_memory_state(method, tmp_path):
    """A short seeded simulation gives the same metrics.csv (timings aside) either way."""
    import csv

    from runner.launch import LocalSimulation

    tables = {}
    with LocalSimulation() as sim:
        for mode in ("memory", "disk"):
            cfg = {"strategy": method, "dataset": "synthetic", "model": "logreg", "num-server-rounds": 3,
                   "fraction-fit": 0.5, "learning-rate": 0.05, "client-state": mode, "checkpoint-every": 0,
                   "results-dir": str(tmp_path), "run-name": mode}
            lines: list[str] = []
            assert sim.run(cfg, num_supernodes=4, on_line=lines.append) == 0, "\n".join(lines[-30:])
            with (tmp_path / mode / "metrics.csv").open() as f:
                tables[mode] = [{k: v for k, v in row.items() if not k.startswith(TIMING)}
                                for row in csv.DictReader(f)]
    assert len(tables["memory"]) == 3
    assert tables["disk"] == tables["memory"]
    assert float(tables["disk"][-1]["state_arrays_in_max"]) > 0  # state was carried between rounds
    assert tables["disk"][0]["num_ray_nodes"] == "1"  # clients ran in Ray actors: the disk path was taken


def test_disk_state_without_the_run_folder_fails_clearly(in_simulation, tmp_path):
    with pytest.raises(RuntimeError, match="needs the run folder"):
        run_rounds(ScaffoldClient, "disk", tmp_path / "not-here", rounds=1)


@pytest.mark.parametrize("client_cls", [ScaffoldClient, FedDynClient], ids=["scaffold", "feddyn"])
def test_a_non_finite_round_keeps_the_state_of_the_last_counted_round(client_cls):
    """The server leaves out a reply with NaN or Inf; the client must then keep the state it had
    (SCAFFOLD's c_i, FedDyn's h_i), or its state would count an update the server never counted
    and, non-finite, poison all its later rounds. Round 2 gets a global model with a NaN: its
    reply is non-finite and the state after it is the state after round 1, bit for bit."""
    x, y = _data()
    context = fake_context()
    weights = get_weights(build_model("logreg", input_shape("synthetic"), seed=0))
    extra = [np.zeros_like(a) for a in weights] if client_cls is ScaffoldClient else []
    cfg = {"learning-rate": 0.1, "batch-size": 8}

    def state_now():
        return {k: [a.copy() for a in r.to_numpy_ndarrays()] for k, r in context.state.array_records.items()}

    reply, _, _ = make_client(client_cls, cfg, x, y, context=context).fit([a.copy() for a in weights] + extra,
                                                                            {"server-round": 1})
    after_one = state_now()
    assert after_one and all(np.isfinite(a).all() and np.any(a) for v in after_one.values() for a in v)
    poisoned = [a.copy() for a in reply[: len(weights)]]
    poisoned[0].flat[0] = np.nan
    reply2, _, _ = make_client(client_cls, cfg, x, y, context=context).fit(poisoned + extra, {"server-round": 2})
    assert not all(np.isfinite(a).all() for a in reply2)  # the reply the server will leave out
    after_two = state_now()
    assert set(after_two) == set(after_one)
    for key in after_one:
        for a, b in zip(after_two[key], after_one[key]):
            np.testing.assert_array_equal(a, b)
    reply3, _, _ = make_client(client_cls, cfg, x, y, context=context).fit([a.copy() for a in reply[: len(weights)]]
                                                                            + extra, {"server-round": 3})
    assert all(np.isfinite(a).all() for a in reply3)  # the next sound round trains from the kept state
