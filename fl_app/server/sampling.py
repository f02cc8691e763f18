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

from fl_app.server.cohort_routing import VirtualClientProxy
from protocol.keys import ConfigError

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
        return self.draw([self.clients[cid] for cid in cids], num_clients)

    def draw(self, pool: list[ClientProxy], num_clients: int) -> list[ClientProxy]:
        """``num_clients`` of ``pool`` (in partition order), drawn with the generator of (seed,
        draw index): the same partitions whether the pool holds nodes or virtual clients."""
        if num_clients > len(pool):
            log.info("sampling failed: %d clients wanted, %d available", num_clients, len(pool))
            return []
        if num_clients == len(pool):  # everyone (e.g. client-side evaluation): no draw used, so
            return list(pool)  # the fit sampling of later rounds is unchanged
        rng = np.random.default_rng([self.seed, self.draws])
        self.draws += 1
        chosen = sorted(rng.choice(len(pool), size=num_clients, replace=False))
        return [pool[i] for i in chosen]


class CohortClientManager(SeededClientManager):
    """The cohort path's client manager (``fl_app/server/cohort_routing.py``): Flower registers the M
    cohort nodes (real SuperNodes) in ``clients``; the method's strategy sees N
    ``VirtualClientProxy`` (``num_available``, ``all``, ``sample``), partition p hosted by the
    p mod M-th node in the order of the nodes' own partition ids (their node config; node id
    where a node does not say), fixed once for the run (``host``), so a client's state stays on
    one node. Sampling draws from the virtual clients in partition order with the same generator
    as ``SeededClientManager`` over N partition nodes, so a cohort run samples the same clients
    as a per-client run of the same seed.

    The nodes are counted once their number stops growing (``fl_app.server.startup.settled_count``)
    before the layout is fixed; a node that reports a ``data-path`` (its own data, no partition)
    cannot host virtual clients and is refused."""

    def __init__(self, seed: int, num_virtual: int, wait_seconds: float = 60.0):
        super().__init__(seed, wait_seconds)
        self.num_virtual = num_virtual
        self.num_partitions = num_virtual
        self.node_order: dict[str, int] = {}  # real node id -> its reported partition-id (its index)
        self.hosts: list[ClientProxy] = []
        self.virtual: list[ClientProxy] = []

    # ---------------------------------------------------------------- the real nodes
    def num_nodes(self) -> int:
        """Cohort nodes registered (Flower registers new ones when ``num_available`` is called)."""
        self.num_available()
        return len(self.clients)

    def wait_for_nodes(self, num_nodes: int, timeout: float | None = None) -> bool:
        """Wait until ``num_nodes`` cohort nodes are registered (``NotEnoughNodes`` past the
        timeout, default ``wait_seconds``)."""
        timeout = self.wait_seconds if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while (connected := self.num_nodes()) < num_nodes:
            if time.monotonic() >= deadline:
                message = (f"{connected} cohort node(s) connected after waiting {timeout:g} s (wait-for-nodes),"
                           f" {num_nodes} needed to host {self.num_virtual} virtual clients")
                log.error("fl-drift: %s", message)
                raise NotEnoughNodes(message)
            time.sleep(0.2)
        return True

    def host(self, num_nodes: int) -> None:
        """Fix the layout once: ask the ``num_nodes`` registered nodes for their partition id,
        order them by it, and host partition p on node p mod M."""
        if self.hosts:
            return
        self.wait_for_nodes(num_nodes)
        nodes = list(self.clients.values())
        with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
            for cid, pid, _ in pool.map(self._ask_partition, nodes):
                if isinstance(pid, str):
                    raise ConfigError(f"node {cid} brings its own data (data-path = {pid!r}): a cohort node hosts"
                                      " partitions of the run's dataset; use execution = 'per-client'")
                if pid is not None:
                    self.node_order[cid] = pid
        nodes.sort(key=lambda c: (c.cid not in self.node_order, self.node_order.get(c.cid, 0), c.cid))
        self.hosts = nodes
        self.virtual = [VirtualClientProxy(p, self.num_virtual, nodes[p % len(nodes)]) for p in range(self.num_virtual)]
        self.partition_of = {v.cid: v.partition for v in self.virtual}
        log.info("cohort: %d virtual clients on %d cohort node(s) (partition p on node p mod %d)",
                 self.num_virtual, len(nodes), len(nodes))

    # ---------------------------------------------------------------- what the strategy sees
    def num_available(self) -> int:
        return len(self.virtual)

    def all(self) -> dict[str, ClientProxy]:
        return {v.cid: v for v in self.virtual}

    def learn_partitions(self) -> None:
        """Nothing to ask: a virtual client's partition is its own (``host`` asked the nodes)."""

    def wait_for(self, num_clients: int, timeout: float | None = None) -> bool:
        """The virtual clients exist once the layout is fixed (at the start-up); fewer than
        ``num_clients`` of them is ``NotEnoughNodes``."""
        if not self.hosts:
            self.host(max(1, self.num_nodes()))
        if len(self.virtual) < num_clients:
            message = (f"min-available-clients = {num_clients} but the run has {len(self.virtual)} virtual clients"
                       " (num-virtual-clients)")
            log.error("fl-drift: %s", message)
            raise NotEnoughNodes(message)
        return True

    def sample(self, num_clients: int, min_num_clients: int | None = None,
               criterion: Criterion | None = None) -> list[ClientProxy]:
        self.wait_for(num_clients if min_num_clients is None else min_num_clients)
        pool = [v for v in self.virtual if criterion is None or criterion.select(v)]
        return self.draw(pool, num_clients)
