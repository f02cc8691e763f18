"""``CohortClient``: a simulation node that hosts many virtual clients and trains the round's
clients it hosts together, in one ``tasks.functional.cohort_round`` (one ``torch.func.vmap``).

The ClientApp builds it instead of a method's client when the run is a cohort run
(``num-virtual-clients`` > 0, ``fl_app.common.execution_path``). The server sends a round's instructions
for the node's virtual clients as one bundle (``fl_app.node.cohort_wire``).

A round runs as rows (``fit_rows``, ``fl_app.node.cohort_rows``: one preparation for the round's
clients, their state in one N-row store journalled once a round) unless ``rows_problem`` names
what needs a client object each (an injected fault or attack, ``client-state = "disk"``, a
stateful method without a disk mirror); then, and as the reference the rows are tested against
bit for bit, ``fit`` takes the object path:

1. splits the bundle into per-client (partition p, arrays, config), the config carrying N as
   ``num-partitions``;
2. per virtual client p builds the client exactly as ``client_fn`` would on a node of
   partition p of N (the one ``DriftClient`` running the method's ``LocalUpdate``), on its own
   view of ``context.state`` (only p's records, stored in the node's state under ``vc<p>/<key>``),
   wraps it in ``NodeClient`` and runs the node's steps before training (``begin_fit``: the
   state restored from its on-disk mirror, as a per-client node does) and the client's
   ``prepare_round``;
3. trains all prepared clients in ONE ``cohort_round`` (weights, buffers stacked; each client's
   own data, batch order, augmentation, state and server extras). Clients whose rounds differ
   in what the cohort shares (learning rate, optimiser, batch size, epochs) would train in
   separate cohorts; a client without data trains alone (``local_round``: 0 steps);
4. per client, the client's ``finish_round`` (its reply, state kept) and the node's steps
   after training (``end_fit``: state mirrored to disk), then its state view written back;
5. returns one reply for all: every client's arrays (``bundle_replies``), or, when the server
   asks for sums (``cohort_wire.SUM``), their n_k-weighted mean and sums (``sum_replies``).
   A client that fails in steps 2 or 4 is reported failed in the reply and the others go on;
   its state stays as it was before the round (as Flower keeps a node's state when its
   ClientApp raises). A failure of the cohort's training itself (step 3) fails the node's
   message, so the server fails each of its clients.

Where the object path keeps the virtual clients' state between rounds (``NodeResidentState``;
the rows keep theirs in ``cohort_rows.ClientRows`` likewise): in the node's process, not in
``context.state``, whenever the state is also mirrored on disk (the server checkpoints:
``checkpoint-every`` > 0 and its run folder is visible here) and ``client-state = "memory"``.
Flower's simulation ships a node's whole ``context.state`` to the actor and back with every
message, which for a cohort node is every hosted client's state (SCAFFOLD's c_i of 100 clients:
100 models, each way, each round); the process keeps the records instead and ``context.state``
carries a token naming the process's copy. A message that lands in another process (another
actor, a restarted one, a resumed run) finds no copy with that token and restores each client
from its disk mirror at its last round (as ``client-state = "disk"`` does), so the state is the
same records wherever it is read. Without a disk mirror the state stays in ``context.state``, as
on a per-client node.

Equal to the per-client path: each client's reply, state and metrics are those of its own
``DriftClient.fit`` within float rounding (vmap's batched kernels sum in another order: 1e-5
relative in float32, tests/node/test_cohort_node.py), and exactly for a cohort of one. The metric
``fit_seconds`` is each client's share of the node's round (the round's time over its clients),
``prepare_seconds`` its own step 2, ``train_seconds`` its share of step 3 (``round_timings``).
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.client import NumPyClient

from fl_app.node.cohort_rows import (
    ROWS,
    RowsJournal,
    device_sums,
    named_copy,
    node_rows,
    rows_problem,
    rows_round,
    state_of,
    stateful,
    sums_on_device,
    virtual_partition,
)
from fl_app.node.cohort_wire import (
    COHORT_KEYS,
    NUM_PARTITIONS,
    NUMPY_SUMS,
    PARTITIONS,
    SUM,
    SumOps,
    SumSpec,
    bundle_replies,
    split_instructions,
    sum_replies,
)
from fl_app.node.drift_client import DriftClient
from fl_app.node.node_client import NodeClient, NodeRound, round_timings, start_warm_up
from fl_app.node.state_mirror import partition_mirror, state_mirrored
from tasks.functional import RoundResult, cohort_round, local_round
from tasks.functional.rounds import stack_trees
from tasks.functional.update import LocalUpdate, Round
from tasks.models import default_device

log = logging.getLogger("flwr.fl_drift")


def state_prefix(partition: int) -> str:
    """Where virtual client ``partition``'s records live in the node's ``context.state``."""
    return f"vc{partition}/"


def state_view(state: RecordDict, partition: int) -> RecordDict:
    """A RecordDict of virtual client ``partition``'s records only, under their own names (the
    records themselves, not copies: the client replaces them, as in ``DriftClient.save_state``)."""
    prefix = state_prefix(partition)
    return RecordDict({key[len(prefix):]: record for key, record in state.items() if key.startswith(prefix)})


def store_view(state: RecordDict, partition: int, view: RecordDict) -> None:
    """Write virtual client ``partition``'s view back into the node's state: its old records
    replaced by the view's (a record the client deleted is deleted)."""
    prefix = state_prefix(partition)
    for key in [k for k in state.keys() if k.startswith(prefix)]:
        del state[key]
    for key, record in view.items():
        state[prefix + key] = record


