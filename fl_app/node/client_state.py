"""A client's kept state between rounds, behind one interface (``ClientStateStore``) with three
backends, one of which ``choose_store`` picks for a node's round, with one line saying why:

- ``ContextStore``: the records in the node's ``context.state``, which Flower keeps per node (in
  simulation and deployment alike), under a prefix per client ('' on a per-client node,
  ``vc<p>/`` on a cohort node); when the server checkpoints and its run folder is visible here,
  each client's records are also mirrored on disk after its rounds (``ClientStateMirror``), and
  a resumed run (an empty ``context.state``) restores them from the checkpoint's round.
- ``DiskStore``: ``client-state = "disk"`` in a Ray simulation: between rounds a client's
  records live only in its mirror (the round before's), so Flower ships none of them.
- ``RowsStore``: a cohort node's N clients as rows in its process (``ClientRows``), named by a
  token in ``context.state`` (Flower ships a node's whole ``context.state`` with every message,
  which for a cohort node would be every client's state), journalled once a round
  (``RowsJournal``). A message that lands in a process without that copy (another actor, a
  restarted one, a resumed run) rebuilds it from the journal up to the round before, so the rows
  are the same wherever they are read.

A round: ``open_round`` (restore what lives elsewhere) before any client reads; ``settle`` per
client (a client whose last reply the server did not count goes back, below); ``loader`` /
``keep`` / ``count`` per client; ``close_round`` (mirror, journal, clear) after its clients
finished. A client whose round failed keeps the state it had.

In a run that screens (the fit instructions carry ``state-rollback``, ``protocol.counted``), the
chosen backend is wrapped in ``RevertibleStore``: with each client's records it keeps the copy
from before the round (``prior/<record>``) and the rounds of both (``state-round``), and
``settle`` puts the copy back when the server says (``state-counted-round``) that the round the
records come from was not counted: a SCAFFOLD client whose reply was rejected must not keep a
c_i the server's c never took (``fl_app.server.counted``).
"""

from __future__ import annotations

import contextlib
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from fl_app.common.files import STATE_NOT_KEPT, StateNotKept, atomic_savez
from protocol.counted import COUNTED, ROLLBACK
from protocol.keys import ConfigError
from tasks.functional.update import LocalUpdate

Load = Callable[[str], "list[np.ndarray] | None"]  # a client's arrays kept under a record name, or None
Kept = dict[str, list[np.ndarray]]  # {record name: arrays}


def visible_run_dir(config: dict) -> str | None:
    """The server's run folder named in a fit instruction (``run-dir``), when this process sees
    it (simulation, or a deployment on a shared filesystem), else None: a client mirrors its
    state only there, and never creates the server's path elsewhere."""
    run_dir = str(config.get("run-dir", ""))
    return run_dir if run_dir and Path(run_dir).is_dir() else None


def state_mirrored(config: dict) -> bool:
    """Whether the clients' state is mirrored on disk this round: the server checkpoints
    (``checkpoint-every`` > 0) and its run folder is visible here (``visible_run_dir``)."""
    return bool(config.get("checkpoint-every")) and visible_run_dir(config) is not None


def keep_from(config: dict, server_round: int) -> int:
    """The oldest round a resume may restart from (the last checkpoint's, or this round without
    checkpoints): a mirror or journal file older than what that round reads is never read."""
    return int(config.get("checkpoint-round", 0)) if config.get("checkpoint-every") else server_round


def stateful(update: LocalUpdate) -> bool:
    """Whether the method's clients keep arrays across rounds (declared state or personal entries)."""
    return bool(update.state) or update.personal is not None


