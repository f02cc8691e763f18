"""``CohortClient``: a simulation node that hosts many virtual clients and trains the round's
clients it hosts together, in one ``tasks.functional.cohort_round`` (one ``torch.func.vmap``).

The ClientApp builds it instead of a method's client when the run is a cohort run
(``num-virtual-clients`` > 0, ``fl_app.common.execution_path``). The server sends a round's
instructions for the node's virtual clients as one bundle (``protocol.cohort``). ``fit``:

1. splits the bundle into per-client (partition p, arrays, config), the config carrying N as
   ``num-partitions``, and opens the round's client-state store (``client_state.choose_store``);
2. prepares each client's round through the per-client path's own functions
   (``fl_app.node.drift_client``: ``split_received``, ``kept_state``, ``prepared_round``), its
   kept state read through the store; w_t (and what the server sent besides it) is converted to
   tensors once per distinct set of arrays, not once per client (a method with ``personal``
   entries, FedBN's, gets its own per client);
3. trains all prepared clients in ONE ``cohort_round`` (``train``: clients whose rounds differ in
   what the cohort shares train in separate cohorts; a client without data, or of an
   ``unbatched`` update, alone through ``local_round``);
4. finishes each client (``finished_round``): its kept state into the store, then the node's
   filter on its reply (``fl_app.node.attacks.faulted_reply``: an injected ``nan`` or attack,
   the same function the per-client node runs), and closes the store's round (journal, mirror);
5. returns one reply for all: every client's arrays (``bundle_replies``), or, when the server
   asks for sums (``protocol.cohort.SUM``), their n_k-weighted mean and sums (``sum_replies``,
   on the training device on CUDA: ``device_sums``).

A client that fails in steps 2 or 4 is reported failed in the reply and the others go on; its
state stays as it was before the round. A failure of the cohort's training itself (step 3)
fails the node's message, so the server fails each of its clients.

Equal to the per-client path: each client's reply, state and metrics are those of its own
``DriftClient.fit`` within float rounding (vmap's batched kernels sum in another order: 1e-5
relative in float32, tests/node/test_cohort_node.py), exactly for a cohort of one, and bit for
bit when the per-client path's clients are trained by the same ``train``
(tests/node/test_cohort_rows.py). ``fit_seconds`` is each client's share of the node's round,
``prepare_seconds`` its own step 2, ``train_seconds`` its share of step 3 (``round_timings``).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Context, RecordDict
from flwr.client import NumPyClient

from fl_app.node import drift_client
from fl_app.node.attacks import faulted_reply, partition_metric, raise_if_injected, targets_clients
from fl_app.node.client_state import ROWS, ClientStateStore, RowsStore, choose_store, keep_from
from fl_app.node.drift_client import (
    DriftClient,
    finished_round,
    kept_state,
    prepared_round,
    split_received,
    tensors_squared_norm,
    weights_to_tensors,
)
from fl_app.node.node_client import in_ray_worker, ray_node_id, round_timings, wait_for_warm_up
from protocol.cohort import (
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
from tasks.datasets import input_shape
from tasks.functional import RoundResult, cohort_round, local_round
from tasks.functional.rounds import stack_trees
from tasks.functional.update import LocalUpdate, Round
from tasks.models import cached_model, default_device
from tasks.partitioning import PartitionSpec

log = logging.getLogger("flwr.fl_drift")


@dataclass
class Member:
    """A virtual client of the round, prepared as a row of the cohort."""

    partition: int
    arrays: list[np.ndarray]  # what the server sent it (w_t first)
    job: Round
    carried: int  # arrays it had kept when the round began (``state_arrays_in``)
    prepare_seconds: float


def virtual_partition(partition: int, config: dict) -> int:
    """N (``num-partitions`` in a virtual client's config), checked: the server sends it to
    every virtual client, and ``partition`` must be one of its N."""
    if NUM_PARTITIONS not in config:
        raise ValueError(f"cohort node: the config of virtual client {partition} has no 'num-partitions' "
                         "(the server sends N, the partitions of the run's data, to every virtual client)")
    num_partitions = int(config[NUM_PARTITIONS])
    if not 0 <= partition < num_partitions:
        raise ValueError(f"cohort node: virtual client {partition} is not a partition of {num_partitions}")
    return num_partitions


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


@contextmanager
def torch_threads(threads: int):
    """Run the block at ``threads`` torch threads (0: as the process is), then restore them."""
    before = torch.get_num_threads()
    if threads and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def train(jobs: list[Round], client_threads: int = 0) -> list[RoundResult]:
    """Every prepared round of the node's clients: one ``cohort_round`` per group of
    ``same_cohort`` rounds (one group in a run: all clients share the round's settings), a
    client without data, or of an ``unbatched`` update (FedDecorr), alone through
    ``local_round`` (``cohort_round`` needs data; FedDecorr's rounds amplify the batched kernels'
    other summation order). An unbatched client trains at ``client_threads`` torch threads
    (``client-threads``: the per-client path's, set by the runner; 0 = the node's own): its
    round is then its per-client round bit for bit, which another thread count's summation
    order alone would move by up to 0.2 relative (clients/feddecorr.py)."""
    results: list[RoundResult | None] = [None] * len(jobs)
    groups: list[list[int]] = []
    for i, job in enumerate(jobs):
        if len(job.x) == 0 or job.update.unbatched:
            with torch_threads(client_threads if job.update.unbatched else 0):
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


def failure(partition: int, exc: BaseException, when: str) -> str:
    log.warning("cohort node: virtual client %d failed %s", partition, when, exc_info=True)
    return f"{type(exc).__name__}: {exc}"


def prepare(update: LocalUpdate, cfg: dict, instructions, store: ClientStateStore,
            failed: dict[int, str]) -> list[Member]:
    """Each client's ``Round`` as its own node would prepare it (an injected ``raise`` first),
    w_t converted once per distinct set of sent arrays (per client for an update with
    ``personal`` entries, which replace some)."""
    device = default_device()
    model = cached_model(cfg["model"], input_shape(cfg["dataset"]), device)
    converted: dict[tuple, tuple] = {}  # ids of the sent arrays -> (params, buffers, received)
    members: list[Member] = []
    for partition, arrays, config in instructions:
        begun = time.perf_counter()
        try:
            raise_if_injected(cfg, partition)
            num_partitions = virtual_partition(partition, config)
            load = store.loader(partition)
            key = tuple(id(a) for a in arrays)
            if update.personal is not None or key not in converted:
                weights, received = split_received(update, model, cfg, arrays, load)
                converted[key] = (*weights_to_tensors(model, weights), received)
            params, buffers, received = converted[key]
            spec = PartitionSpec.from_config(cfg, num_partitions)
            (x, y), _ = drift_client.partition_on_device(spec, partition, device, cfg["client-test-fraction"])
            job = prepared_round(update, model, cfg, device, partition, num_partitions,
                                 int(config.get("server-round", 1)), params, buffers,
                                 kept_state(update, model, cfg, load), received, x, y)
            members.append(Member(partition, arrays, job, store.count(partition), time.perf_counter() - begun))
        except Exception as exc:  # this client fails; the others go on
            failed[partition] = failure(partition, exc, "before training")
    return members


def finish(cfg: dict, members: list[Member], results, store: ClientStateStore, failed: dict[int, str],
           on_host: bool) -> list:
    """Each trained client's reply and metrics (``finished_round``; its kept state into the
    store, then the node's ``faulted_reply``, ``state_arrays_in`` and ``ray_node``)."""
    replies = []
    for member, result in zip(members, results):
        try:
            reply, kept, num_examples, metrics = finished_round(member.job, result, cfg, on_host)
            store.keep(member.partition, kept or {})
            reply = faulted_reply(cfg, member.partition, member.job.server_round, reply, member.arrays,
                                  len(member.job.model.state_dict()))
        except Exception as exc:
            failed[member.partition] = failure(member.partition, exc, "after training")
            continue
        if store.count(member.partition):  # stateful methods only: 0 in a first round
            metrics["state_arrays_in"] = member.carried
        metrics.update(partition_metric(cfg, member.partition))
        if in_ray_worker():
            metrics["ray_node"] = ray_node_id()
        replies.append((member.partition, reply, num_examples, metrics))
    return replies


def device_sums(device: torch.device) -> SumOps:
    """``protocol.cohort.sum_replies``' operations on tensors on ``device``: the replies of a
    round summed where they were trained, in float64, and only the sums copied to the host (on a
    GPU, one model's and the drift sums' bytes instead of every client's model). The same
    products and sums, in the same order, as numpy's (``NUMPY_SUMS``): equal bit for bit but
    ``dot`` (float64 rounding), tests/node/test_cohort_rows.py."""
    def to64(a):
        return a.to(torch.float64) if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a), device=device,
                                                                                       dtype=torch.float64)

    def cast(value, ref):
        return (torch.round(value) if not ref.is_floating_point() else value).to(ref.dtype)

    def to_numpy(a):
        return a.detach().to("cpu", memory_format=torch.contiguous_format).numpy()
    return SumOps(to64=to64, dot=lambda d: float(torch.dot(d.reshape(-1), d.reshape(-1))),
                  zeros64=lambda a: torch.zeros(tuple(a.shape), dtype=torch.float64, device=device),
                  cast=cast, squares=tensors_squared_norm, to_numpy=to_numpy)