RESIDENT = "cohort-resident-state"  # a ConfigRecord in context.state: the token of the process's copy


class NodeResidentState:
    """A cohort node's virtual clients' state records kept in this process between rounds, in
    front of their disk mirrors (module docstring). One per (run, node) in a process
    (``_RESIDENT``); ``token`` names this copy, and ``context.state`` carries it. With several
    cohort nodes and actors a process may hold a copy for each node it served; a copy whose
    token its node no longer carries is replaced the next time that node's message lands here."""

    def __init__(self, token: str):
        self.token = token
        self.records: dict[int, RecordDict] = {}  # partition -> its records, under their own names


_RESIDENT: dict[tuple[int, int], NodeResidentState] = {}


def resident_wanted(cfg: dict, config: dict) -> bool:
    """Whether a cohort node keeps its clients' state in its process this round: the state is
    mirrored on disk (``checkpoint-every`` > 0, the run folder visible here) and
    ``client-state = "memory"`` (with ``"disk"`` the state already lives only on disk)."""
    return cfg["client-state"] == "memory" and state_mirrored(config)


def failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class Member:
    """A virtual client of this round's cohort, prepared for training."""

    partition: int
    arrays: list[np.ndarray]
    config: dict
    node: NodeClient  # NodeClient around the method's client of partition ``partition``
    node_round: NodeRound
    job: Round

    @property
    def client(self) -> DriftClient:
        return self.node.client


def same_cohort(a: Round, b: Round) -> bool:
    """Whether two prepared rounds can train in one ``cohort_round``: the same update, model,
    hyper-parameters, batch size and epochs (what the cohort shares)."""
    return (a.update is b.update and a.model is b.model and a.hp == b.hp and a.batch_size == b.batch_size
            and a.epochs == b.epochs)


def train_cohort(jobs: list[Round]) -> list[RoundResult]:
    """The prepared rounds ``jobs`` (``same_cohort`` with each other, each with data) in one
    ``cohort_round``; per job its ``RoundResult``, as ``local_round`` returns it."""
    first = jobs[0]
    params, buffers = stack_trees([j.params for j in jobs]), stack_trees([j.buffers for j in jobs])
    if len(jobs) > 1:  # the layout vmap batches; one client keeps its own (stack_trees)
        params = {n: p.contiguous() for n, p in params.items()}
    augments = [j.augment if j.augment is not None and getattr(j.augment, "ops", True) else None for j in jobs]
    result = cohort_round(first.update, first.model, params, buffers, [j.state for j in jobs],
                          [j.server for j in jobs], first.hp, [(j.x, j.y) for j in jobs], first.batch_size,
                          first.epochs, [j.generator for j in jobs], augments)
    return [result.client(k) for k in range(len(jobs))]


