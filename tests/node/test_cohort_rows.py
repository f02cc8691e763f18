"""A cohort node's clients as rows (fl_app/node/cohort_rows.py) against its client objects.

The rows run the same preparation, training and finish as the object path, so every reply,
metric (but timings) and kept state must be equal **bit for bit** (tolerance 0: the same
float operations on the same inputs), over rounds in which clients return with the state
they kept; and the rows' store on disk (``RowsJournal``) must give a process without the copy,
or a resumed run, exactly the rows an undisturbed node holds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays

import fl_app.node.cohort_client as cohort_client
import fl_app.node.cohort_rows as cohort_rows
import fl_app.node.drift_client as drift_client
from fl_app.node.cohort_client import CohortClient
from fl_app.node.cohort_rows import ROWS, ClientRows, RowsJournal, rows_problem
from fl_app.node.cohort_wire import REPLIES, SUM, SumSpec, bundle_instructions
from fl_app.node.drift_client import DriftClient
from fl_app.registry import METHODS, validate_config
from tests.kit import assert_arrays_close, assert_same_reply, fake_context, untimed
from tests.kit_server import N, cohort_fit

BASE = {"dataset": "synthetic", "model": "logreg", "batch-size": 8, "local-epochs": 1, "momentum": 0.9,
        "weight-decay": 1e-3, "learning-rate": 0.05, "seed": 3}
ROUNDS = [[3, 0, 1], [0, 4], [3, 4, 1]]  # partitions 0, 1, 3 and 4 each come back with their state
SIZES = {0: 13, 1: 7, 2: 9, 3: 11, 4: 6}


@pytest.fixture(autouse=True)
def no_kept_copies():
    """No node's copy from another test in this process (the same run and node ids)."""
    cohort_rows._ROWS.clear()
    cohort_client._RESIDENT.clear()
    yield
    cohort_rows._ROWS.clear()
    cohort_client._RESIDENT.clear()


def image_partition(spec, partition_id, device, test_fraction=0.0):
    """MNIST-shaped partitions of their own sizes (no dataset read)."""
    gen = torch.Generator().manual_seed(partition_id)
    n = SIZES[partition_id]
    return (torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen)), None


def node(cfg: dict, method: str, state: RecordDict, rows: bool, device_sums: bool | None = None) -> CohortClient:
    context = fake_context()
    context.node_config = {"partition-id": 0, "num-partitions": 1}
    context.state = state
    client = CohortClient(cfg, context, METHODS[method].update, 0, 1)
    client.rows = rows
    client.device_sums = device_sums
    return client


def initial(cfg: dict, method: str) -> list[np.ndarray]:
    weights = DriftClient(METHODS[method].update, cfg, fake_context(), 0, N).get_parameters({})
    receives = METHODS[method].update.receives
    return weights + ([np.full_like(w, 0.01) for w in weights] * len(receives) if receives else [])


