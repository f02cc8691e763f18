"""A client whose reply the server did not count goes back to its state from before that round
(``RevertibleStore`` in fl_app/node/client_state.py, the server's side in
fl_app/server/counted.py), on every backend: context.state, with its mirror, the disk, a cohort
node's rows and their journal; by hand on one-number states, so each expected value is read off
the sequence of rounds."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.server.client_proxy import ClientProxy

import fl_app.node.client_state as client_state
from fl_app.node.client_state import (
    ROUND,
    ContextStore,
    DiskStore,
    RevertibleStore,
    RowsStore,
    choose_store,
    partition_mirror,
)
from fl_app.registry import METHODS, validate_config
from fl_app.server.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from fl_app.server.counted import CountedRounds, client_name
from protocol.counted import COUNTED, ROLLBACK
from tests.kit import fake_context

N = 4  # partitions of the cohort node's rows


def backends(tmp_path):
    """Each backend a node may choose, as a factory of one round's store (a fresh object per
    round, as a node builds one per message, on the same node context and run folder)."""
    context = fake_context()
    run = str(tmp_path)
    return {
        "context": lambda: ContextStore(context.state),
        "mirrored": lambda: ContextStore(context.state, mirror=lambda p: partition_mirror(run, p)),
        "disk": lambda: DiskStore(context.state, mirror=lambda p: partition_mirror(run, p)),
        "rows": lambda: RowsStore(context, 0, N, run),
    }


def one_round(make, server_round: int, counted: int, value: float | None, partition: int = 1):
    """Round ``server_round`` of client ``partition``: open, settle with ``counted``, read its
    ``a`` (None: no state), keep ``[value]`` (None: keeps nothing, as a non-finite round),
    close. Returns what it read and whether ``settle`` went back."""
    store = RevertibleStore(make())
    store.open_round(server_round, server_round - 1, [partition])
    back = store.settle(partition, {COUNTED: counted})
    read = store.loader(partition)("a")
    read = None if read is None else float(read[0][0])  # now: the rows' loader gives views of them
    if value is not None:
        store.keep(partition, {"a": [np.array([value])]})
    store.close_round(server_round, [partition], server_round)
    return read, back


@pytest.mark.parametrize("backend", ["context", "mirrored", "disk", "rows"])
def test_a_client_goes_back_to_the_state_of_its_last_counted_round(backend, tmp_path):
    """Round t keeps a = t. Round 2's reply is left out (the client is told at round 3 that its
    last counted round is 1): round 3 reads 1, not 2. Round 3 is counted, round 4 reads 3.
    Round 4 is left out and so is round 5, which trained from 3 again: round 6 reads 3."""
    make = backends(tmp_path)[backend]
    assert one_round(make, 1, 0, 1.0) == (None, False)
    assert one_round(make, 2, 1, 2.0) == (1.0, False)
    assert one_round(make, 3, 1, 3.0) == (1.0, True)  # round 2 was not counted
    assert one_round(make, 4, 3, 4.0) == (3.0, False)
    assert one_round(make, 5, 3, 5.0) == (3.0, True)  # round 4 was not counted
    assert one_round(make, 6, 3, 6.0) == (3.0, True)  # round 5 was not counted either


@pytest.mark.parametrize("backend", ["context", "mirrored", "disk", "rows"])
def test_a_first_round_left_out_leaves_no_state(backend, tmp_path):
    """A client whose first round is left out reads no state (as one never sampled: its
    update's ``begin`` gives the initial values) and counts no arrays; its next round is as a
    first round, and one left out after that goes back to no state again."""
    make = backends(tmp_path)[backend]
    assert one_round(make, 1, 0, 1.0) == (None, False)
    store = RevertibleStore(make())
    store.open_round(2, 1, [1])
    assert store.settle(1, {COUNTED: 0}) and store.loader(1)("a") is None and store.count(1) == 0
    assert store.records(1) == {}
    store.keep(1, {"a": [np.array([2.0])]})
    store.close_round(2, [1], 2)
    assert one_round(make, 3, 0, 3.0) == (None, True)
    assert one_round(make, 4, 3, 4.0) == (3.0, False)


def test_a_non_finite_round_keeps_nothing_and_goes_back_to_nothing(tmp_path):
    """A round that keeps nothing (its reply not finite, which the server also leaves out)
    leaves the records of the round before, which were counted: no going back."""
    make = backends(tmp_path)["context"]
    one_round(make, 1, 0, 1.0)
    assert one_round(make, 2, 1, None) == (1.0, False)
    assert one_round(make, 3, 1, 3.0) == (1.0, False)


def test_without_the_counted_round_nothing_goes_back(tmp_path):
    """An instruction without ``state-counted-round`` (not screening) settles nothing."""
    make = backends(tmp_path)["context"]
    one_round(make, 1, 0, 1.0)
    store = RevertibleStore(make())
    store.open_round(2, 1, [1])
    assert not store.settle(1, {})
    assert float(store.loader(1)("a")[0][0]) == 1.0


def test_the_rows_journal_restores_the_copy_and_the_rounds(tmp_path):
    """A resumed run (a new process: no copy of the rows) restores from the journal the copy
    and the rounds with the records, so it goes back as the undisturbed node would."""
    context = fake_context()
    make = lambda: RowsStore(context, 0, N, str(tmp_path))  # noqa: E731
    one_round(make, 1, 0, 1.0)
    one_round(make, 2, 1, 2.0)
    client_state._ROWS.clear()  # the process restarted: the rows come back from the journal
    assert one_round(make, 3, 1, 3.0) == (1.0, True)


def test_only_a_run_that_screens_wraps_the_store(tmp_path):
    """``choose_store`` wraps the backend when the instruction carries ``state-rollback``; a
    method that keeps nothing gets the empty store either way."""
    cfg = validate_config({"strategy": "scaffold", "dataset": "synthetic", "model": "logreg"})
    scaffold, fedavg = METHODS["scaffold"].update, METHODS["fedavg"].update
    context = fake_context()
    assert type(choose_store(cfg, {}, context, scaffold, False, "partition-0")) is ContextStore
    wrapped = choose_store(cfg, {ROLLBACK: True}, context, scaffold, False, "partition-0")
    assert type(wrapped) is RevertibleStore and type(wrapped.inner) is ContextStore and "copy" in wrapped.why
    assert type(choose_store(cfg, {ROLLBACK: True}, context, fedavg, False)) is client_state.ClientStateStore


def test_the_copy_and_rounds_are_the_backends_records(tmp_path):
    """What the backend holds after a kept round: the records, the copy from before the round
    under ``prior/``, and ``state-round`` = [this round, the copy's round]."""
    context = fake_context()
    make = lambda: ContextStore(context.state)  # noqa: E731
    one_round(make, 1, 0, 1.0)
    one_round(make, 2, 1, 2.0)
    held = {k: r.to_numpy_ndarrays() for k, r in context.state.array_records.items()}
    assert sorted(held) == ["a", "prior/a", ROUND]
    assert held["a"][0][0] == 2.0 and held["prior/a"][0][0] == 1.0 and held[ROUND][0].tolist() == [2, 1]


class _Proxy(ClientProxy):
    def get_properties(self, ins, timeout, group_id): ...
    def get_parameters(self, ins, timeout, group_id): ...
    def fit(self, ins, timeout, group_id): ...
    def evaluate(self, ins, timeout, group_id): ...
    def reconnect(self, ins, timeout, group_id): ...


class _Manager:
    partition_of = {"n7": 3}
    data_path_of = {"n8": "/data/client.csv"}


def test_the_server_names_clients_stably_and_counts_what_it_aggregates():
    """Names: a node's partition, its data path's digest (the names of the state mirrors), else
    its id. Only the replies the method aggregates are counted; a run that does not screen
    sends nothing."""
    manager = _Manager()
    a, b, c = _Proxy("n7"), _Proxy("n8"), _Proxy("partition-5")
    assert client_name(manager, a) == "partition-3" and client_name(manager, c) == "partition-5"
    assert client_name(manager, b).startswith("data-") and len(client_name(manager, b)) == 17
    counted = CountedRounds({"screening": "reject"})
    assert counted.instruction(manager, a) == {ROLLBACK: True, COUNTED: 0}
    counted.count(4, manager, [(a, None), (c, None)])
    assert counted.instruction(manager, a)[COUNTED] == 4 and counted.instruction(manager, b)[COUNTED] == 0
    assert counted.state() == {"partition-3": 4, "partition-5": 4}
    assert CountedRounds({"screening": "none"}).instruction(manager, a) == {}


def test_the_checkpoint_keeps_the_counted_rounds(tmp_path):
    """The map is part of the checkpoint (hashed with its arrays); a checkpoint without it (the
    run did not screen, or an older one) resumes with rollback off: every client's last counted
    round is then unknown, and telling each 0 would take every client's state back."""
    weights = [np.ones(3, np.float32)]
    save_checkpoint(tmp_path, Checkpoint(5, weights, counted_rounds={"partition-0": 5, "partition-2": 3}))
    loaded = load_checkpoint(tmp_path)
    assert loaded.counted_rounds == {"partition-0": 5, "partition-2": 3}
    resumed = CountedRounds({"screening": "reject"}, resumed=True, rounds=loaded.counted_rounds)
    assert resumed.active and resumed.instruction(_Manager(), _Proxy("partition-2"))[COUNTED] == 3
    save_checkpoint(tmp_path, Checkpoint(5, weights))
    assert load_checkpoint(tmp_path).counted_rounds is None
    assert not CountedRounds({"screening": "reject"}, resumed=True, rounds=None).active