def train(jobs: list[Round]) -> list[RoundResult]:
    """Every prepared round of the node's clients: one ``cohort_round`` per group of
    ``same_cohort`` rounds (one group in a run: all clients share the round's settings), a
    client without data, or of an ``unbatched`` update (FedDecorr), alone through
    ``local_round`` (``cohort_round`` needs data; FedDecorr's rounds amplify the batched kernels'
    other summation order)."""
    results: list[RoundResult | None] = [None] * len(jobs)
    groups: list[list[int]] = []
    for i, job in enumerate(jobs):
        if len(job.x) == 0 or job.update.unbatched:
            results[i] = local_round(job)
            continue
        for group in groups:
            if same_cohort(jobs[group[0]], job):
                group.append(i)
                break
        else:
            groups.append([i])
    for group in groups:
        for i, result in zip(group, train_cohort([jobs[i] for i in group])):
            results[i] = result
    return results


def sent_on_device(members, device: torch.device) -> dict[int, list[torch.Tensor]]:
    """Per member, the arrays it was sent as tensors on ``device`` (the drift sums' w_t), each
    distinct set converted once."""
    converted: dict[tuple, list[torch.Tensor]] = {}
    sent = {}
    for m in members:
        key = tuple(id(a) for a in m.arrays)
        if key not in converted:
            converted[key] = [torch.as_tensor(np.asarray(a)).to(device) for a in m.arrays]
        sent[m.partition] = converted[key]
    return sent


def node_reply(replies: list, failed: dict[int, str], sent: dict[int, list], config: dict,
               ops: SumOps = NUMPY_SUMS) -> tuple[list[np.ndarray], int, dict]:
    """The node's one reply: every client's arrays (``bundle_replies``), or, when the server asks
    for sums (``cohort_wire.SUM``), their n_k-weighted mean and sums (``sum_replies`` on ``ops``:
    numpy's, or the training device's, ``cohort_rows.device_sums``)."""
    if SUM in config:
        return sum_replies([(p, r, n, m, sent[p]) for p, r, n, m in replies], failed, SumSpec.decode(config[SUM]),
                           ops)
    return bundle_replies(replies, failed)


