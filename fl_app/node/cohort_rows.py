"""A cohort node's virtual clients as rows: one preparation for the round's clients and one
N-row store of their kept state, instead of a ``DriftClient``, a ``NodeClient``, a ``Context``
and a view of ``context.state`` built and torn down per client each round.

``rows_round`` runs a bundle's clients through the same functions the per-client path runs
(``fl_app.node.drift_client``: ``split_received``, ``kept_state``, ``prepared_round``,
``finished_round``) and the same training (``cohort_client.train``), so each client's reply,
kept state and metrics are those of the object path bit for bit (tests/node/test_cohort_rows.py);
what it saves is the work around them:

- w_t (and what the server sent besides it) converted to tensors once per distinct set of arrays,
  not once per client (clients with ``personal`` entries, FedBN's, get their own);
- the kept state read from and written to ``ClientRows``, per record one ``[N, ...]`` array per
  entry in the node's memory, instead of Flower ``ArrayRecord``s serialised into and parsed out
  of ``context.state`` per client;
- one journal file a round for the node (``RowsJournal``: the round's kept rows) instead of one
  mirror file per client.

Where it runs (``rows_problem``): a cohort run whose clients carry no injected fault or attack
(those act on one client's reply: ``fl_app.node.node_client``), with ``client-state = "memory"``,
and, for a method that keeps state, with the state mirrored on disk (``checkpoint-every`` > 0 and
the run folder visible: the resident-state conditions, ``cohort_client.resident_wanted``). Any
other cohort run takes the object path, as before.

State between rounds: ``ClientRows`` stays in the node's process, named by a token in
``context.state`` (the ``ROWS`` record), as ``cohort_client.NodeResidentState`` does for the
object path: a message that lands in a process without that copy (another actor, a restarted
one, a resumed run) rebuilds it from the journal up to the round before (``RowsJournal.restore``),
so the rows are the same wherever they are read, and a resumed run restores each client's state
as of the checkpoint's round; a run whose journal has nothing yet but whose clients were mirrored
one by one (checkpointed on the object path, or before the rows) is restored from those mirrors.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from fl_app.common.faults import parse_faults
from fl_app.common.files import atomic_savez
from fl_app.node import drift_client
from fl_app.node.cohort_wire import SumOps
from fl_app.node.drift_client import (
    finished_round,
    kept_state,
    prepared_round,
    split_received,
    tensors_finite,
    weights_to_tensors,
)
from fl_app.node.node_client import in_ray_worker, ray_node_id, wait_for_warm_up
from fl_app.node.state_mirror import mirrored_partitions, partition_mirror, state_mirrored
from tasks.datasets import input_shape
from tasks.functional.update import LocalUpdate, Round
from tasks.models import cached_model, default_device
from tasks.partitioning import PartitionSpec

ROWS = "cohort-client-rows"  # a ConfigRecord in context.state: the token of the process's ClientRows


def stateful(update: LocalUpdate) -> bool:
    """Whether the method's clients keep arrays across rounds (declared state or personal entries)."""
    return bool(update.state) or update.personal is not None


def rows_problem(cfg: dict, config: dict, update: LocalUpdate) -> str:
    """Why this round's clients take the object path ('' when they run as rows; module docstring)."""
    if any(isinstance(target, int) for target in parse_faults(cfg["inject-faults"])):
        return "inject-faults names a client (its fault or attack acts on that client's reply)"
    if cfg["client-state"] != "memory":
        return f"client-state = {cfg['client-state']!r} keeps each client's state in its own mirror"
    if stateful(update) and not state_mirrored(config):
        return "the clients keep state and it is not mirrored on disk (checkpoint-every = 0 or no run folder here)"
    return ""