def sums_on_device(cfg: dict, device: torch.device, forced: bool | None) -> bool:
    """Whether a node sums its replies on its training device: on CUDA (the sums' inputs are
    there), not on a CPU, where numpy's float64 sums measured faster (docs/performance.md), nor
    when a fault or attack targets a client (they rewrite host arrays); ``forced`` (a test's)
    decides when not None."""
    if targets_clients(cfg):
        return False
    return forced if forced is not None else device.type == "cuda"


def sent_on_device(members: list[Member], device: torch.device) -> dict[int, list[torch.Tensor]]:
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


class CohortClient(NumPyClient):
    """A cohort node: many virtual clients of one method (see the module docstring).

    ``update`` is the method's client side (the registry's ``Method.update``), ``cfg`` the
    validated run config; ``partition_id`` / ``num_partitions`` are the node's own (its node
    config), which ``get_properties`` reports and the server orders the nodes by."""

    device_sums: bool | None = None  # sum on the training device: None = on CUDA (sums_on_device)

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

    def virtual_client(self, partition: int, config: dict, store: ClientStateStore) -> DriftClient:
        """The method's client of virtual client ``partition`` of N, as ``client_fn`` builds it on
        a node of that partition, its state read through ``store``."""
        num_partitions = virtual_partition(partition, config)
        context = Context(run_id=self.context.run_id, node_id=self.context.node_id,
                          node_config={"partition-id": partition, "num-partitions": num_partitions},
                          state=RecordDict(), run_config=self.context.run_config)
        return DriftClient(self.update, self.cfg, context, partition, num_partitions, store)

    # --------------------------------------------------------------- NumPyClient API
    def get_properties(self, config: dict) -> dict:
        """The node's own partition (the server orders its cohort nodes by it)."""
        return {"partition-id": self.partition_id, "num-partitions": self.num_partitions}

    def get_parameters(self, config: dict) -> list[np.ndarray]:
        return DriftClient(self.update, self.cfg, self.context, self.partition_id,
                           self.num_partitions).get_parameters(config)

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        """The bundled round of this node's virtual clients (module docstring)."""
        started = time.perf_counter()
        instructions = split_instructions(parameters, config)
        server_round = int(instructions[0][2].get("server-round", 1))
        store = choose_store(self.cfg, config, self.context, self.update, in_ray_worker(),
                             cohort_node=self.partition_id)
        store.open_round(server_round, int(config.get("checkpoint-round", 0)), [p for p, _, _ in instructions])
        for partition, _, client_config in instructions:  # back from a round the server did not count
            store.settle(partition, client_config)
        failed: dict[int, str] = {}
        members = prepare(self.update, self.cfg, instructions, store, failed)
        wait_for_warm_up()
        prepared = time.perf_counter()
        results = train([m.job for m in members], int(self.cfg["client-threads"])) if members else []
        train_share = (time.perf_counter() - prepared) / max(len(members), 1)
        on_device = SUM in config and sums_on_device(self.cfg, default_device(), self.device_sums)
        replies = finish(self.cfg, members, results, store, failed, on_host=not on_device)
        store.close_round(server_round, [p for p, *_ in replies], keep_from(config, server_round))
        share = (time.perf_counter() - started) / max(len(members), 1)
        prepare_seconds = {m.partition: m.prepare_seconds for m in members}
        for partition, _, _, metrics in replies:
            metrics.update(round_timings(prepare_seconds[partition], train_share))
            metrics["fit_seconds"] = share  # each client's share of the node's round
        if SUM not in config:
            return bundle_replies(replies, failed)
        if on_device:  # summed where they were trained
            sent, ops = sent_on_device(members, default_device()), device_sums(default_device())
        else:
            sent, ops = {m.partition: m.arrays for m in members}, NUMPY_SUMS
        return sum_replies([(p, r, n, m, sent[p]) for p, r, n, m in replies], failed, SumSpec.decode(config[SUM]),
                           ops)

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        """Evaluate one virtual client (the server sends evaluate instructions one client at a
        time: ``PARTITIONS`` names one partition) as its own node would; its state, read from the
        node's rows or ``context.state``, is not changed."""
        named = str(config.get(PARTITIONS, ""))
        if not named.strip().isdigit():
            raise ValueError(f"cohort node: evaluate needs {PARTITIONS!r} naming one virtual client, got {named!r}")
        client_config = {k: v for k, v in config.items() if k not in COHORT_KEYS}
        rows = self.context.state.config_records.get(ROWS)
        if rows is not None:  # the state lives in the node's rows: after its latest fit
            store = RowsStore(self.context, self.partition_id, int(rows["num-partitions"]), str(rows["run-dir"]))
            store.open_latest()
        else:
            store = choose_store(self.cfg, {}, self.context, self.update, False, cohort_node=self.partition_id)
        return self.virtual_client(int(named), client_config, store).evaluate(parameters, client_config)
