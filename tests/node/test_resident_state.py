"""A cohort node's virtual clients' state kept in its process between rounds, not in
``context.state`` (fl_app/node/cohort_client.py ``NodeResidentState``: the object path, which a
cohort round takes when it cannot run as rows; the rows' own store is tested in
tests/node/test_cohort_rows.py): Flower ships a node's ``context.state`` with every message, which for a cohort node
is every hosted client's state.

- With a disk mirror (the server checkpoints), after a round ``context.state`` holds no array,
  only the token naming the process's copy, and the copy holds each trained client's records;
- a message that finds no copy with its token (another actor, a restarted process) restores
  each client from its disk mirror: the rounds are identical to those of an undisturbed node;
- without a mirror the state stays in ``context.state`` (no copy anywhere else to lose);
- a client's evaluate reads its state from the copy.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import RecordDict

import fl_app.node.cohort_client as cohort_client
from fl_app.node.cohort_client import RESIDENT, CohortClient, state_prefix
from fl_app.registry import METHODS, validate_config
from tests.kit import assert_arrays_close, fake_context
from tests.kit_server import N, cohort_fit

CFG = {"dataset": "synthetic", "model": "logreg", "batch-size": 32, "learning-rate": 0.05, "seed": 3,
       "strategy": "scaffold"}
PARTITIONS = [[3, 0], [0, 4], [3, 4]]  # three rounds: partition 0, 3 and 4 each train twice


def node(state: RecordDict) -> CohortClient:
    context = fake_context()
    context.node_config = {"partition-id": 0, "num-partitions": 1}
    context.state = state
    client = CohortClient(validate_config(CFG), context, METHODS["scaffold"].update, 0, 1)
    client.rows = False  # the object path's store
    return client


def initial() -> list[np.ndarray]:
    from fl_app.node.drift_client import DriftClient

    weights = DriftClient(METHODS["scaffold"].update, validate_config(CFG), fake_context(), 0, N).get_parameters({})
    return weights + [np.full_like(w, 0.01) for w in weights]


def rounds(tmp_path, checkpoint_every: int = 2, forget_between_rounds: bool = False):
    """Three rounds of a SCAFFOLD cohort node (a new CohortClient each message, as Flower builds
    one, on the node's one ``context.state``); the replies and the node's state after each.
    The server checkpoints every 2 rounds, so a client's last state (round t - 1) is newer than
    the last checkpoint's in round 2: a restore must read the mirror at t - 1, not at the
    checkpoint (a resumed run's restore, which would give partition 0 no c_i in round 2)."""
    state, out = RecordDict(), []
    tmp_path.mkdir(exist_ok=True)  # the server's run folder, visible to the node
    arrays = initial()
    for t, partitions in enumerate(PARTITIONS, start=1):
        if forget_between_rounds:  # the next message lands in a process without the copy
            cohort_client._RESIDENT.clear()
        config = {"server-round": t, "run-dir": str(tmp_path), "checkpoint-every": checkpoint_every,
                  "checkpoint-round": checkpoint_every * ((t - 1) // checkpoint_every) if checkpoint_every else 0}
        replies = cohort_fit(node(state), arrays, partitions, config)
        out.append((replies, len(state.array_records)))
    return out, state


def test_the_state_stays_in_the_process_and_context_state_carries_only_its_token(tmp_path):
    cohort_client._RESIDENT.clear()
    _, state = rounds(tmp_path)
    assert not state.array_records and set(state.config_records) == {RESIDENT}
    (kept,) = cohort_client._RESIDENT.values()
    assert kept.token == state.config_records[RESIDENT]["token"]
    assert sorted(kept.records) == [0, 3, 4]
    assert all(kept.records[p].array_records for p in (0, 3, 4))  # each client's c_i


def test_a_process_without_the_copy_restores_every_client_from_its_mirror(tmp_path):
    """Round by round identical to the undisturbed node: the same replies, bit for bit, and
    the same metrics (``state_arrays_in`` too) but the timings."""
    cohort_client._RESIDENT.clear()
    undisturbed, _ = rounds(tmp_path / "a")
    moved, _ = rounds(tmp_path / "b", forget_between_rounds=True)
    assert [n for _, n in undisturbed] == [n for _, n in moved] == [0, 0, 0]  # the copy, not context.state
    for (a, _), (b, _) in zip(undisturbed, moved):
        assert a.keys() == b.keys()
        for p in a:
            assert a[p].num_examples == b[p].num_examples
            assert a[p].parameters.tensors == b[p].parameters.tensors, f"partition {p}"
            timing = ("prepare_seconds", "train_seconds", "fit_seconds")
            assert {k: v for k, v in a[p].metrics.items() if k not in timing} == \
                {k: v for k, v in b[p].metrics.items() if k not in timing}


def test_without_a_disk_mirror_the_state_stays_in_context_state(tmp_path):
    cohort_client._RESIDENT.clear()
    out, state = rounds(tmp_path, checkpoint_every=0)
    assert RESIDENT not in state.config_records and not cohort_client._RESIDENT
    assert {k.split("/")[0] for k in state.array_records} == {state_prefix(p)[:-1] for p in (0, 3, 4)}
    assert [n for _, n in out] == [2, 3, 3]  # records of the clients trained so far


@pytest.mark.parametrize("copy_in_process", [True, False])
def test_evaluate_reads_the_clients_state_from_the_process_or_the_mirror(tmp_path, copy_in_process):
    """FedBN-like personal state is not needed for this: the check is that evaluate brings the
    client's records in (and out again) whether the copy is in the process or only on disk."""
    cohort_client._RESIDENT.clear()
    _, state = rounds(tmp_path)
    want = cohort_client._RESIDENT[(0, 0)].records[4]
    if not copy_in_process:
        cohort_client._RESIDENT.clear()
    seen = {}
    original = CohortClient.virtual_client

    def spy(self, partition, config):
        client = original(self, partition, config)
        seen.update({k: r.to_numpy_ndarrays() for k, r in client.context.state.array_records.items()})
        return client

    CohortClient.virtual_client = spy
    try:
        node(state).evaluate(initial(), {"cohort-partitions": "4", "num-partitions": N})
    finally:
        CohortClient.virtual_client = original
    assert seen.keys() == set(want.array_records)
    for name, record in want.array_records.items():
        assert_arrays_close(seen[name], record.to_numpy_ndarrays(), 0, name)
    assert not state.array_records  # read, then out of context.state again