class ClientRows:
    """N virtual clients' kept state as rows: per record name (``Arrays.record``), one
    ``[N, ...]`` array per entry, and a bool ``[N]`` of the clients that kept it (a client that
    never did has no row: ``begin`` supplies its initial value). ``token`` names this copy."""

    def __init__(self, num_partitions: int, token: str):
        self.num_partitions = num_partitions
        self.token = token
        self.rows: dict[str, list[np.ndarray]] = {}
        self.kept: dict[str, np.ndarray] = {}

    def loader(self, partition: int) -> Callable[[str], list[np.ndarray] | None]:
        """Client ``partition``'s arrays of a record, or None (``drift_client.Load``): views of
        its rows, which the client's preparation copies into tensors."""
        def load(record: str) -> list[np.ndarray] | None:
            if record not in self.kept or not self.kept[record][partition]:
                return None
            return [rows[partition] for rows in self.rows[record]]
        return load

    def records(self, partition: int) -> dict[str, list[np.ndarray]]:
        """Every record client ``partition`` kept, {record: its arrays} (views)."""
        return {record: [rows[partition] for rows in self.rows[record]]
                for record, kept in self.kept.items() if kept[partition]}

    def count(self, partition: int) -> int:
        """How many arrays client ``partition`` has kept (``state_arrays_in``)."""
        return sum(len(self.rows[record]) for record, kept in self.kept.items() if kept[partition])

    def put(self, partition: int, kept: dict[str, list[np.ndarray]]) -> None:
        """Client ``partition``'s new arrays of each record in ``kept`` (others stay as they were)."""
        for record, arrays in kept.items():
            if record not in self.rows:
                self.rows[record] = [np.zeros((self.num_partitions, *np.shape(a)), dtype=np.asarray(a).dtype)
                                     for a in arrays]
                self.kept[record] = np.zeros(self.num_partitions, dtype=bool)
            rows = self.rows[record]
            if len(arrays) != len(rows):
                raise ValueError(f"client {partition} kept {len(arrays)} arrays under {record!r}, "
                                 f"its rows hold {len(rows)}")
            for row, array in zip(rows, arrays):
                row[partition] = array
            self.kept[record][partition] = True


class RowsJournal:
    """A cohort node's ``ClientRows`` on disk: ``<run-dir>/client-rows/node-<i>/round-<t>.npz``
    holds the rows its clients kept in round t, one array per (record, partition, entry) under
    the key ``record/partition/entry`` (\x1f-separated: one file, no stacked copy; on the 2-core
    machine 0.08 s for SCAFFOLD's 30 rows of ``cnn-small`` against 0.34 s for the rows stacked per
    entry and 0.09 s for one file per client), written atomically once per round while the state
    is mirrored. The store as of round u is every file up to u applied in round order
    (``restore``); a file no resume can need (each of its rows superseded by a later file at or
    before the last checkpoint's round) is removed (``prune``)."""

    PATTERN = re.compile(r"round-(\d+)\.npz$")

    def __init__(self, run_dir: str, node: int):
        self.dir = Path(run_dir) / "client-rows" / f"node-{node}"

    def files(self) -> list[tuple[int, Path]]:
        if not self.dir.exists():
            return []
        return sorted((int(m.group(1)), p) for p in self.dir.iterdir() if (m := self.PATTERN.search(p.name)))

    def write(self, server_round: int, kept: dict[int, dict[str, list[np.ndarray]]], keep_from: int) -> None:
        """The rows kept in ``server_round`` ({partition: {record: arrays}}), then ``prune``."""
        if kept:
            atomic_savez(self.dir / f"round-{server_round}.npz",
                         {f"{record}\x1f{partition}\x1f{i}": np.asarray(array)
                          for partition, records in kept.items() for record, arrays in records.items()
                          for i, array in enumerate(arrays)})
        self.prune(keep_from)

    @staticmethod
    def _rows(keys) -> dict[tuple[str, int], list[str]]:
        """{(record, partition): its keys in entry order} of a file's keys."""
        rows: dict[tuple[str, int], dict[int, str]] = {}
        for key in keys:
            record, partition, entry = key.rsplit("\x1f", 2)
            rows.setdefault((record, int(partition)), {})[int(entry)] = key
        return {row: [entries[i] for i in sorted(entries)] for row, entries in rows.items()}

    def restore(self, rows: ClientRows, up_to_round: int) -> None:
        """``rows`` as of round ``up_to_round``: every file up to it applied in round order."""
        for _, path in [(r, p) for r, p in self.files() if r <= up_to_round]:
            with np.load(path) as data:
                for (record, partition), keys in self._rows(data.files).items():
                    rows.put(partition, {record: [data[key] for key in keys]})

    def drop_after(self, server_round: int) -> None:
        """Remove files of rounds after ``server_round`` (a killed run's rounds past the checkpoint
        a resumed run restarts from: the resumed run writes its own)."""
        for r, path in self.files():
            if r > server_round:
                path.unlink(missing_ok=True)

    def prune(self, keep_from: int) -> None:
        """Remove each file at or before ``keep_from`` whose every row a later file at or before
        ``keep_from`` holds again (a resume from that round or later never reads it). Reads the
        files' key names only."""
        files = [(r, p) for r, p in self.files() if r <= keep_from]
        later: set[tuple[str, int]] = set()
        for _, path in reversed(files):
            with np.load(path) as data:
                rows = set(self._rows(data.files))
            if rows <= later:
                path.unlink(missing_ok=True)
            later |= rows


