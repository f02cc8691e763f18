"""``NodeClient``: what a node does around a method's local training.

The ClientApp wraps every method's client (the one ``fl_app.node.drift_client.DriftClient``, running the
method's ``LocalUpdate``) in ``NodeClient``, the client-side counterpart of the server's
``DriftServer``. The method's ``fit`` is
its local training only; around it ``NodeClient.fit``:

1. counts the arrays the node's ``context.state`` carried into the round (after step 3 when
   that step restores any);
2. raises the injected ``raise`` fault (``inject-faults``) before any work;
3. restores the client's state from its on-disk mirror (``client-state = "disk"`` in a Ray
   simulation: the last round's state; a resumed run: the checkpointed round's) before the
   client reads it in ``prepare_round``;
4. lets a start-up warm-up finish, then runs the method's ``fit``;
5. adds ``state_arrays_in`` (stateful methods only: 0 in a node's first round);
6. poisons the reply (``nan`` and the attacks of ``fl_app.node.attacks``) after the client's
   ``finish_round`` has kept its state, so the method's own state stays honest;
7. writes the state mirror, and with ``client-state = "disk"`` clears ``context.state``;
8. adds ``ray_node`` (in a Ray worker) and ``fit_seconds`` (the client's share of the round),
   split by ``prepare_seconds`` and ``train_seconds`` (``round_timings``, added after step 4).

Steps 1-3 are ``begin_fit``, steps 5-8 ``end_fit``: a cohort node (``fl_app.node.cohort_client``)
runs them around each of its virtual clients, so a virtual client gets the same node steps.
"""

from __future__ import annotations

import hashlib
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch
from flwr.client import NumPyClient

from fl_app.common.background import in_background
from fl_app.common.faults import parse_faults
from fl_app.node.attacks import attacked_reply
from fl_app.node.drift_client import DriftClient
from fl_app.node.state_mirror import ClientStateMirror, partition_mirror, visible_run_dir
from tasks.functional import local_round
from tasks.partitioning import PartitionSpec, federated_dataset, load_partition, reads_decoded

_THREADS_MATCHED = False
_WARM_UP: Future | None = None


def in_ray_worker() -> bool:
    """True in a process that already runs Ray: an actor of Flower's simulation, which serves
    many messages. (A deployed SuperNode runs each message in a fresh process.)"""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def ray_node_id() -> str:
    """The id of the Ray node this process runs on (a simulation on a Ray cluster)."""
    return sys.modules["ray"].get_runtime_context().get_node_id()


def match_threads_to_cpu_share() -> None:
    """In a Ray actor (Flower's simulation), use as many torch threads as CPUs it was given.

    Ray exports OMP_NUM_THREADS for its workers, but torch may size its pool before that
    (or from the machine's core count); with several actors per machine, more threads than
    the actor's share only oversubscribe the cores. Outside Ray (deployment, tests) nothing
    changes. Once per process.
    """
    global _THREADS_MATCHED
    if _THREADS_MATCHED:
        return
    _THREADS_MATCHED = True
    if not in_ray_worker():
        return
    try:
        cpus = sys.modules["ray"].get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # not a worker, or an older Ray without the call
        return
    if cpus:
        torch.set_num_threads(max(1, int(cpus)))


def warm_up(spec: PartitionSpec | None, partition_id: int) -> None:
    """What a process's first fit() would otherwise pay: torch.optim's lazy imports (about
    a second: the first ``SGD(...)`` imports torch._dynamo) and, for a partition node, its
    data source: local parquet files' kept decoded arrays mapped and the partitioning's indices
    read (``load_partition``, milliseconds), else the flwr-datasets partitioning (the first
    ``load_partition`` cuts all partitions; ``datasets`` imported and the split loaded)."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    if spec is not None and spec.dataset != "synthetic":
        if reads_decoded(spec):
            load_partition(spec, partition_id)
        else:
            federated_dataset(spec).load_partition(partition_id, "train")


def start_warm_up(spec: PartitionSpec | None, partition_id: int) -> None:
    """Once per process, begin ``warm_up`` in the background. The server asks every node for
    its partition before round 1 and then decodes its test split and evaluates round 0: the
    clients idle then, so their start-up work overlaps the server's instead of adding to round 1.
    Only in a simulation actor: a deployed SuperNode answers each message in a process that
    exits after replying, where a warm-up would only compete with the reply."""
    global _WARM_UP
    if _WARM_UP is None and in_ray_worker():
        _WARM_UP = in_background(warm_up, spec, partition_id)


def wait_for_warm_up() -> None:
    """Let a started warm-up finish first (two threads must not build the same dataset)."""
    if _WARM_UP is not None:
        try:
            _WARM_UP.result()
        except Exception:  # the real call that follows reports the problem with its own context
            pass


def carried_arrays(client: DriftClient) -> int:
    """How many arrays the node's ``context.state`` holds."""
    return sum(len(record) for record in client.context.state.array_records.values())