def run(tmp_path, cfg: dict, method: str, rows: bool, forget: bool = False, summed: bool = False, rounds=ROUNDS,
        checkpoint_every: int = 1, state: RecordDict | None = None, first_round: int = 1,
        device_sums: bool | None = None):
    """Rounds of one cohort node (a new CohortClient per message, on the node's one state), the
    server's run folder ``tmp_path``; per round the replies. ``forget``: every message lands in
    a process without the node's copy."""
    state = state if state is not None else RecordDict()
    arrays, out = initial(cfg, method), []
    tmp_path.mkdir(exist_ok=True)
    for t, partitions in enumerate(rounds, start=first_round):
        if forget:
            cohort_rows._ROWS.clear()
            cohort_client._RESIDENT.clear()
        config = {"server-round": t, "run-dir": str(tmp_path), "checkpoint-every": checkpoint_every,
                  "checkpoint-round": checkpoint_every * ((t - 1) // checkpoint_every)}
        if summed:  # the node's one reply, as it returns it
            num_state = len(arrays) // 2 if METHODS[method].update.receives else len(arrays)
            config = {**config, "num-partitions": N}
            bundle = bundle_instructions([(p, FitIns(ndarrays_to_parameters(arrays), config)) for p in partitions])
            bundle.config[SUM] = SumSpec(num_state, (0,), (1,)).encode()
            out.append(node(cfg, method, state, rows, device_sums).fit(parameters_to_ndarrays(bundle.parameters),
                                                                      dict(bundle.config)))
            continue
        out.append(cohort_fit(node(cfg, method, state, rows), arrays, partitions, config))
    return out, state


def assert_same_rounds(got, want) -> None:
    """Round by round, the same clients' replies, equal bit for bit (timings aside)."""
    assert len(got) == len(want)
    for t, (mine, theirs) in enumerate(zip(got, want), start=1):
        assert mine.keys() == theirs.keys(), f"round {t}"
        for p in mine:
            assert_same_reply(mine[p], (parameters_to_ndarrays(theirs[p].parameters), theirs[p].num_examples,
                                        theirs[p].metrics), rel=0, what=f"round {t}, partition {p}")


METHOD_CASES = ["fedavg", "scaffold", "feddyn", "moon", "fedlc", "fedpgvc", "fedsol", "ri-fedavg", "fedgam-cv"]


@pytest.mark.parametrize("method", METHOD_CASES)
def test_rows_equal_client_objects_bit_for_bit(tmp_path, monkeypatch, method):
    """Three rounds: every reply (weights, sends), num_examples and metric equal; each client's
    kept state in the rows equals its records on the object path. The cases cover state
    (SCAFFOLD's c_i, FedDyn's g_k), state kept as weights (MOON's previous model), a prepare step
    (FedLC's label counts, RI-FedAvg's roughness), a finish step (FedPGVC), a carry (FedSOL) and
    sends (FedGAM-CV's delta c)."""
    model = {}
    if method == "fedpgvc":  # its layers: the last two Linear layers of an image model
        monkeypatch.setattr(drift_client, "partition_on_device", image_partition)
        model = {"dataset": "mnist", "model": "lenet"}
    cfg = validate_config({**BASE, "strategy": method, **model})
    as_rows, _ = run(tmp_path / "rows", cfg, method, rows=True)
    as_objects, object_state = run(tmp_path / "objects", cfg, method, rows=False)
    assert_same_rounds(as_rows, as_objects)
    kept = cohort_rows._ROWS.get((0, 0))
    resident = cohort_client._RESIDENT.get((0, 0))
    if kept is None:  # a method that keeps nothing has no rows, and its objects kept nothing either
        assert not cohort_rows.stateful(METHODS[method].update)
        assert resident is None or not any(r.array_records for r in resident.records.values())
        return
    for p in {p for r in ROUNDS for p in r}:
        theirs = resident.records.get(p, RecordDict()) if resident is not None else RecordDict()
        assert set(kept.records(p)) == set(theirs.array_records), p
        for record, arrays in kept.records(p).items():
            assert_arrays_close(arrays, theirs[record].to_numpy_ndarrays(), 0, f"{method} {record} of {p}")


def test_rows_equal_client_objects_with_personal_batchnorm(tmp_path, monkeypatch):
    """FedBN's clients keep their BatchNorm layers: each row's personal entries replace the
    received ones (w_t converted per client), and evaluate reads them from the rows."""
    monkeypatch.setattr(drift_client, "partition_on_device", image_partition)
    cfg = validate_config({**BASE, "dataset": "mnist", "model": "lenet-bn", "strategy": "fedbn"})
    as_rows, rows_state = run(tmp_path / "rows", cfg, "fedbn", rows=True)
    as_objects, object_state = run(tmp_path / "objects", cfg, "fedbn", rows=False)
    assert_same_rounds(as_rows, as_objects)
    assert list(rows_state.keys()) == [ROWS]  # context.state carries the token only
    weights = initial(cfg, "fedbn")
    for p in (0, 3):
        config = {"cohort-partitions": str(p), "num-partitions": N}
        mine = node(cfg, "fedbn", rows_state, True).evaluate([a.copy() for a in weights], config)
        theirs = node(cfg, "fedbn", object_state, False).evaluate([a.copy() for a in weights], config)
        assert mine == theirs
        plain = node(cfg, "fedbn", RecordDict(), False).evaluate([a.copy() for a in weights], config)
        assert plain != mine  # the personal layers acted


def test_summed_rows_equal_summed_client_objects(tmp_path):
    """A node that replies its sum (``cohort_wire.SUM``) sums the same per-client replies."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    as_rows, _ = run(tmp_path / "rows", cfg, "scaffold", rows=True, summed=True)
    as_objects, _ = run(tmp_path / "objects", cfg, "scaffold", rows=False, summed=True)
    for t, ((arrays, n, metrics), (want_arrays, want_n, want_metrics)) in enumerate(zip(as_rows, as_objects), 1):
        assert n == want_n
        assert_arrays_close(arrays, want_arrays, 0, f"round {t}'s summed arrays")
        records, want_records = json.loads(metrics.pop(REPLIES)), json.loads(want_metrics.pop(REPLIES))
        assert metrics == want_metrics
        for record, want in zip(records, want_records, strict=True):
            record["metrics"], want["metrics"] = untimed(record["metrics"]), untimed(want["metrics"])
            assert record == want


DRIFT_REL = 1e-12  # the drift sums' squared norms: float64 dot products summed in each library's own order


@pytest.mark.parametrize("method", ["scaffold", "fedbn"])
def test_sums_on_the_training_device_equal_numpys(tmp_path, monkeypatch, method):
    """The node's sums as tensors on its training device (``device_sums``, what a GPU node runs;
    here on the CPU) against numpy's on the host: the mean, the plain sums (SCAFFOLD's delta c)
    and BatchNorm's integer counter bit for bit, every client record's metrics equal, the drift
    sums and squared norms within 1e-12 relative (float64 dot products: another summation
    order), and the kept state bit for bit."""
    extra = {}
    if method == "fedbn":
        monkeypatch.setattr(drift_client, "partition_on_device", image_partition)
        extra = {"dataset": "mnist", "model": "lenet-bn"}
    cfg = validate_config({**BASE, "strategy": method, **extra})
    used = []
    monkeypatch.setattr(cohort_client, "device_sums", lambda device: used.append(device) or cohort_rows.device_sums(device))
    on_device, _ = run(tmp_path / "device", cfg, method, rows=True, summed=True, device_sums=True)
    assert len(used) == len(ROUNDS)  # the sums ran on tensors
    device_rows = cohort_rows._ROWS.pop((0, 0))
    on_host, _ = run(tmp_path / "host", cfg, method, rows=True, summed=True, device_sums=False)
    host_rows = cohort_rows._ROWS[(0, 0)]
    num_model = len(initial(cfg, method)) // (2 if METHODS[method].update.receives else 1)
    for t, ((arrays, n, metrics), (want_arrays, want_n, want_metrics)) in enumerate(zip(on_device, on_host), 1):
        assert n == want_n
        counts = [int(c) for c in metrics["cohort-array-counts"].split(",")]
        summed = counts[0]
        assert summed >= num_model
        assert_arrays_close(arrays[:summed], want_arrays[:summed], 0, f"round {t}'s mean and sums")
        assert_arrays_close(arrays[summed:], want_arrays[summed:], DRIFT_REL, f"round {t}'s drift sums")
        records, want_records = json.loads(metrics.pop(REPLIES)), json.loads(want_metrics.pop(REPLIES))
        assert metrics == want_metrics
        for record, want in zip(records, want_records, strict=True):
            assert untimed(record["metrics"]) == untimed(want["metrics"])
            assert record["drift"] == pytest.approx(want["drift"], rel=DRIFT_REL)
    for p in range(N):
        for record, kept in host_rows.records(p).items():
            assert_arrays_close(device_rows.records(p)[record], kept, 0, f"{record} of {p}")


@pytest.mark.parametrize("checkpoint_every", [1, 2])
def test_rows_restored_from_the_journal_equal_the_kept_rows(tmp_path, checkpoint_every):
    """Every message in a process without the node's copy: the rows come back from the journal
    at the round before (not the checkpoint's round: with checkpoints every 2 rounds, partition
    0's c_i of round 2 is newer than the last checkpoint in round 3), and every round equals an
    undisturbed node's."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    kept, _ = run(tmp_path / "kept", cfg, "scaffold", rows=True, checkpoint_every=checkpoint_every)
    restored, _ = run(tmp_path / "restored", cfg, "scaffold", rows=True, forget=True,
                      checkpoint_every=checkpoint_every)
    assert_same_rounds(restored, kept)


def test_a_resumed_rows_node_restores_the_checkpoints_round(tmp_path):
    """A run killed after round 3 with its last checkpoint in round 2 resumes at round 3 in a new
    process: the journal's round 3 (the killed run's) is dropped, the rows are those of round 2,
    and round 3 equals the killed run's round 3."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    killed, _ = run(tmp_path, cfg, "scaffold", rows=True, checkpoint_every=2)
    cohort_rows._ROWS.clear()
    resumed, _ = run(tmp_path, cfg, "scaffold", rows=True, checkpoint_every=2, rounds=ROUNDS[2:], first_round=3)
    assert_same_rounds(resumed, killed[2:])


def test_the_journal_keeps_what_a_resume_needs_and_no_more(tmp_path):
    """Files a resume from the last checkpoint's round or later never reads are removed; the
    store restored at any round a resume can start from equals the store kept round by round."""
    journal = RowsJournal(str(tmp_path), 0)
    live, history = ClientRows(5, "t"), {}
    rounds = {1: [0, 1], 2: [1, 2], 3: [0, 1, 2], 4: [3]}
    for t, partitions in rounds.items():
        kept = {p: {"c": [np.full(3, 10.0 * t + p, np.float32)], **({"h": [np.array([t, p])]} if p == 1 else {})}
                for p in partitions}
        for p, records in kept.items():
            live.put(p, records)
        history[t] = {p: live.records(p) for p in range(5)}
        history[t] = {p: {r: [a.copy() for a in arrays] for r, arrays in records.items()}
                      for p, records in history[t].items()}
        journal.write(t, kept, keep_from=t - 1)
    # keep_from 3: round 1's rows (0, 1) and round 2's (1, 2) all come back in round 3
    assert [r for r, _ in journal.files()] == [3, 4]
    for t in (3, 4):
        restored = ClientRows(5, "r")
        journal.restore(restored, t)
        for p in range(5):
            assert restored.records(p).keys() == history[t][p].keys(), (t, p)
            for record, arrays in history[t][p].items():
                assert_arrays_close(restored.records(p)[record], arrays, 0, f"round {t} {record} of {p}")


def test_a_client_that_fails_as_a_row_does_not_fail_the_others(tmp_path):
    """A virtual client that is not a partition of N fails alone; the others reply."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    arrays = initial(cfg, "scaffold")
    tmp_path.mkdir(exist_ok=True)
    config = {"server-round": 1, "run-dir": str(tmp_path), "checkpoint-every": 1, "checkpoint-round": 0}
    replies = cohort_fit(node(cfg, "scaffold", RecordDict(), True), arrays, [0, 7], config)
    assert "not a partition of 5" in replies[7]
    assert replies[0].num_examples > 0


def test_which_rounds_run_as_rows(tmp_path):
    """Rows unless a fault or attack is injected, the state lives on disk per client, or a
    stateful method's state is not mirrored on disk (then context.state keeps it)."""
    mirrored = {"run-dir": str(tmp_path), "checkpoint-every": 1}
    scaffold, fedavg = METHODS["scaffold"].update, METHODS["fedavg"].update

    def cfg(**kw):
        return validate_config({**BASE, "strategy": "scaffold", **kw})
    assert rows_problem(cfg(), mirrored, scaffold) == ""
    assert rows_problem(cfg(), {}, fedavg) == ""
    assert "not mirrored" in rows_problem(cfg(), {}, scaffold)
    assert "not mirrored" in rows_problem(cfg(), {**mirrored, "checkpoint-every": 0}, scaffold)
    assert "inject-faults" in rows_problem(cfg(**{"inject-faults": "nan:1"}), mirrored, scaffold)
    assert "inject-faults" in rows_problem(cfg(**{"inject-faults": "scale:2:10"}), mirrored, scaffold)
    assert rows_problem(cfg(**{"inject-faults": "crash-after:2"}), mirrored, scaffold) == ""  # the server's fault
    assert "client-state" in rows_problem(cfg(**{"client-state": "disk"}), mirrored, scaffold)


def test_a_non_finite_row_keeps_its_state_as_its_client_object_does(tmp_path):
    """Round 2 sends partition 3 a poisoned model (its reply has NaN, which the server leaves
    out): its c_i stays that of round 1 on both paths, the client beside it moves on, and round 3
    (from the kept state) is equal bit for bit. Per-client arrays in one bundle, too."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    arrays = initial(cfg, "scaffold")
    poisoned = [a.copy() for a in arrays]
    poisoned[0].flat[0] = np.nan
    out = {}
    for rows in (True, False):
        cohort_rows._ROWS.clear()
        cohort_client._RESIDENT.clear()
        state, replies = RecordDict(), []
        run_dir = tmp_path / str(rows)
        run_dir.mkdir()
        for t, sent in enumerate([{3: arrays, 0: arrays}, {3: poisoned, 0: arrays}, {3: arrays, 0: arrays}], 1):
            config = {"server-round": t, "run-dir": str(run_dir), "checkpoint-every": 1, "checkpoint-round": t - 1,
                      "num-partitions": N}
            bundle = bundle_instructions([(p, FitIns(ndarrays_to_parameters(a), config)) for p, a in sent.items()])
            replies.append(node(cfg, "scaffold", state, rows).fit(parameters_to_ndarrays(bundle.parameters),
                                                                 dict(bundle.config)))
            if t == 2 and rows:
                kept = cohort_rows._ROWS[(0, 0)]
                assert kept.count(3) and not np.isfinite(parameters_to_ndarrays(bundle.parameters)[0]).all()
        out[rows] = replies
    for t, (mine, theirs) in enumerate(zip(out[True], out[False]), 1):
        assert len(mine[0]) == len(theirs[0])
        for a, b in zip(mine[0], theirs[0]):
            np.testing.assert_array_equal(a, b, err_msg=f"round {t}")  # NaN where NaN
        records, want = json.loads(mine[2][REPLIES]), json.loads(theirs[2][REPLIES])
        assert [untimed(r["metrics"]) for r in records] == [untimed(r["metrics"]) for r in want]


def test_a_new_copy_drops_the_journals_rounds_after_the_one_it_restores(tmp_path):
    """A resumed run's node restores the rows of the checkpoint's round and removes the killed
    run's later files, which its own rounds replace (a file it would not write, had its clients
    failed, must not be read by a later restore)."""
    journal = RowsJournal(str(tmp_path), 0)
    for t in (1, 2, 3):
        journal.write(t, {t: {"c": [np.full(2, float(t))]}}, keep_from=0)
    context = fake_context()
    rows = cohort_rows.node_rows(context, 0, 5, str(tmp_path), 2)
    assert [r for r, _ in journal.files()] == [1, 2]
    assert rows.count(2) == 1 and rows.count(3) == 0
    assert str(context.state.config_records[ROWS]["token"]) == rows.token


def test_rows_resume_a_run_mirrored_client_by_client(tmp_path):
    """A run checkpointed on the object path (one mirror per client) and resumed as rows: the
    rows come from those mirrors, and round 3 equals the uninterrupted object path's."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    full, _ = run(tmp_path / "full", cfg, "scaffold", rows=False)
    run(tmp_path / "cut", cfg, "scaffold", rows=False, rounds=ROUNDS[:2])
    cohort_rows._ROWS.clear()
    resumed, _ = run(tmp_path / "cut", cfg, "scaffold", rows=True, rounds=ROUNDS[2:], first_round=3)
    assert_same_rounds(resumed, full[2:])
    assert resumed[0][3].metrics["state_arrays_in"] > 0


