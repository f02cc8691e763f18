"""A cohort node's clients as rows (fl_app/node/cohort_client.py, their state in
fl_app/node/client_state.py) against the per-client path's clients.

The reference is each client's own ``DriftClient`` (its own ``context.state``): its
``prepare_round`` and ``finish_round`` around the cohort's training (``cohort_client.train``,
the one vmapped round), so the rows must give every reply, metric (but timings) and kept state
**bit for bit** (tolerance 0: the same float operations on the same inputs), over rounds in
which clients return with the state they kept; the store on disk (``RowsJournal``) must give a
process without the node's copy, or a resumed run, exactly the rows an undisturbed node holds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays

import fl_app.node.client_state as client_state
import fl_app.node.cohort_client as cohort_client
import fl_app.node.drift_client as drift_client
from fl_app.node.attacks import faulted_reply
from fl_app.node.client_state import (
    ROWS,
    ClientRows,
    ClientStateMirror,
    ContextStore,
    DiskStore,
    RowsJournal,
    RowsStore,
    choose_store,
    partition_mirror,
)
from fl_app.node.cohort_client import CohortClient
from fl_app.node.drift_client import DriftClient
from fl_app.registry import METHODS, validate_config
from protocol.cohort import REPLIES, SUM, SumSpec, bundle_instructions, split_replies, sum_replies
from protocol.counted import COUNTED, ROLLBACK
from tests.kit import assert_arrays_close, fake_context, untimed
from tests.kit_server import N, cohort_fit, reply_as_fitres

BASE = {"dataset": "synthetic", "model": "logreg", "batch-size": 8, "local-epochs": 1, "momentum": 0.9,
        "weight-decay": 1e-3, "learning-rate": 0.05, "seed": 3}
ROUNDS = [[3, 0, 1], [0, 4], [3, 4, 1]]  # partitions 0, 1, 3 and 4 each come back with their state
SIZES = {0: 13, 1: 7, 2: 9, 3: 11, 4: 6}


@pytest.fixture(autouse=True)
def no_kept_copies():
    """No node's copy from another test in this process (the same run and node ids)."""
    client_state._ROWS.clear()
    yield
    client_state._ROWS.clear()


def image_partition(spec, partition_id, device, test_fraction=0.0):
    """MNIST-shaped partitions of their own sizes (no dataset read)."""
    gen = torch.Generator().manual_seed(partition_id)
    n = SIZES[partition_id]
    return (torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen)), None


def node(cfg: dict, method: str, state: RecordDict, device_sums: bool | None = None) -> CohortClient:
    context = fake_context()
    context.node_config = {"partition-id": 0, "num-partitions": 1}
    context.state = state
    client = CohortClient(cfg, context, METHODS[method].update, 0, 1)
    client.device_sums = device_sums
    return client


def initial(cfg: dict, method: str) -> list[np.ndarray]:
    weights = DriftClient(METHODS[method].update, cfg, fake_context(), 0, N).get_parameters({})
    receives = METHODS[method].update.receives
    return weights + ([np.full_like(w, 0.01) for w in weights] * len(receives) if receives else [])