_ROWS: dict[tuple[int, int], ClientRows] = {}  # (run, node) -> this process's copy


def named_copy(context: Context, record: str, copies: dict):
    """This process's copy of the node's clients' state in ``copies`` (keyed by (run, node)) when
    the ConfigRecord ``record`` in ``context.state`` names its token; else None (the copy of
    another process, of a restarted one, or none yet: the caller makes one and names it). The one
    check of the object path's ``NodeResidentState`` and the rows' ``ClientRows``."""
    named = context.state.config_records.get(record)
    token = str(named["token"]) if named is not None and "token" in named else ""
    kept = copies.get((context.run_id, context.node_id))
    return kept if kept is not None and token and kept.token == token else None


def node_rows(context: Context, node: int, num_partitions: int, run_dir: str, up_to_round: int) -> ClientRows:
    """This process's ``ClientRows`` of the node, if ``context.state``'s token names it; else a new
    copy restored from the node's journal up to ``up_to_round`` (its files after that round are
    removed: a resumed run's, or no one's), its token then put in ``context.state``."""
    kept = named_copy(context, ROWS, _ROWS)
    if kept is None or kept.num_partitions != num_partitions:
        kept = _ROWS[(context.run_id, context.node_id)] = ClientRows(num_partitions, uuid.uuid4().hex)
        journal = RowsJournal(run_dir, node)
        if up_to_round < sys.maxsize:
            journal.drop_after(up_to_round)
        if any(r <= up_to_round for r, _ in journal.files()):
            journal.restore(kept, up_to_round)
        else:  # a run checkpointed with one mirror per client (the object path, or before the rows)
            restore_from_mirrors(kept, run_dir, up_to_round)
        context.state[ROWS] = ConfigRecord({"token": kept.token, "run-dir": run_dir,
                                            "num-partitions": num_partitions})
    return kept


def restore_from_mirrors(rows: ClientRows, run_dir: str, up_to_round: int) -> None:
    """``rows`` from the per-client mirrors in ``run_dir`` (``ClientStateMirror``: each client's
    newest state at or before ``up_to_round``), for a run whose clients were mirrored one by one."""
    for partition in mirrored_partitions(run_dir):
        saved = partition_mirror(run_dir, partition).load(up_to_round)
        if saved and partition < rows.num_partitions:
            rows.put(partition, saved)


def state_of(rows: ClientRows, partition: int) -> RecordDict:
    """Client ``partition``'s records as its own ``context.state`` would hold them (its evaluate)."""
    return RecordDict({record: ArrayRecord(numpy_ndarrays=[np.array(a) for a in arrays])
                       for record, arrays in rows.records(partition).items()})


@dataclass
class RowMember:
    """A virtual client of the round, prepared as a row of the cohort."""

    partition: int
    arrays: list[np.ndarray]
    job: Round
    carried: int  # arrays it had kept when the round began (``state_arrays_in``)
    prepare_seconds: float


def device_sums(device: torch.device) -> SumOps:
    """``cohort_wire.sum_replies``' operations on tensors on ``device``: the replies of a round
    summed where they were trained, in float64, and only the sums copied to the host (on a GPU,
    one model's and the drift sums' bytes instead of every client's model). The same products and
    sums, in the same order, as numpy's (``NUMPY_SUMS``): equal bit for bit but ``dot`` (float64
    rounding), tests/node/test_cohort_rows.py."""
    def to64(a):
        return a.to(torch.float64) if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a), device=device,
                                                                                       dtype=torch.float64)

    def cast(value, ref):
        return (torch.round(value) if not ref.is_floating_point() else value).to(ref.dtype)

    def to_numpy(a):
        return a.detach().to("cpu", memory_format=torch.contiguous_format).numpy()
    return SumOps(to64=to64, dot=lambda d: float(torch.dot(d.reshape(-1), d.reshape(-1))),
                  zeros64=lambda a: torch.zeros(tuple(a.shape), dtype=torch.float64, device=device),
                  cast=cast, finite=tensors_finite, to_numpy=to_numpy)


def sums_on_device(device: torch.device, forced: bool | None) -> bool:
    """Whether a node sums its replies on its training device: on CUDA (the sums' inputs are
    there), not on a CPU, where numpy's float64 sums measured faster (docs/performance.md
    section 14); ``forced`` (a test's) decides when not None."""
    return forced if forced is not None else device.type == "cuda"