class CohortClient(NumPyClient):
    """A cohort node: many virtual clients of one method (see the module docstring).

    ``update`` is the method's client side (the registry's ``Method.update``), ``cfg`` the
    validated run config; ``partition_id`` / ``num_partitions`` are the node's own (its node
    config), which ``get_properties`` reports and the server orders the nodes by. ``rows``:
    whether a round may run as rows (``fl_app.node.cohort_rows``); False runs every round with
    one client object per virtual client (the reference the rows are tested against)."""

    rows = True
    device_sums: bool | None = None  # sum on the training device: None = on CUDA (cohort_rows.sums_on_device)

    def __init__(self, cfg: dict, context: Context, update: LocalUpdate, partition_id: int,
                 num_partitions: int):
        method = cfg.get("strategy", update.name)
        if update.client_mods(cfg):
            raise ValueError(f"method {method!r} cannot run on a cohort node: it wraps every message in client mods, "
                             "which act on one client's message; use execution = 'per-client'")
        if context.node_config.get("data-path"):
            raise ValueError(f"a cohort node hosts partitions of the run's dataset, not data-path = "
                             f"{context.node_config['data-path']!r}; use execution = 'per-client'")
        self.cfg = cfg
        self.context = context
        self.update = update
        self.partition_id = partition_id
        self.num_partitions = num_partitions

    # ----------------------------------------------------------------- virtual clients
    def virtual_client(self, partition: int, config: dict, state: RecordDict | None = None) -> DriftClient:
        """The method's client of virtual client ``partition`` of N (``num-partitions`` in
        ``config``), as ``client_fn`` builds it on a node of that partition, on its own view of
        the node's state (or on ``state``, its records read from the node's rows)."""
        num_partitions = virtual_partition(partition, config)
        context = Context(run_id=self.context.run_id, node_id=self.context.node_id,
                          node_config={"partition-id": partition, "num-partitions": num_partitions},
                          state=state if state is not None else state_view(self.context.state, partition),
                          run_config=self.context.run_config)
        return DriftClient(self.update, self.cfg, context, partition, num_partitions)

    def _prepare(self, partition: int, arrays: list[np.ndarray], config: dict) -> Member:
        node = NodeClient(self.virtual_client(partition, config))
        node_round = node.begin_fit(config)
        return Member(partition, arrays, config, node, node_round, node.client.prepare_round(arrays, config))

    def _finish(self, member: Member, result: RoundResult) -> tuple[int, list[np.ndarray], int, dict]:
        reply, num_examples, metrics = member.client.finish_round(member.job, result)
        reply, num_examples, metrics = member.node.end_fit(member.node_round, member.arrays, member.config,
                                                           reply, num_examples, metrics)
        store_view(self.context.state, member.partition, member.client.context.state)
        return member.partition, reply, num_examples, metrics

    # ------------------------------------------------------------ state between rounds
    def resident(self, run_dir: str) -> NodeResidentState:
        """This process's copy of the node's clients' state, if ``context.state``'s token names
        it; else a new, empty one (its clients then come back from their disk mirrors in
        ``run_dir``, which the token's record keeps for the node's evaluate messages)."""
        kept = named_copy(self.context, RESIDENT, _RESIDENT)
        if kept is None:
            kept = _RESIDENT[(self.context.run_id, self.context.node_id)] = NodeResidentState(uuid.uuid4().hex)
            self.context.state[RESIDENT] = ConfigRecord({"token": kept.token, "run-dir": run_dir})
        return kept

    def bring_in(self, kept: NodeResidentState, partition: int, run_dir: str, up_to_round: int) -> None:
        """Virtual client ``partition``'s records into ``context.state`` (under its prefix) for
        this round: from the process's copy, else from its disk mirror (the newest state saved
        at or before ``up_to_round``), else none (a client's first round)."""
        records = kept.records.get(partition)
        if records is None:
            saved = partition_mirror(run_dir, partition).load(up_to_round) or {}
            records = RecordDict({name: ArrayRecord(numpy_ndarrays=list(arrays)) for name, arrays in saved.items()})
        store_view(self.context.state, partition, records)

    def take_out(self, kept: NodeResidentState, partition: int) -> None:
        """Virtual client ``partition``'s records out of ``context.state`` into the process's
        copy (after its round, its mirror written), so that Flower does not ship them."""
        kept.records[partition] = state_view(self.context.state, partition)
        store_view(self.context.state, partition, RecordDict())

    # --------------------------------------------------------------- NumPyClient API
    def get_properties(self, config: dict) -> dict:
        """The node's own partition (the server orders its cohort nodes by it); starts the
        process's warm-up of torch.optim (the data of the virtual clients is not known yet)."""
        start_warm_up(None, 0)
        return {"partition-id": self.partition_id, "num-partitions": self.num_partitions}

    def get_parameters(self, config: dict) -> list[np.ndarray]:
        return DriftClient(self.update, self.cfg, self.context, self.partition_id,
                           self.num_partitions).get_parameters(config)

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        """The bundled round of this node's virtual clients (module docstring): as rows
        (``fl_app.node.cohort_rows``) where ``rows_problem`` finds nothing against it, else one
        client object each."""
        if self.rows and not rows_problem(self.cfg, config, self.update):
            return self.fit_rows(parameters, config)
        started = time.perf_counter()
        members: list[Member] = []
        failed: dict[int, str] = {}
        prepare: dict[int, float] = {}  # each client's own preparation (one after another)
        kept = self.resident(str(config["run-dir"])) if resident_wanted(self.cfg, config) else None
        brought: list[int] = []  # the clients whose records came in from the process or the mirror
        for partition, arrays, client_config in split_instructions(parameters, config):
            begun = time.perf_counter()
            try:
                if kept is not None:
                    up_to = int(client_config.get("server-round", 1)) - 1  # its last round's state
                    self.bring_in(kept, partition, str(config["run-dir"]), up_to)
                    brought.append(partition)
                members.append(self._prepare(partition, arrays, client_config))
            except Exception as exc:  # this client fails; the others go on
                log.warning("cohort node: virtual client %d failed before training", partition, exc_info=True)
                failed[partition] = failure(exc)
            prepare[partition] = time.perf_counter() - begun
        prepared = time.perf_counter()
        results = train([m.job for m in members]) if members else []
        train_share = (time.perf_counter() - prepared) / max(len(members), 1)
        replies = []
        for member, result in zip(members, results):
            try:
                replies.append(self._finish(member, result))
            except Exception as exc:
                log.warning("cohort node: virtual client %d failed after training", member.partition, exc_info=True)
                failed[member.partition] = failure(exc)
        for partition in brought:  # back to the process, a failed client's records as they were
            self.take_out(kept, partition)
        share = (time.perf_counter() - started) / max(len(members), 1)
        for partition, _, _, metrics in replies:
            metrics.update(round_timings(prepare[partition], train_share))
            metrics["fit_seconds"] = share  # each client's share of the node's round
        return node_reply(replies, failed, {m.partition: m.arrays for m in members}, config)

    def fit_rows(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        """The bundled round as rows (``cohort_rows.rows_round``): the clients' kept state read
        from and put in the node's ``ClientRows`` (restored from its journal in a process without
        this node's copy) and journalled once for the round; the same reply and metrics as
        ``fit``'s object path."""
        started = time.perf_counter()
        instructions = split_instructions(parameters, config)
        server_round = int(instructions[0][2].get("server-round", 1))
        num_partitions = int(config.get(NUM_PARTITIONS, 0))
        rows, journal = None, None
        if stateful(self.update) and num_partitions > 0:
            journal = RowsJournal(str(config["run-dir"]), self.partition_id)
            rows = node_rows(self.context, self.partition_id, num_partitions, str(config["run-dir"]),
                             server_round - 1)

        def on_failure(partition: int, exc: BaseException, when: str) -> str:
            log.warning("cohort node: virtual client %d failed %s", partition, when, exc_info=True)
            return failure(exc)
        on_device = SUM in config and sums_on_device(default_device(), self.device_sums)
        replies, failed, written, members, train_seconds = rows_round(self.update, self.cfg, instructions, rows,
                                                                      train, on_failure, on_host=not on_device)
        if journal is not None:
            journal.write(server_round, written, int(config.get("checkpoint-round", 0)))
        share = (time.perf_counter() - started) / max(len(members), 1)
        prepare = {m.partition: m.prepare_seconds for m in members}
        for partition, _, _, metrics in replies:
            metrics.update(round_timings(prepare[partition], train_seconds / max(len(members), 1)))
            metrics["fit_seconds"] = share
        if on_device:  # summed where they were trained (cohort_rows.device_sums)
            return node_reply(replies, failed, sent_on_device(members, default_device()), config,
                              device_sums(default_device()))
        return node_reply(replies, failed, {m.partition: m.arrays for m in members}, config)

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        """Evaluate one virtual client (the server sends evaluate instructions one client at a
        time: ``PARTITIONS`` names one partition) as its own node would; its state is read, not
        changed."""
        named = str(config.get(PARTITIONS, ""))
        if not named.strip().isdigit():
            raise ValueError(f"cohort node: evaluate needs {PARTITIONS!r} naming one virtual client, got {named!r}")
        client_config = {k: v for k, v in config.items() if k not in COHORT_KEYS}
        partition = int(named)
        rows_record = self.context.state.config_records.get(ROWS)
        if rows_record is not None:  # the state lives in the node's rows (fit_rows)
            rows = node_rows(self.context, self.partition_id, int(rows_record["num-partitions"]),
                             str(rows_record["run-dir"]), sys.maxsize)
            client = self.virtual_client(partition, client_config, state_of(rows, partition))
            return NodeClient(client).evaluate(parameters, client_config)
        record = self.context.state.config_records.get(RESIDENT)
        if record is None:  # the state lives in context.state
            return NodeClient(self.virtual_client(partition, client_config)).evaluate(parameters, client_config)
        run_dir = str(record["run-dir"])
        kept = self.resident(run_dir)
        self.bring_in(kept, partition, run_dir, sys.maxsize)  # after its latest fit
        try:
            return NodeClient(self.virtual_client(partition, client_config)).evaluate(parameters, client_config)
        finally:
            self.take_out(kept, partition)
