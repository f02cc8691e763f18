"""Reproducible client sampling: same seed and config -> same partitions sampled each round.

Flower's SimpleClientManager samples with the global ``random`` module over node ids, and
node ids are random per run, so neither the draw nor the node->partition mapping repeats.
This manager asks each node once for its ``partition-id`` (a cheap ``get_properties`` that
loads no data), orders nodes by it, and draws with a generator seeded by (seed, draw index).
A deployed node with its own ``data-path`` reports that path instead; such nodes are ordered
after the partition nodes, by path (node ids alone would change from run to run).

``min-available-clients`` is waited for until the federation first reaches it, at most
``wait-for-nodes`` seconds: then ``NotEnoughNodes`` names both numbers instead of a silent
hang (a federation smaller than min-available-clients never reaches it). After that a
node that dies is dropped by Flower once it misses its heartbeats (about 30-60 s), and a later
round samples among the nodes still connected instead of waiting (up to a day, Flower's
default) for the lost one to come back.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from flwr.common import GetPropertiesIns
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.criterion import Criterion

log = logging.getLogger("flwr.fl_drift")


class NotEnoughNodes(RuntimeError):
    """Fewer nodes connected than min-available-clients within wait-for-nodes seconds."""


class SeededClientManager(SimpleClientManager):
    def __init__(self, seed: int, wait_seconds: float = 60.0):
        super().__init__()
        self.seed = seed
        self.wait_seconds = wait_seconds
        self.draws = 0
        self.partition_of: dict[str, int] = {}
        self.data_path_of: dict[str, str] = {}
        self.num_partitions: int | None = None
        self.assembled = False  # min-available-clients were connected once in this process

    def wait_for(self, num_clients: int, timeout: float | None = None) -> bool:
        """Wait until ``num_clients`` nodes are registered, asking Flower for them every 0.2 s;
        past ``timeout`` (default ``wait_seconds``) raise ``NotEnoughNodes``, naming both numbers.

        Flower's legacy ServerApp registers the grid's nodes with the client manager only when
        ``num_available``, ``all`` or ``sample`` is called, or every 5 s from a background
        thread; the base ``wait_for`` calls none of them, so before round 1 it waited for that
        5 s tick (nodes of a simulation are known at once)."""
        timeout = self.wait_seconds if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while (connected := self.num_available()) < num_clients:  # Flower registers new nodes first
            if time.monotonic() >= deadline:
                message = (
                    f"min-available-clients = {num_clients} but only {connected} node(s) connected after"
                    f" waiting {timeout:g} s (wait-for-nodes): start more SuperNodes"
                    f" (simulation: --federation-config num-supernodes={num_clients}, or"
                    f" run_simulation.py --clients {num_clients}) or lower min-available-clients"
                )
                log.error("fl-drift: %s", message)
                raise NotEnoughNodes(message)
            time.sleep(0.2)
        return True

    def _ask_partition(self, client: ClientProxy) -> tuple[str, int | str | None, int | None]:
        """(node id, partition id or data-path, num-partitions); None when the node did not say."""
        try:
            res = client.get_properties(GetPropertiesIns(config={}), timeout=60, group_id=0)
            props = res.properties
            if props.get("data-path"):
                return client.cid, str(props["data-path"]), None
            return client.cid, int(props["partition-id"]), int(props["num-partitions"])
        except Exception as exc:  # an unreachable node is ordered last, by node id
            log.warning("node %s did not report its partition-id or data-path: %s", client.cid, exc)
            return client.cid, None, None

    def learn_partitions(self) -> None:
        """Ask every node not yet known for its partition id (in parallel)."""
        known = self.partition_of.keys() | self.data_path_of.keys()
        unknown = [c for cid, c in self.clients.items() if cid not in known]
        if not unknown:
            return
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(32, len(unknown))) as pool:
            for cid, pid, n in pool.map(self._ask_partition, unknown):
                if isinstance(pid, str):
                    self.data_path_of[cid] = pid
                elif pid is not None:
                    self.partition_of[cid] = pid
                    self.num_partitions = n
        log.info("asked %d nodes for their partition in %.1fs", len(unknown), time.perf_counter() - started)

    def ordered(self, cids: list[str]) -> list[str]:
        def key(cid: str) -> tuple:
            if cid in self.partition_of:
                return (0, self.partition_of[cid], "", cid)
            if cid in self.data_path_of:
                return (1, 0, self.data_path_of[cid], cid)
            return (2, 0, "", cid)

        return sorted(cids, key=key)

    def sample(
        self, num_clients: int, min_num_clients: int | None = None, criterion: Criterion | None = None
    ) -> list[ClientProxy]:
        if min_num_clients is None:
            min_num_clients = num_clients
        if self.assembled and len(self.clients) < min_num_clients:
            log.warning(
                "%d nodes connected, fewer than min-available-clients=%d (nodes left during the "
                "run); sampling among those connected", len(self.clients), min_num_clients,
            )
        else:
            self.assembled = self.wait_for(min_num_clients)
        self.learn_partitions()
        cids = [
            cid for cid in self.ordered(list(self.clients))
            if criterion is None or criterion.select(self.clients[cid])
        ]
        if num_clients > len(cids):
            log.info("sampling failed: %d clients wanted, %d available", num_clients, len(cids))
            return []
        if num_clients == len(cids):  # everyone (e.g. client-side evaluation): no draw used, so
            return [self.clients[c] for c in cids]  # the fit sampling of later rounds is unchanged
        rng = np.random.default_rng([self.seed, self.draws])
        self.draws += 1
        chosen = sorted(rng.choice(len(cids), size=num_clients, replace=False))
        return [self.clients[cids[i]] for i in chosen]