def round_timings(prepare: float, train: float) -> dict[str, float]:
    """The fit metrics that split a client's ``fit_seconds``: ``prepare_seconds`` (the node's
    steps before training and ``prepare_round``: the client built, its data loaded or decoded,
    w_t converted) and ``train_seconds`` (the local loop; on a cohort node the client's share of
    the cohort's one ``cohort_round``). The rest of ``fit_seconds`` is ``finish_round`` and the
    node's steps after it (the reply converted, state kept). Two clock reads a round."""
    return {"prepare_seconds": prepare, "train_seconds": train}


@dataclass
class NodeRound:
    """What ``NodeClient.begin_fit`` found before the method's training, for ``end_fit``."""

    started: float  # time.perf_counter() at the start of the node's work on the round
    server_round: int
    carried: int  # arrays the client's context.state carried into the round
    fault: object  # the injected fault of this partition (None, "nan" or an attack)
    mirror: ClientStateMirror | None
    on_disk: bool  # client-state = "disk" in a Ray simulation


class NodeClient(NumPyClient):
    """A method's client with the node's plumbing around it (see the module docstring)."""

    def __init__(self, client: DriftClient):
        self.client = client

    def get_properties(self, config: dict) -> dict:
        """The node's partition (or data-path); starts the process's warm-up."""
        c = self.client
        if c.data_path:
            start_warm_up(None, 0)
        else:
            start_warm_up(PartitionSpec.from_config(c.cfg, c.num_partitions), c.partition_id)
        return c.get_properties(config)

    def get_parameters(self, config: dict) -> list[np.ndarray]:
        return self.client.get_parameters(config)

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        wait_for_warm_up()
        return self.client.evaluate(parameters, config)

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        """The method's fit with the node's steps around it, in order: an injected ``raise``
        fault, the client state restored from its mirror, the warm-up awaited, the method's
        fit (``DriftClient.fit``'s two halves around ``local_round``, timed: ``round_timings``),
        a ``nan`` fault or an attack on the reply, the state saved to its mirror, then the
        ``state_arrays_in``, ``ray_node`` and ``fit_seconds`` metrics."""
        node_round = self.begin_fit(config)
        client = self.client
        job = client.prepare_round(parameters, config)  # the method's fit: its two halves around the loop
        prepared = time.perf_counter()
        result = local_round(job)
        trained = time.perf_counter()
        reply, num_examples, metrics = client.finish_round(job, result)
        metrics.update(round_timings(prepared - node_round.started, trained - prepared))
        return self.end_fit(node_round, parameters, config, reply, num_examples, metrics)

    def begin_fit(self, config: dict) -> NodeRound:
        """The node's steps before the method's training: an injected ``raise`` fault, the
        client state restored from its mirror, the warm-up awaited. A cohort node
        (``fl_app.node.cohort_client``) calls this and ``end_fit`` per virtual client."""
        started = time.perf_counter()
        c = self.client
        server_round = int(config.get("server-round", 1))
        carried = carried_arrays(c)  # arrays this node's context.state carried into the round
        fault = parse_faults(c.cfg["inject-faults"]).get(c.partition_id)
        if fault == "raise":
            raise RuntimeError(f"injected fault: client of partition {c.partition_id} raises")
        mirror = self.state_mirror(config)
        on_disk = c.cfg["client-state"] == "disk" and in_ray_worker()
        carried = self._restore_state(mirror, on_disk, config, server_round, carried)
        wait_for_warm_up()
        return NodeRound(started, server_round, carried, fault, mirror, on_disk)

    def end_fit(self, node_round: NodeRound, parameters: list[np.ndarray], config: dict, reply: list[np.ndarray],
                num_examples: int, metrics: dict) -> tuple[list[np.ndarray], int, dict]:
        """The node's steps after the method's training (see ``fit``); returns the reply."""
        r, state = node_round, self.client.context.state
        if state.array_records:  # stateful methods only: 0 in a node's first round
            metrics["state_arrays_in"] = r.carried
        if r.on_disk and r.mirror is None and state.array_records:  # else the state would fork
            raise RuntimeError(f"client-state = \"disk\" needs the run folder {config.get('run-dir', '')!r} on this "
                               "Ray node (on a multi-node cluster: a results-dir on a filesystem every node mounts "
                               "at the same path); use client-state = \"memory\" otherwise")
        reply = self._faulted_reply(r.fault, reply, parameters, r.server_round)
        self._save_state(r.mirror, r.on_disk, config, r.server_round)
        if in_ray_worker():  # which machine of the Ray cluster ran this fit
            metrics["ray_node"] = ray_node_id()
        metrics["fit_seconds"] = time.perf_counter() - r.started  # the client's own share of the round
        return reply, num_examples, metrics

    def _restore_state(self, mirror, on_disk: bool, config: dict, server_round: int, carried: int) -> int:
        """Load the client's state from its mirror where it lives there: its last round's with
        ``client-state = "disk"`` in simulation, the checkpoint's round in a resumed run (an
        empty ``context.state``). Returns the arrays carried into the round, counted after the
        restore: the state the method starts the round with, so ``state_arrays_in`` reads the
        same whether the state came from memory, the disk or a checkpoint's mirror."""
        c = self.client
        if on_disk and mirror is not None:  # client-state = "disk" in simulation: its last round's state
            for name, arrays in (mirror.load(server_round - 1) or {}).items():
                c.save_state(name, arrays)
            return carried_arrays(c)
        if mirror is not None and not c.context.state.array_records:  # a resumed run: the checkpoint's round
            for name, arrays in (mirror.load(int(config.get("checkpoint-round", 0))) or {}).items():
                c.save_state(name, arrays)
            return carried_arrays(c)  # what the method starts the round with, as in an uninterrupted run
        return carried

    def _faulted_reply(self, fault: str | None, reply: list, parameters: list, server_round: int) -> list:
        """The reply as an injected ``nan`` fault or attack (fl_app/node/attacks.py) leaves it."""
        c = self.client
        if fault == "nan":
            reply = [np.full_like(a, np.nan) if np.issubdtype(a.dtype, np.floating) else a for a in reply]
        return attacked_reply(fault, reply, parameters, len(c.model.state_dict()),
                              c.cfg["seed"], c.partition_id, server_round, c.cfg)

    def _save_state(self, mirror, on_disk: bool, config: dict, server_round: int) -> None:
        """Mirror the client's state to disk after the round; with ``client-state = "disk"``
        the simulation then holds none of it between the node's rounds."""
        state = self.client.context.state
        if mirror is None or not state.array_records:
            return
        keep_from = int(config.get("checkpoint-round", 0)) if config.get("checkpoint-every") else server_round
        mirror.save(server_round, {n: r.to_numpy_ndarrays() for n, r in state.array_records.items()},
                    keep_from=keep_from)
        if on_disk:
            for name in list(state.array_records):
                del state[name]

    def state_mirror(self, config: dict) -> ClientStateMirror | None:
        """This client's on-disk copy of its state, when the server checkpoints the run or
        (``client-state = "disk"``, in a Ray simulation) the state lives there between rounds.

        Only where the server's run folder is visible to the client (simulation, or a
        deployment on a shared filesystem); a device elsewhere never creates the server's path.
        """
        c = self.client
        run_dir = visible_run_dir(config)
        wanted = config.get("checkpoint-every") or (c.cfg["client-state"] == "disk" and in_ray_worker())
        if not wanted or run_dir is None:
            return None
        if c.data_path:  # nodes with their own data have no partition id
            return ClientStateMirror(run_dir, "data-" + hashlib.sha1(c.data_path.encode()).hexdigest()[:12])
        return partition_mirror(run_dir, c.partition_id)