class StateFileError(ConfigError):
    """A client-state file (a mirror's or a journal's) that cannot be read: truncated or corrupt.
    One line naming the file (and, before a resume, the fix: ``check_state_files``)."""


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` file ``path``, each read whole (a member's CRC-32 is checked
    as it is read, so a truncated or altered file is found here, not half applied);
    ``StateFileError`` (one line naming the file) when it cannot be read."""
    try:
        with np.load(path) as data:
            return {key: data[key] for key in data.files}
    except Exception as exc:  # zipfile.BadZipFile, EOFError, OSError, ValueError, ...
        raise StateFileError(f"client state {path} is unreadable (truncated or corrupt: {type(exc).__name__}:"
                             f" {exc})") from exc


@contextlib.contextmanager
def kept_or_stop(who: str) -> Iterator[None]:
    """Around the write of a client's kept state to disk: a write that fails (a full disk, a
    folder made read-only) is ``StateNotKept``, which stops the run, rather than one failed
    client the round goes on without (``fl_app.common.files``)."""
    try:
        yield
    except OSError as exc:
        raise StateNotKept(f"{STATE_NOT_KEPT}: {who} cannot write {exc.filename or 'its state'}: "
                           f"{exc.strerror or exc}") from exc


# ------------------------------------------------------------------ one client's mirror
class ClientStateMirror:
    """One client's records on disk, one file a round: ``<run-dir>/client-state/<client>/round-<t>.npz``."""

    PATTERN = re.compile(r"round-(\d+)\.npz$")

    def __init__(self, run_dir: str, client: str):
        self.dir = Path(run_dir) / "client-state" / client

    def _files(self) -> list[tuple[int, Path]]:
        if not self.dir.exists():
            return []
        return sorted((int(m.group(1)), p) for p in self.dir.iterdir() if (m := self.PATTERN.search(p.name)))

    def save(self, server_round: int, state: Kept, keep_from: int) -> None:
        """Write this round's records; drop files no resume can need (older than the newest
        file at or before ``keep_from``)."""
        atomic_savez(self.dir / f"round-{server_round}.npz",
                     {f"{name}\x1f{i}": np.asarray(a) for name, values in state.items() for i, a in enumerate(values)})
        files = self._files()
        floor = max((r for r, _ in files if r <= keep_from), default=None)
        for r, p in files:
            if floor is not None and r < floor:
                p.unlink(missing_ok=True)

    def load(self, up_to_round: int) -> Kept | None:
        """The newest saved records from a round <= ``up_to_round``."""
        candidates = [p for r, p in self._files() if r <= up_to_round]
        if not candidates:
            return None
        state: dict[str, dict[int, np.ndarray]] = {}
        for key, array in read_arrays(candidates[-1]).items():
            name, i = key.rsplit("\x1f", 1)
            state.setdefault(name, {})[int(i)] = array
        return {name: [d[i] for i in sorted(d)] for name, d in state.items()}


PARTITION = "partition-"  # a partition's mirror is client-state/partition-<p>


def partition_mirror(run_dir: str, partition: int) -> ClientStateMirror:
    """The mirror of the client of partition ``partition`` (a data-path node's is named otherwise)."""
    return ClientStateMirror(run_dir, f"{PARTITION}{partition}")


def mirrored_partitions(run_dir: str) -> list[int]:
    """The partitions whose clients have a mirror in ``run_dir``."""
    folder = Path(run_dir) / "client-state"
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(int(n[len(PARTITION):]) for n in names if n.startswith(PARTITION) and n[len(PARTITION):].isdigit())


def files_a_resume_reads(run_dir: Path, checkpoint_round: int) -> list[Path]:
    """The client-state files a run resumed from its checkpoint of ``checkpoint_round`` reads:
    of each client's mirror the newest file of a round <= it (``ClientStateMirror.load``), of
    each cohort node's journal every file of a round <= it (``RowsJournal.restore``). Files of
    later rounds are never read (a journal's are removed, a mirror's rewritten by the resumed run)."""
    found = []
    for folder, kind in (("client-state", ClientStateMirror), ("client-rows", RowsJournal)):
        folder = Path(run_dir) / folder
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []:
            files = sorted((int(m.group(1)), f) for f in sub.iterdir() if (m := kind.PATTERN.search(f.name)))
            upto = [f for r, f in files if r <= checkpoint_round]
            found += upto[-1:] if kind is ClientStateMirror else upto
    return found


def check_state_files(run_dir: Path, checkpoint: Path, checkpoint_round: int) -> None:
    """Every client-state file a resume from ``checkpoint`` (of round ``checkpoint_round``) reads
    is read whole now (``files_a_resume_reads``, ``read_arrays``), so a truncated or corrupt one
    is refused in one line before a round runs (``StateFileError``), not found by its client, which
    would fail every round it is sampled while the run goes on without it. No older file stands
    in for a broken one: it holds an older round's state, which the checkpoint's round does not
    continue."""
    for path in files_a_resume_reads(run_dir, checkpoint_round):
        try:
            read_arrays(path)
        except StateFileError as exc:
            raise StateFileError(f"{exc}; {checkpoint} (round {checkpoint_round}) needs it to restore the clients'"
                                 f" state: put the file back as it was, or rename {checkpoint} (e.g. to"
                                 f" {checkpoint.name}.bad) to start this run from round 1") from exc


# ------------------------------------------------------------------------ the stores
class ClientStateStore:
    """Read a client's kept state, keep it, count it, restore it up to a round (module docstring).
    This base holds nothing: the store of a method whose clients keep no arrays."""

    why = "the method's clients keep no arrays between rounds"

    def open_round(self, server_round: int, checkpoint_round: int, partitions: list[int]) -> None:
        """Before the round's clients read: bring in what lives elsewhere between rounds."""

    def settle(self, partition: int, config: dict) -> bool:
        """Before client ``partition`` reads, with its fit instruction ``config``: go back to the
        state from before a round the server did not count (``RevertibleStore``); True when it
        did. Here, and in a run that does not screen, nothing to do."""
        return False

    def loader(self, partition: int) -> Load:
        return lambda record: None

    def keep(self, partition: int, kept: Kept) -> None:
        """Client ``partition``'s new arrays of each record in ``kept`` (others stay)."""
        if kept:
            raise RuntimeError(f"client {partition} kept {sorted(kept)}, but its method declares no state")

    def records(self, partition: int) -> Kept:
        return {}

    def count(self, partition: int) -> int:
        """How many arrays client ``partition`` keeps now (``state_arrays_in``)."""
        return sum(len(arrays) for arrays in self.records(partition).values())

    def close_round(self, server_round: int, finished: list[int], keep_from: int) -> None:
        """After the round: persist what the ``finished`` clients keep."""


class ContextStore(ClientStateStore):
    """The records in ``state`` (a node's ``context.state``) under ``prefix(partition)``,
    mirrored after a round through ``mirror(partition)`` when that gives one."""

    def __init__(self, state: RecordDict, prefix: Callable[[int], str] = lambda p: "",
                 mirror: Callable[[int], ClientStateMirror | None] = lambda p: None, why: str = ""):
        self.state, self.prefix, self.mirror = state, prefix, mirror
        self.why = why or "context.state (Flower keeps it per node)"

    def _keys(self, partition: int) -> dict[str, str]:
        prefix = self.prefix(partition)
        return {key[len(prefix):]: key for key in self.state.array_records if key.startswith(prefix)}

    def open_round(self, server_round: int, checkpoint_round: int, partitions: list[int]) -> None:
        """A resumed run (no records here, a mirror on disk): each client's records of the
        checkpoint's round."""
        for p in partitions:
            mirror = self.mirror(p)
            if mirror is not None and not self._keys(p):
                self.keep(p, mirror.load(checkpoint_round) or {})

    def loader(self, partition: int) -> Load:
        keys = self._keys(partition)
        return lambda record: self.state[keys[record]].to_numpy_ndarrays() if record in keys else None

    def keep(self, partition: int, kept: Kept) -> None:
        for name, arrays in kept.items():
            self.state[self.prefix(partition) + name] = ArrayRecord(numpy_ndarrays=[np.asarray(a) for a in arrays])

    def records(self, partition: int) -> Kept:
        return {name: self.state[key].to_numpy_ndarrays() for name, key in self._keys(partition).items()}

    def count(self, partition: int) -> int:
        return sum(len(self.state[key]) for key in self._keys(partition).values())

    def close_round(self, server_round: int, finished: list[int], keep_from: int) -> None:
        for p in finished:
            mirror, records = self.mirror(p), self.records(p)
            if mirror is not None and records:
                with kept_or_stop(mirror.dir.name):
                    mirror.save(server_round, records, keep_from=keep_from)


class DiskStore(ContextStore):
    """``ContextStore`` whose records are in ``context.state`` only during a round: brought in
    from each client's mirror (its last round's) and cleared after the mirror is written."""

    def open_round(self, server_round: int, checkpoint_round: int, partitions: list[int]) -> None:
        for p in partitions:
            self._clear(p)
            self.keep(p, self.mirror(p).load(server_round - 1) or {})

    def close_round(self, server_round: int, finished: list[int], keep_from: int) -> None:
        super().close_round(server_round, finished, keep_from)
        for key in list(self.state.array_records):  # the whole node's state lives on disk
            del self.state[key]

    def _clear(self, partition: int) -> None:
        for key in self._keys(partition).values():
            del self.state[key]


class ClientRows:
    """N clients' kept state as rows: per record name, one ``[N, ...]`` array per entry, and a
    bool ``[N]`` of the clients that kept it (a client that never did has no row: the update's
    ``begin`` supplies its initial value). ``token`` names this copy."""

    def __init__(self, num_partitions: int, token: str):
        self.num_partitions = num_partitions
        self.token = token
        self.rows: dict[str, list[np.ndarray]] = {}
        self.kept: dict[str, np.ndarray] = {}

    def records(self, partition: int) -> Kept:
        """Every record client ``partition`` kept (views of its rows)."""
        return {record: [rows[partition] for rows in self.rows[record]]
                for record, kept in self.kept.items() if kept[partition]}

    def put(self, partition: int, kept: Kept) -> None:
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
    the key ``record\\x1fpartition\\x1fentry`` (no stacked copy: on the 2-core machine 0.08 s for
    SCAFFOLD's 30 rows of ``cnn-small``, against 0.34 s stacked per entry), written atomically.
    The store as of round u is every file up to u applied in round order (``restore``)."""

    PATTERN = re.compile(r"round-(\d+)\.npz$")

    def __init__(self, run_dir: str, node: int):
        self.dir = Path(run_dir) / "client-rows" / f"node-{node}"

    def files(self) -> list[tuple[int, Path]]:
        if not self.dir.exists():
            return []
        return sorted((int(m.group(1)), p) for p in self.dir.iterdir() if (m := self.PATTERN.search(p.name)))

    def write(self, server_round: int, kept: dict[int, Kept], keep_from: int) -> None:
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
            data = read_arrays(path)
            for (record, partition), keys in self._rows(data).items():
                rows.put(partition, {record: [data[key] for key in keys]})

    def drop_after(self, server_round: int) -> None:
        """Remove the files of rounds after ``server_round`` (a killed run's rounds past the
        checkpoint a resumed run restarts from: the resumed run writes its own)."""
        for r, path in self.files():
            if r > server_round:
                path.unlink(missing_ok=True)

    def prune(self, keep_from: int) -> None:
        """Remove each file at or before ``keep_from`` whose every row a later file at or before
        ``keep_from`` holds again (a resume from that round or later never reads it)."""
        later: set[tuple[str, int]] = set()
        for _, path in reversed([(r, p) for r, p in self.files() if r <= keep_from]):
            with np.load(path) as data:
                rows = set(self._rows(data.files))
            if rows <= later:
                path.unlink(missing_ok=True)
            later |= rows


ROWS = "cohort-client-rows"  # a ConfigRecord in context.state: the token of the process's ClientRows
_ROWS: dict[tuple[int, int], ClientRows] = {}  # (run, node) -> this process's copy


def node_rows(context: Context, node: int, num_partitions: int, run_dir: str, up_to_round: int) -> ClientRows:
    """This process's ``ClientRows`` of the node, if ``context.state``'s token names it; else a new
    copy restored from the node's journal up to ``up_to_round`` (its later files removed: a
    resumed run's, or no one's), or, with no journal yet, from per-client mirrors (a run
    checkpointed client by client); its token then put in ``context.state``."""
    named = context.state.config_records.get(ROWS)
    token = str(named["token"]) if named is not None and "token" in named else ""
    kept = _ROWS.get((context.run_id, context.node_id))
    if kept is not None and token and kept.token == token and kept.num_partitions == num_partitions:
        return kept
    kept = _ROWS[(context.run_id, context.node_id)] = ClientRows(num_partitions, uuid.uuid4().hex)
    journal = RowsJournal(run_dir, node)
    if up_to_round < sys.maxsize:
        journal.drop_after(up_to_round)
    if any(r <= up_to_round for r, _ in journal.files()):
        journal.restore(kept, up_to_round)
    else:
        for partition in mirrored_partitions(run_dir):
            saved = partition_mirror(run_dir, partition).load(up_to_round)
            if saved and partition < num_partitions:
                kept.put(partition, saved)
    context.state[ROWS] = ConfigRecord({"token": kept.token, "run-dir": run_dir, "num-partitions": num_partitions})
    return kept


class RowsStore(ClientStateStore):
    """A cohort node's ``ClientRows``, journalled once a round (module docstring)."""

    why = "rows in the node's process, journalled each round under the run folder (the server checkpoints)"

    def __init__(self, context: Context, node: int, num_partitions: int, run_dir: str):
        self.context, self.node, self.num_partitions, self.run_dir = context, node, num_partitions, run_dir
        self.rows: ClientRows | None = None
        self.written: dict[int, Kept] = {}

    def open_round(self, server_round: int, checkpoint_round: int, partitions: list[int]) -> None:
        self.rows = node_rows(self.context, self.node, self.num_partitions, self.run_dir, server_round - 1)
        self.written = {}

    def open_latest(self) -> None:
        """The rows after the node's latest fit (for a client's evaluate: nothing is kept)."""
        self.rows = node_rows(self.context, self.node, self.num_partitions, self.run_dir, sys.maxsize)

    def loader(self, partition: int) -> Load:
        rows = self.rows

        def load(record: str) -> list[np.ndarray] | None:  # views of the rows, which preparation copies
            if record not in rows.kept or not rows.kept[record][partition]:
                return None
            return [entry[partition] for entry in rows.rows[record]]
        return load

    def keep(self, partition: int, kept: Kept) -> None:
        if not kept:
            return
        self.rows.put(partition, kept)
        self.written.setdefault(partition, {}).update(kept)  # a settled client keeps twice in a round

    def records(self, partition: int) -> Kept:
        return self.rows.records(partition)

    def close_round(self, server_round: int, finished: list[int], keep_from: int) -> None:
        with kept_or_stop(f"cohort node {self.node}"):
            RowsJournal(self.run_dir, self.node).write(server_round, self.written, keep_from)


PRIOR = "prior/"  # RevertibleStore: a record as it was before the round the records are from
ROUND = "state-round"  # RevertibleStore: [the round the records are from (0: void), the prior copy's (0: none)]


class RevertibleStore(ClientStateStore):
    """``inner`` (any backend) keeping, with a client's records, the copy from before the round
    (module docstring), so that ``settle`` can go back one round. What a client reads, counts
    and keeps is its own records only; the copy and the rounds are ``inner``'s like any record
    (mirrored, journalled, restored on resume with the rest).

    One copy is enough: after ``settle`` a client's records are always from a counted round (or
    void), so the copy its next round takes is counted too. ``void`` (the round's first keep had
    no earlier records, or added a record the copy lacks): going back means no state at all, as
    a client never sampled, whose ``begin`` gives the initial values."""

    def __init__(self, inner: ClientStateStore):
        self.inner = inner
        self.why = f"{inner.why}; with the copy from before each round (screening may leave a reply out)"
        self.server_round = 0
        self.copied: set[int] = set()

    def _rounds(self, partition: int) -> tuple[int, int] | None:
        """``state-round`` of client ``partition``: (its records' round, its copy's), or None."""
        arrays = self.inner.loader(partition)(ROUND)
        return None if arrays is None else (int(arrays[0][0]), int(arrays[0][1]))

    @staticmethod
    def _void(rounds: tuple[int, int] | None) -> bool:
        """The client went back to no state (its records' round is 0)."""
        return rounds is not None and rounds[0] == 0

    def _own(self, partition: int, rounds: tuple[int, int] | None) -> Kept:
        """The client's own records (not the copy, not the rounds); none when void."""
        if self._void(rounds):
            return {}
        return {name: arrays for name, arrays in self.inner.records(partition).items()
                if name != ROUND and not name.startswith(PRIOR)}

    def open_round(self, server_round: int, checkpoint_round: int, partitions: list[int]) -> None:
        self.inner.open_round(server_round, checkpoint_round, partitions)
        self.server_round, self.copied = server_round, set()

    def settle(self, partition: int, config: dict) -> bool:
        rounds = self._rounds(partition)
        if COUNTED not in config or rounds is None or rounds[0] <= int(config[COUNTED]):
            return False
        kept_round, prior_round = rounds
        if prior_round:
            back = {name[len(PRIOR):]: [np.array(a) for a in arrays]
                    for name, arrays in self.inner.records(partition).items() if name.startswith(PRIOR)}
            self.inner.keep(partition, {**back, ROUND: [np.array([prior_round, 0], dtype=np.int64)]})
        else:
            self.inner.keep(partition, {ROUND: [np.array([0, 0], dtype=np.int64)]})
        return True

    def loader(self, partition: int) -> Load:
        if self._void(self._rounds(partition)):
            return lambda record: None
        return self.inner.loader(partition)

    def keep(self, partition: int, kept: Kept) -> None:
        if not kept:
            return
        if partition in self.copied:
            self.inner.keep(partition, kept)
            return
        rounds = self._rounds(partition)
        own = self._own(partition, rounds)
        # the copy's round: 0 (going back is to no state) without earlier records, with records
        # of no known round (kept before the run screened), or when this round adds a record
        prior_round = rounds[0] if own and rounds is not None and set(kept) <= set(own) else 0
        copy = {PRIOR + name: [np.array(a) for a in arrays] for name, arrays in own.items()} if prior_round else {}
        rounds_now = np.array([self.server_round, prior_round], dtype=np.int64)
        self.inner.keep(partition, {**copy, **kept, ROUND: [rounds_now]})
        self.copied.add(partition)

    def records(self, partition: int) -> Kept:
        return self._own(partition, self._rounds(partition))

    def count(self, partition: int) -> int:
        return sum(len(arrays) for arrays in self.records(partition).values())

    def close_round(self, server_round: int, finished: list[int], keep_from: int) -> None:
        self.inner.close_round(server_round, finished, keep_from)


def virtual_prefix(partition: int) -> str:
    """Where virtual client ``partition``'s records live in a cohort node's ``context.state``."""
    return f"vc{partition}/"


def choose_store(cfg: dict, config: dict, context: Context, update: LocalUpdate, in_ray: bool,
                 client: str | None = None, cohort_node: int | None = None) -> ClientStateStore:
    """The one decision of where a node's clients keep their state this round (``why`` says it):
    the fit ``config`` (run folder, checkpoints), ``client`` the mirror name of a per-client
    node's client (``partition-<p>``, or a data-path node's), ``cohort_node`` a cohort node's id."""
    if not stateful(update):
        return ClientStateStore()
    run_dir = visible_run_dir(config)
    prefix = virtual_prefix if cohort_node is not None else (lambda p: "")
    if cfg["client-state"] == "disk" and in_ray:
        if run_dir is None:
            raise RuntimeError(f"client-state = \"disk\" needs the run folder {config.get('run-dir', '')!r} on this "
                               "Ray node (on a multi-node cluster: a results-dir on a filesystem every node mounts "
                               "at the same path); use client-state = \"memory\" otherwise")
        return revertible(DiskStore(context.state, prefix, lambda p: mirror_of(run_dir, p, client),
                                    "client-state = 'disk': each client's mirror on disk between rounds"), config)
    if cohort_node is not None and state_mirrored(config):
        store = RowsStore(context, cohort_node, int(config.get("num-partitions", 0)), run_dir)
    elif cohort_node is not None:
        store = ContextStore(context.state, prefix, why="context.state under vc<p>/: the state is not mirrored "
                             "(checkpoint-every = 0 or no run folder here), so Flower carries it with the node")
    else:
        mirrored = state_mirrored(config)
        store = ContextStore(context.state, prefix, lambda p: mirror_of(run_dir, p, client) if mirrored else None,
                             "context.state" + (", mirrored on disk for a resume" if mirrored else ""))
    return revertible(store, config)


def revertible(store: ClientStateStore, config: dict) -> ClientStateStore:
    """``store`` wrapped in ``RevertibleStore`` when the run screens (``state-rollback`` in the
    fit instruction), else ``store``."""
    return RevertibleStore(store) if config.get(ROLLBACK) else store


def mirror_of(run_dir: str, partition: int, client: str | None) -> ClientStateMirror:
    """Client ``partition``'s mirror: a per-client node's own (``client``), a cohort client's by partition."""
    return ClientStateMirror(run_dir, client) if client is not None else partition_mirror(run_dir, partition)