def rows_round(update: LocalUpdate, cfg: dict, instructions, rows: ClientRows | None, train, on_failure,
               on_host: bool = True):
    """The bundle's clients (``split_instructions``' (partition, arrays, config)) prepared as rows
    (``prepare_rows``), trained by ``train`` (``cohort_client.train``) and finished
    (``finish_rows``); the kept state put in ``rows``. Returns (replies [(partition, reply,
    num_examples, metrics)], {partition: failure}, the {partition: kept records} of the round, the
    members, the seconds the training took). The replies are numpy arrays, or with ``on_host``
    False their tensors on the training device (for ``device_sums``). A client that fails before
    or after training is reported by ``on_failure(partition, exc, when)`` and left out; its rows
    stay as they were."""
    failed: dict[int, str] = {}
    members = prepare_rows(update, cfg, instructions, rows, on_failure, failed)
    wait_for_warm_up()
    prepared = time.perf_counter()
    results = train([m.job for m in members]) if members else []
    train_seconds = time.perf_counter() - prepared
    replies, written = finish_rows(cfg, members, results, rows, on_failure, failed, on_host)
    return replies, failed, written, members, train_seconds


def prepare_rows(update: LocalUpdate, cfg: dict, instructions, rows: ClientRows | None, on_failure,
                 failed: dict[int, str]) -> list[RowMember]:
    """Each client's ``Round`` as its own node would prepare it, w_t converted once per distinct
    set of sent arrays (per client for an update with ``personal`` entries, which replace some)."""
    device = default_device()
    model = cached_model(cfg["model"], input_shape(cfg["dataset"]), device)
    converted: dict[tuple, tuple] = {}  # ids of the sent arrays -> (params, buffers, received)
    members: list[RowMember] = []
    for partition, arrays, config in instructions:
        begun = time.perf_counter()
        try:
            num_partitions = virtual_partition(partition, config)
            load = rows.loader(partition) if rows is not None else no_state
            key = tuple(id(a) for a in arrays)
            if update.personal is not None or key not in converted:
                weights, received = split_received(update, model, cfg, arrays, load)
                converted[key] = (*weights_to_tensors(model, weights), received)
            params, buffers, received = converted[key]
            spec = PartitionSpec.from_config(cfg, num_partitions)
            (x, y), _ = drift_client.partition_on_device(  # the per-client path's loader
                spec, partition, device, cfg["client-test-fraction"])
            job = prepared_round(update, model, cfg, device, partition, num_partitions,
                                 int(config.get("server-round", 1)), params, buffers,
                                 kept_state(update, model, cfg, load), received, x, y)
            carried = rows.count(partition) if rows is not None else 0
            members.append(RowMember(partition, arrays, job, carried, time.perf_counter() - begun))
        except Exception as exc:
            failed[partition] = on_failure(partition, exc, "before training")
    return members


def no_state(record: str) -> None:
    """The kept arrays of a client of a method that keeps none."""
    return None


def finish_rows(cfg: dict, members: list[RowMember], results, rows: ClientRows | None, on_failure,
                failed: dict[int, str], on_host: bool) -> tuple[list, dict]:
    """Each trained client's reply and metrics (``finished_round``, then the node's
    ``state_arrays_in`` and ``ray_node``), its kept state put in ``rows``; returns (the replies,
    {partition: the records it kept this round})."""
    replies, written = [], {}
    for member, result in zip(members, results):
        try:
            reply, kept, num_examples, metrics = finished_round(member.job, result, cfg, on_host)
        except Exception as exc:
            failed[member.partition] = on_failure(member.partition, exc, "after training")
            continue
        if kept and rows is not None:
            rows.put(member.partition, kept)
            written[member.partition] = kept
        if rows is not None and rows.count(member.partition):  # stateful methods only: 0 in a first round
            metrics["state_arrays_in"] = member.carried
        if in_ray_worker():
            metrics["ray_node"] = ray_node_id()
        replies.append((member.partition, reply, num_examples, metrics))
    return replies, written


def virtual_partition(partition: int, config: dict) -> int:
    """N (``num-partitions`` in a virtual client's config), checked: the server sends it to
    every virtual client, and ``partition`` must be one of its N."""
    if "num-partitions" not in config:
        raise ValueError(f"cohort node: the config of virtual client {partition} has no 'num-partitions' "
                         "(the server sends N, the partitions of the run's data, to every virtual client)")
    num_partitions = int(config["num-partitions"])
    if not 0 <= partition < num_partitions:
        raise ValueError(f"cohort node: virtual client {partition} is not a partition of {num_partitions}")
    return num_partitions