def round_config(tmp_path, t: int, checkpoint_every: int = 1) -> dict:
    last_checkpoint = checkpoint_every * ((t - 1) // checkpoint_every) if checkpoint_every else 0
    return {"server-round": t, "run-dir": str(tmp_path), "checkpoint-every": checkpoint_every,
            "checkpoint-round": last_checkpoint}


def run(tmp_path, cfg: dict, method: str, forget: bool = False, summed: bool = False, rounds=ROUNDS,
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
            client_state._ROWS.clear()
        config = round_config(tmp_path, t, checkpoint_every)
        if summed:  # the node's one reply, as it returns it
            config = {**config, "num-partitions": N}
            bundle = bundle_instructions([(p, FitIns(ndarrays_to_parameters(arrays), config)) for p in partitions])
            bundle.config[SUM] = sum_spec(cfg, method).encode()
            out.append(node(cfg, method, state, device_sums).fit(parameters_to_ndarrays(bundle.parameters),
                                                                dict(bundle.config)))
            continue
        out.append(cohort_fit(node(cfg, method, state), arrays, partitions, config))
    return out, state


def sum_spec(cfg: dict, method: str) -> SumSpec:
    num_state = len(initial(cfg, method)) // (2 if METHODS[method].update.receives else 1)
    return SumSpec(num_state, (0,), (1,))


def per_client(cfg: dict, method: str, rounds=ROUNDS, sent=None) -> tuple[list, dict]:
    """The reference: per round, each client's own ``DriftClient`` (its own context.state)
    prepared and finished around the cohort's one ``train``, with the node's ``state_arrays_in``
    and ``faulted_reply``; per round {partition: (reply, num_examples, metrics)}, and the
    clients' states. ``sent``: {round: {partition: arrays}} in place of the initial arrays."""
    update, arrays = METHODS[method].update, initial(cfg, method)
    states: dict[int, RecordDict] = {}
    out = []
    for t, partitions in enumerate(rounds, start=1):
        clients, jobs, carried = {}, {}, {}
        for p in partitions:
            context = fake_context()
            context.node_config = {"partition-id": p, "num-partitions": N}
            context.state = states.setdefault(p, RecordDict())
            clients[p] = DriftClient(update, cfg, context, p, N)
            carried[p] = sum(len(r) for r in context.state.array_records.values())
            given = (sent or {}).get(t, {}).get(p, arrays)
            jobs[p] = clients[p].prepare_round([a.copy() for a in given], {"server-round": t, "num-partitions": N})
        replies = {}
        for p, result in zip(partitions, cohort_client.train([jobs[p] for p in partitions])):
            reply, n, metrics = clients[p].finish_round(jobs[p], result)
            if states[p].array_records:
                metrics["state_arrays_in"] = carried[p]
            given = (sent or {}).get(t, {}).get(p, arrays)
            replies[p] = (faulted_reply(cfg, p, t, reply, given, len(clients[p].model.state_dict())), n, metrics)
        out.append(replies)
    return out, states


def assert_same_rounds(got, want) -> None:
    """Round by round, the same clients' replies, equal bit for bit (timings aside; NaN where
    NaN); ``want`` per round {partition: FitRes or (arrays, num_examples, metrics)}."""
    assert len(got) == len(want)
    for t, (mine, theirs) in enumerate(zip(got, want), start=1):
        assert mine.keys() == theirs.keys(), f"round {t}"
        for p in mine:
            what = f"round {t}, partition {p}"
            assert not isinstance(mine[p], str), f"{what}: {mine[p]}"
            reference = theirs[p]
            if not isinstance(reference, tuple):
                reference = (parameters_to_ndarrays(reference.parameters), reference.num_examples, reference.metrics)
            arrays, n, metrics = parameters_to_ndarrays(mine[p].parameters), mine[p].num_examples, mine[p].metrics
            assert n == reference[1], what
            assert [(a.dtype, a.shape) for a in arrays] == [(b.dtype, b.shape) for b in reference[0]], what
            for a, b in zip(arrays, reference[0]):
                np.testing.assert_array_equal(a, b, err_msg=what)
            assert json.dumps(untimed(metrics), sort_keys=True) == json.dumps(untimed(reference[2]), sort_keys=True), what


def assert_rows_hold(states: dict[int, RecordDict], what: str) -> None:
    """The node's rows hold each client's records of the reference, bit for bit."""
    kept = client_state._ROWS.get((0, 0))
    for p, state in states.items():
        mine = kept.records(p) if kept is not None else {}
        assert set(mine) == set(state.array_records), (what, p)
        for record, arrays in mine.items():
            assert_arrays_close(arrays, state[record].to_numpy_ndarrays(), 0, f"{what} {record} of {p}")


METHOD_CASES = ["fedavg", "scaffold", "feddyn", "moon", "fedlc", "fedpgvc", "fedsol", "ri-fedavg", "fedgam-cv"]


@pytest.mark.parametrize("method", METHOD_CASES)
def test_rows_equal_per_client_clients_bit_for_bit(tmp_path, monkeypatch, method):
    """Three rounds: every reply (weights, sends), num_examples and metric equal; each client's
    kept state in the rows equals its own context.state. The cases cover state (SCAFFOLD's c_i,
    FedDyn's g_k), state kept as weights (MOON's previous model), a prepare step (FedLC's label
    counts, RI-FedAvg's roughness), a finish step (FedPGVC), a carry (FedSOL) and sends
    (FedGAM-CV's delta c)."""
    model = {}
    if method == "fedpgvc":  # its layers: the last two Linear layers of an image model
        monkeypatch.setattr(drift_client, "partition_on_device", image_partition)
        model = {"dataset": "mnist", "model": "lenet"}
    cfg = validate_config({**BASE, "strategy": method, **model})
    as_rows, _ = run(tmp_path, cfg, method)
    reference, states = per_client(cfg, method)
    assert_same_rounds(as_rows, reference)
    if not client_state.stateful(METHODS[method].update):
        assert (0, 0) not in client_state._ROWS and not any(s.array_records for s in states.values())
        return
    assert_rows_hold(states, method)


def test_rows_equal_per_client_with_personal_batchnorm(tmp_path, monkeypatch):
    """FedBN's clients keep their BatchNorm layers: each row's personal entries replace the
    received ones (w_t converted per client), and evaluate reads them from the rows."""
    monkeypatch.setattr(drift_client, "partition_on_device", image_partition)
    cfg = validate_config({**BASE, "dataset": "mnist", "model": "lenet-bn", "strategy": "fedbn"})
    as_rows, rows_state = run(tmp_path, cfg, "fedbn")
    reference, states = per_client(cfg, "fedbn")
    assert_same_rounds(as_rows, reference)
    assert list(rows_state.keys()) == [ROWS]  # context.state carries the token only
    weights = initial(cfg, "fedbn")
    for p in (0, 3):
        config = {"cohort-partitions": str(p), "num-partitions": N}
        mine = node(cfg, "fedbn", rows_state).evaluate([a.copy() for a in weights], config)
        context = fake_context()
        context.state = states[p]
        theirs = DriftClient(METHODS["fedbn"].update, cfg, context, p, N).evaluate([a.copy() for a in weights], {})
        assert mine == theirs
        plain = node(cfg, "fedbn", RecordDict()).evaluate([a.copy() for a in weights], config)
        assert plain != mine  # the personal layers acted


def test_summed_rows_equal_the_sum_of_per_client_replies(tmp_path):
    """A node that replies its sum (``protocol.cohort.SUM``) sums the per-client replies."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    as_rows, _ = run(tmp_path, cfg, "scaffold", summed=True)
    reference, _ = per_client(cfg, "scaffold")
    arrays, spec = initial(cfg, "scaffold"), sum_spec(cfg, "scaffold")
    for t, ((got, n, metrics), replies) in enumerate(zip(as_rows, reference), 1):
        want, want_n, want_metrics = sum_replies([(p, r, k, m, arrays) for p, (r, k, m) in replies.items()], {}, spec)
        assert n == want_n
        assert_arrays_close(got, want, 0, f"round {t}'s summed arrays")
        records, want_records = json.loads(metrics.pop(REPLIES)), json.loads(want_metrics.pop(REPLIES))
        assert metrics == want_metrics
        for record, wanted in zip(records, want_records, strict=True):
            record["metrics"], wanted["metrics"] = untimed(record["metrics"]), untimed(wanted["metrics"])
            assert record == wanted


DEVICE_SUMS = cohort_client.device_sums
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
    monkeypatch.setattr(cohort_client, "device_sums", lambda device: used.append(device) or DEVICE_SUMS(device))
    on_device, _ = run(tmp_path / "device", cfg, method, summed=True, device_sums=True)
    assert len(used) == len(ROUNDS)  # the sums ran on tensors
    device_rows = client_state._ROWS.pop((0, 0))
    on_host, _ = run(tmp_path / "host", cfg, method, summed=True, device_sums=False)
    host_rows = client_state._ROWS[(0, 0)]
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
    kept, _ = run(tmp_path / "kept", cfg, "scaffold", checkpoint_every=checkpoint_every)
    restored, _ = run(tmp_path / "restored", cfg, "scaffold", forget=True,
                      checkpoint_every=checkpoint_every)
    assert_same_rounds(restored, kept)


def test_a_resumed_rows_node_restores_the_checkpoints_round(tmp_path):
    """A run killed after round 3 with its last checkpoint in round 2 resumes at round 3 in a new
    process: the journal's round 3 (the killed run's) is dropped, the rows are those of round 2,
    and round 3 equals the killed run's round 3."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    killed, _ = run(tmp_path, cfg, "scaffold", checkpoint_every=2)
    client_state._ROWS.clear()
    resumed, _ = run(tmp_path, cfg, "scaffold", checkpoint_every=2, rounds=ROUNDS[2:], first_round=3)
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


def test_which_store_a_round_uses(tmp_path):
    """One decision (``choose_store``): nothing for a method that keeps no arrays; on a cohort
    node the rows while the state is mirrored, else context.state under each client's prefix;
    on a per-client node context.state (with its mirror while checkpointing); each client's
    mirror with client-state = "disk" in a Ray simulation, refused without a visible run folder."""
    mirrored = {"run-dir": str(tmp_path), "checkpoint-every": 1, "num-partitions": N}
    scaffold, fedavg = METHODS["scaffold"].update, METHODS["fedavg"].update
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    disk = validate_config({**cfg, "client-state": "disk"})
    context = fake_context()

    def chosen(config, update=scaffold, run=cfg, in_ray=False, cohort=True):
        return choose_store(run, config, context, update, in_ray, "partition-0" if not cohort else None,
                            0 if cohort else None)
    assert type(chosen(mirrored, fedavg)) is client_state.ClientStateStore
    assert type(chosen(mirrored)) is RowsStore
    for unmirrored in ({}, {**mirrored, "checkpoint-every": 0}, {**mirrored, "run-dir": str(tmp_path / "absent")}):
        store = chosen(unmirrored)
        assert type(store) is ContextStore and "not mirrored" in store.why and store.prefix(3) == "vc3/"
    assert type(chosen(mirrored, run=disk)) is RowsStore  # not in a Ray simulation: memory
    assert type(chosen(mirrored, run=disk, in_ray=True)) is DiskStore
    with pytest.raises(RuntimeError, match="client-state"):
        chosen({}, run=disk, in_ray=True)
    per_client = chosen(mirrored, cohort=False)
    assert type(per_client) is ContextStore and "mirrored" in per_client.why
    assert per_client.mirror(0).dir == tmp_path / "client-state" / "partition-0"
    assert chosen({}, cohort=False).mirror(0) is None


def test_unmirrored_state_stays_in_context_state_and_equals_the_rows(tmp_path):
    """Without checkpoints a cohort node's clients keep their state in context.state, under
    ``vc<p>/`` (Flower carries it with the node's messages, so no process's copy can be lost):
    the same replies and records as the rows."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    as_rows, _ = run(tmp_path / "rows", cfg, "scaffold")
    rows = client_state._ROWS.pop((0, 0))
    unmirrored, state = run(tmp_path / "context", cfg, "scaffold", checkpoint_every=0)
    assert (0, 0) not in client_state._ROWS and ROWS not in state.config_records
    assert_same_rounds(unmirrored, as_rows)
    for p in {p for r in ROUNDS for p in r}:
        mine = {k.split("/", 1)[1]: r.to_numpy_ndarrays() for k, r in state.array_records.items()
                if k.startswith(f"vc{p}/")}
        assert set(mine) == set(rows.records(p)), p
        for record, arrays in rows.records(p).items():
            assert_arrays_close(mine[record], arrays, 0, f"{record} of client {p}")


def test_injected_faults_filter_each_clients_reply_after_it_kept_its_state(tmp_path):
    """``nan`` and an attack on a cohort node: the faulted clients' replies are the node's
    ``faulted_reply`` of their honest replies (the function the per-client node runs), bit for
    bit, their state is the honest one, and a ``raise`` client fails alone before training."""
    cfg = validate_config({**BASE, "strategy": "scaffold", "inject-faults": "nan:3,scale:0:10@2,raise:1"})
    faulted, _ = run(tmp_path, cfg, "scaffold")
    rounds = [[p for p in partitions if p != 1] for partitions in ROUNDS]  # what trains
    reference, states = per_client(cfg, "scaffold", rounds)
    honest, _ = per_client(validate_config({**cfg, "inject-faults": ""}), "scaffold", rounds)
    for t, mine in enumerate(faulted, 1):
        if 1 in mine:
            assert "injected fault: client of partition 1 raises" in mine.pop(1)
        assert_same_rounds([mine], [reference[t - 1]])
        if 3 in mine:
            assert not np.isfinite(parameters_to_ndarrays(mine[3].parameters)[0]).any()
        if 0 in mine:  # scaled from round 2 on
            scaled = parameters_to_ndarrays(mine[0].parameters)[0]
            assert np.array_equal(scaled, honest[t - 1][0][0][0]) == (t < 2)
    assert_rows_hold(states, "scaffold")  # the honest c_i: kept before the filter


def test_a_non_finite_row_keeps_its_state_as_its_per_client_client_does(tmp_path):
    """Round 2 sends partition 3 a poisoned model (its reply has NaN, which the server leaves
    out): its c_i stays that of round 1 on both paths, the client beside it moves on, and round 3
    (from the kept state) is equal bit for bit. Per-client arrays in one bundle, too."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    arrays = initial(cfg, "scaffold")
    poisoned = [a.copy() for a in arrays]
    poisoned[0].flat[0] = np.nan
    sent = [{3: arrays, 0: arrays}, {3: poisoned, 0: arrays}, {3: arrays, 0: arrays}]
    state, mine = RecordDict(), []
    for t, given in enumerate(sent, 1):
        config = {**round_config(tmp_path, t), "num-partitions": N}
        bundle = bundle_instructions([(p, FitIns(ndarrays_to_parameters(a), config)) for p, a in given.items()])
        mine.append(node(cfg, "scaffold", state).fit(parameters_to_ndarrays(bundle.parameters), dict(bundle.config)))
        if t == 2:
            assert client_state._ROWS[(0, 0)].records(3)
    reference, states = per_client(cfg, "scaffold", [list(g) for g in sent], dict(enumerate(sent, 1)))
    for t, ((arrays_got, _, metrics), replies) in enumerate(zip(mine, reference), 1):
        want = [a for p in sent[t - 1] for a in replies[p][0]]
        assert len(arrays_got) == len(want)
        for a, b in zip(arrays_got, want):
            np.testing.assert_array_equal(a, b, err_msg=f"round {t}")  # NaN where NaN
        records = json.loads(metrics[REPLIES])
        assert json.dumps([untimed(r["metrics"]) for r in records]) == json.dumps(
            [untimed(replies[p][2]) for p in sent[t - 1]])
    assert_rows_hold(states, "scaffold")


def test_a_new_copy_drops_the_journals_rounds_after_the_one_it_restores(tmp_path):
    """A resumed run's node restores the rows of the checkpoint's round and removes the killed
    run's later files, which its own rounds replace (a file it would not write, had its clients
    failed, must not be read by a later restore)."""
    journal = RowsJournal(str(tmp_path), 0)
    for t in (1, 2, 3):
        journal.write(t, {t: {"c": [np.full(2, float(t))]}}, keep_from=0)
    context = fake_context()
    rows = client_state.node_rows(context, 0, 5, str(tmp_path), 2)
    assert [r for r, _ in journal.files()] == [1, 2]
    assert len(rows.records(2)) == 1 and not rows.records(3)
    assert str(context.state.config_records[ROWS]["token"]) == rows.token


def test_rows_resume_a_run_mirrored_client_by_client(tmp_path):
    """A run checkpointed with one mirror per client (``client-state = "disk"``, or older
    checkpoints) and resumed as rows: the rows come from those mirrors, and round 3 equals the
    uninterrupted run's."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    full, _ = run(tmp_path / "full", cfg, "scaffold")
    run(tmp_path / "cut", cfg, "scaffold", rounds=ROUNDS[:2])
    rows = client_state._ROWS.pop((0, 0))
    for p in range(N):
        if rows.records(p):
            partition_mirror(str(tmp_path / "cut"), p).save(2, rows.records(p), keep_from=2)
    for path in (tmp_path / "cut" / "client-rows").rglob("*.npz"):
        path.unlink()
    resumed, _ = run(tmp_path / "cut", cfg, "scaffold", rounds=ROUNDS[2:], first_round=3)
    assert_same_rounds(resumed, full[2:])
    assert resumed[0][3].metrics["state_arrays_in"] > 0
    assert isinstance(partition_mirror(str(tmp_path), 0), ClientStateMirror)


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
    got = cohort_wire_sum(as_tensors, spec, cohort_client.device_sums(torch.device("cpu")))
    assert got[1] == want[1] == 3 and got[2] == want[2]
    assert_arrays_close(got[0], want[0], 0, "summed reply")
    np.testing.assert_array_equal(got[0][0], np.array([2.0, 1.0], np.float32))  # (2*[1,2] + [4,-1]) / 3
    np.testing.assert_array_equal(got[0][1], np.array([3]))  # (2*3 + 4) / 3 = 3.33 -> 3
    assert "non-finite" in json.loads(got[2][REPLIES])[2]["rejected"]


def cohort_wire_sum(replies, spec, ops=None):
    return sum_replies(replies, {}, spec) if ops is None else sum_replies(replies, {}, spec, ops)


@pytest.mark.parametrize("checkpoint_every", [0, 1], ids=["context-state", "rows"])
def test_a_row_whose_reply_was_left_out_goes_back_as_if_it_had_not_trained(tmp_path, checkpoint_every):
    """In a run that screens, each virtual client settles by its own instruction: partition 3's
    round-1 reply was left out (round 3 tells it its last counted round is 0), so from round 3 on
    the node answers as a node on which partition 3 never trained in round 1, bit for bit, for
    every client, with the state unmirrored (vc<p>/ in context.state) or as journalled rows."""
    cfg = validate_config({**BASE, "strategy": "scaffold"})
    counted = {2: {0: 1, 4: 0}, 3: {3: 0, 4: 2, 1: 1}}  # round -> {partition: its last counted round}

    def rounds(first: list[int], folder):
        state, arrays, out = RecordDict(), initial(cfg, "scaffold"), []
        folder.mkdir()
        for t, partitions in enumerate([first, [0, 4], [3, 4, 1]], start=1):
            config = {**round_config(folder, t, checkpoint_every), "num-partitions": N, ROLLBACK: True}
            bundle = bundle_instructions([(p, FitIns(ndarrays_to_parameters(arrays),
                                                     {**config, COUNTED: counted.get(t, {}).get(p, 0)}))
                                          for p in partitions])
            reply = node(cfg, "scaffold", state).fit(parameters_to_ndarrays(bundle.parameters), dict(bundle.config))
            out.append(dict(split_replies(reply_as_fitres(reply))))
        return out

    left_out = rounds([3, 0, 1], tmp_path / "left-out")
    never = rounds([0, 1], tmp_path / "never")
    left_out[0].pop(3)  # the reply the server left out
    assert_same_rounds(left_out, never)
