"""``NodeClient``: what a node does around a method's local training.

The ClientApp wraps every method's client (the one ``fl_app.node.drift_client.DriftClient``,
running the method's ``LocalUpdate``) in ``NodeClient``, the client-side counterpart of the
server's ``DriftServer``. The method's ``fit`` is its local training only; around it
``NodeClient.fit``:

1. raises the injected ``raise`` fault (``inject-faults``, ``fl_app.node.attacks``) before any work;
2. opens the round's client-state store (``fl_app.node.client_state.choose_store``: the node's
   ``context.state``, mirrored on disk when the server checkpoints, or with
   ``client-state = "disk"`` in a Ray simulation the client's mirror) and counts the arrays the
   client carries into the round (after a resumed run's or the disk's restore, and after
   ``settle``: in a run that screens, a client whose last reply the server did not count goes
   back to its state from before that round);
3. lets a start-up warm-up finish, then runs the method's ``prepare_round``, ``local_round`` and
   ``finish_round`` (which keeps the client's state through the store);
4. adds ``state_arrays_in`` (stateful methods only: 0 in a node's first round);
5. filters the reply (``attacks.faulted_reply``: an injected ``nan`` or attack), after the
   method has kept its state, so the method's own state stays honest;
6. closes the store's round (the mirror written; with ``client-state = "disk"`` nothing kept in
   ``context.state``);
7. adds ``ray_node`` (in a Ray worker) and ``fit_seconds`` (the client's round), split by
   ``prepare_seconds`` and ``train_seconds`` (``round_timings``).

A cohort node (``fl_app.node.cohort_client``) runs the same fault functions and store around
each of its virtual clients.
"""

from __future__ import annotations

import hashlib
import sys
import time
from concurrent.futures import Future

import numpy as np
import torch
from flwr.client import NumPyClient

from fl_app.common.background import in_background
from fl_app.node.attacks import faulted_reply, partition_metric, raise_if_injected
from fl_app.node.client_state import PARTITION, choose_store, keep_from
from fl_app.node.drift_client import DriftClient
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


def warm_up(spec: PartitionSpec, partition_id: int) -> None:
    """What a partition node's first fit() would otherwise pay for its data source: local
    parquet files' kept decoded arrays mapped and the partitioning's indices read
    (``load_partition``, milliseconds), else the flwr-datasets partitioning (the first
    ``load_partition`` cuts all partitions; ``datasets`` imported and the split loaded)."""
    if spec.dataset != "synthetic":
        if reads_decoded(spec):
            load_partition(spec, partition_id)
        else:
            federated_dataset(spec).load_partition(partition_id, "train")


def start_warm_up(spec: PartitionSpec, partition_id: int) -> None:
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


def round_timings(prepare: float, train: float) -> dict[str, float]:
    """The fit metrics that split a client's ``fit_seconds``: ``prepare_seconds`` (the node's
    steps before training and ``prepare_round``: the client built, its data loaded or decoded,
    w_t converted) and ``train_seconds`` (the local loop; on a cohort node the client's share of
    the cohort's one ``cohort_round``). The rest of ``fit_seconds`` is ``finish_round`` and the
    node's steps after it (the reply converted, state kept). Two clock reads a round."""
    return {"prepare_seconds": prepare, "train_seconds": train}


class NodeClient(NumPyClient):
    """A method's client with the node's plumbing around it (see the module docstring)."""

    def __init__(self, client: DriftClient):
        self.client = client

    def get_properties(self, config: dict) -> dict:
        """The node's partition (or data-path); starts the process's warm-up of its data."""
        c = self.client
        if not c.data_path:
            start_warm_up(PartitionSpec.from_config(c.cfg, c.num_partitions), c.partition_id)
        return c.get_properties(config)

    def get_parameters(self, config: dict) -> list[np.ndarray]:
        return self.client.get_parameters(config)

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        wait_for_warm_up()
        return self.client.evaluate(parameters, config)

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        """The method's fit with the node's steps around it (module docstring)."""
        started = time.perf_counter()
        c = self.client
        server_round = int(config.get("server-round", 1))
        raise_if_injected(c.cfg, c.partition_id)
        c.store = store = choose_store(c.cfg, config, c.context, c.update, in_ray_worker(), client=self.mirror_name())
        store.open_round(server_round, int(config.get("checkpoint-round", 0)), [c.partition_id])
        store.settle(c.partition_id, config)  # back from a round the server did not count
        carried = store.count(c.partition_id)
        wait_for_warm_up()
        job = c.prepare_round(parameters, config)  # the method's fit: its two halves around the loop
        prepared = time.perf_counter()
        result = local_round(job)
        trained = time.perf_counter()
        reply, num_examples, metrics = c.finish_round(job, result)
        metrics.update(round_timings(prepared - started, trained - prepared))
        if store.count(c.partition_id):  # stateful methods only: 0 in a node's first round
            metrics["state_arrays_in"] = carried
        reply = faulted_reply(c.cfg, c.partition_id, server_round, reply, parameters, len(c.model.state_dict()))
        metrics.update(partition_metric(c.cfg, c.partition_id))
        store.close_round(server_round, [c.partition_id], keep_from(config, server_round))
        if in_ray_worker():  # which machine of the Ray cluster ran this fit
            metrics["ray_node"] = ray_node_id()
        metrics["fit_seconds"] = time.perf_counter() - started  # the client's own share of the round
        return reply, num_examples, metrics

    def mirror_name(self) -> str:
        """The folder of this client's state mirror under ``<run-dir>/client-state``: its
        partition's, or (a node with its own data, no partition id) its data-path's digest."""
        c = self.client
        if c.data_path:
            return "data-" + hashlib.sha1(c.data_path.encode()).hexdigest()[:12]
        return f"{PARTITION}{c.partition_id}"