def test_device_sums_reject_a_non_finite_client_as_numpys_do():
    """A client with NaN is rejected by the tensors' own finiteness test and left out of every
    sum; the integer array is rounded half to even; the same reply as numpy's (hand-checkable:
    the mean of clients 0 and 2 weighted 2 : 1)."""
    spec = SumSpec(2, (0,), ())
    sent = [np.zeros(2, np.float32), np.zeros(1, np.int64)]
    replies = [(0, [np.array([1.0, 2.0], np.float32), np.array([3])], 2, {"loss": 1.0}, sent),
               (1, [np.array([np.nan, 0.0], np.float32), np.array([9])], 5, {"loss": 2.0}, sent),
               (2, [np.array([4.0, -1.0], np.float32), np.array([4])], 1, {"loss": 3.0}, sent)]
    want = cohort_wire_sum(replies, spec)
    as_tensors = [(p, [torch.as_tensor(a) for a in r], n, m, [torch.as_tensor(a) for a in s])
                  for p, r, n, m, s in replies]
    got = cohort_wire_sum(as_tensors, spec, cohort_rows.device_sums(torch.device("cpu")))
    assert got[1] == want[1] == 3 and got[2] == want[2]
    assert_arrays_close(got[0], want[0], 0, "summed reply")
    np.testing.assert_array_equal(got[0][0], np.array([2.0, 1.0], np.float32))  # (2*[1,2] + [4,-1]) / 3
    np.testing.assert_array_equal(got[0][1], np.array([3]))  # (2*3 + 4) / 3 = 3.33 -> 3
    assert "non-finite" in json.loads(got[2][REPLIES])[2]["rejected"]


def cohort_wire_sum(replies, spec, ops=None):
    from fl_app.node.cohort_wire import sum_replies

    return sum_replies(replies, {}, spec) if ops is None else sum_replies(replies, {}, spec, ops)
