"""The server's start-up between ``flwr run`` and round 1, as explicit steps that overlap with
the nodes' own start-up (``fl_app/common/background.py``):

1. ``begin()`` (in ``server_fn``): start decoding the test split in the background. A real
   dataset's test split does not depend on the partitioning, so it is decoded while Ray and the
   nodes start, instead of after they report.
2. ``test_split()`` (in ``DriftServer.start_up``, the first thing its ``fit`` does, once Flower
   has registered the nodes):
   ask the nodes for their partition ids in the background and return the decoded test split.
   The nodes are asked as soon as Flower knows them, since their first message starts their
   warm-up (``fl_app.node.node_client.start_warm_up``); asking from ``server_fn`` would come before Flower
   registers any node.
3. ``ready()`` (after round 0 is evaluated, still in the start-up): wait for the nodes' answers
   and check the partitioning they reported (``check_data``), before round 1.

Before step 2 returns, the federation's size is checked: the node count, once it stops
growing, against what the data can be cut into (``check_partition_count``) and what the
screening rule needs (``check_replies``). Flower's simulation registers its nodes one by one
while the ServerApp starts, so an early count is only part of the federation (a run with
num-supernodes = 200000 was once refused naming "64855 partitions"); the count is taken once
two reads ``SETTLE_SECONDS`` apart agree. A refusal inside a simulation then ends the
simulation process at once (``stop_this_simulation``) instead of letting Flower set up every
node and start Ray for a run that has already failed (176 s for 200000 nodes).

The synthetic dataset's test split pools every device's share, so there step 2 waits for the
nodes and checks the partitioning first.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import torch

from fl_app.common.background import in_background
from fl_app.server.preflight import check_fault_partitions, loud
from fl_app.server.sampling import CohortClientManager, SeededClientManager
from fl_app.server.screening import check_replies
from protocol.keys import ConfigError
from strategies.arrays import total_clients
from tasks.datasets import PartitionError
from tasks.partitioning import (
    PartitionSpec,
    check_data,
    check_partition_count,
    load_test,
    load_test_split,
    load_validation_split,
)
from tasks.train import min_batch_of

log = logging.getLogger("flwr.fl_drift")

SETTLE_SECONDS = 0.2  # Flower registers >= 4000 simulated nodes in this time, even on a busy 2-core machine


class ServerStartup:
    """``data_dir`` is the data folder in use, resolved by the ServerApp's call to the model and
    data side (``tasks.server_side``); '' = the Hugging Face hub."""

    def __init__(self, cfg: dict, client_manager: SeededClientManager, data_dir: str = ""):
        self.cfg = cfg
        self.data_dir = data_dir
        self.client_manager = client_manager
        self.prefetched: Future | None = None
        self.learning: Future | None = None
        self.checked: Future = Future()  # the federation's size passed (its node count), or why not

    def begin(self) -> None:
        """Start decoding a real dataset's test split in the background; with
        ``validation-fraction`` > 0 the validation split held out of the training data instead
        (a tuning run: its scores must never come from the test split)."""
        cfg = self.cfg
        if cfg["dataset"] != "synthetic" and cfg["validation-fraction"] > 0:
            self.prefetched = in_background(load_validation_split, cfg["dataset"], self.data_dir,
                                            cfg["seed"], cfg["validation-fraction"])
        elif cfg["dataset"] != "synthetic":
            self.prefetched = in_background(load_test_split, cfg["dataset"], self.data_dir, cfg["seed"])

    def test_split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Ask the nodes for their partitions (in the background); the decoded test split.
        A federation refused by its size raises here (logged as one ``fl-drift:`` line)."""
        self.learning = in_background(self._learn)
        try:
            with loud(PartitionError, ConfigError):
                self.checked.result()
        except (PartitionError, ConfigError):
            stop_this_simulation()
            raise
        if self.prefetched is None:  # the synthetic test split pools every device's share
            self.learning.result()
            return load_test(self._check())
        return self.prefetched.result()

    def ready(self) -> None:
        """The nodes reported their partitions and the partitioning passed ``check_data``."""
        if self.prefetched is not None:
            self.learning.result()
            self._check()

    def _learn(self) -> None:
        """Wait for the nodes until their count settles; refuse a federation larger than the
        data can be cut into (a ``flwr run`` with num-supernodes = 100000, say) or too small for
        the screening rule, before asking any node (``checked`` holds the outcome); then ask."""
        try:
            nodes = self._nodes()
            check_partition_count(PartitionSpec.from_config(self.cfg, nodes))
            check_replies(self.cfg, nodes)
        except BaseException as exc:
            self.checked.set_exception(exc)
            raise
        self.checked.set_result(nodes)
        self.client_manager.learn_partitions()

    def _nodes(self) -> int:
        """The clients of the federation once its nodes are counted: the nodes (per-client), or,
        on the cohort path, the virtual clients once the cohort nodes have settled and the
        layout is fixed (``CohortClientManager.host``)."""
        cm = self.client_manager
        if isinstance(cm, CohortClientManager):
            cm.host(settled_count(CohortNodes(cm), 1))
            cm.wait_for(self.cfg["min-available-clients"])
            return cm.num_available()
        return settled_count(cm, self.cfg["min-available-clients"])

    def _check(self) -> PartitionSpec:
        """Check the partitioning the nodes reported (before round 1), and that every partition
        ``inject-faults`` names is one of them."""
        cm = self.client_manager
        spec = PartitionSpec.from_config(self.cfg, total_clients(cm))
        check_fault_partitions(self.cfg, spec.num_partitions)
        check_data(spec, min_batch_of(self.cfg["model"], self.cfg["dataset"]), self.cfg["client-test-fraction"])
        return spec


class CohortNodes:
    """The cohort nodes of a ``CohortClientManager``, as ``settled_count`` counts them."""

    def __init__(self, client_manager: CohortClientManager):
        self.client_manager = client_manager

    def wait_for(self, num_nodes: int) -> bool:
        return self.client_manager.wait_for_nodes(num_nodes)

    def num_available(self) -> int:
        return self.client_manager.num_nodes()


def settled_count(client_manager, minimum: int) -> int:
    """The number of connected nodes once at least ``minimum`` are and two reads at least
    ``SETTLE_SECONDS`` apart agree (a simulation's nodes are all registered by then).

    A read costs time in proportion to the nodes (Flower's legacy client manager lists and
    registers them, holding the lock that node registration needs), so the pause between
    reads is at least 2 x the last read: reading then takes at most a third of the time
    (with a fixed 0.2 s pause, registering 200000 nodes took 25 s instead of 5 s alone on a
    busy 2-core machine: ``bench/trust.py settle``)."""
    client_manager.wait_for(minimum)
    started = time.monotonic()
    count = client_manager.num_available()
    cost = time.monotonic() - started
    while True:
        time.sleep(max(SETTLE_SECONDS, 2 * cost))
        started = time.monotonic()
        now = client_manager.num_available()
        cost = time.monotonic() - started
        if now == count:
            return count
        count = now


def stop_this_simulation() -> None:
    """In a ``flwr-simulation`` process (Flower's simulation runtime, which runs this ServerApp
    in a thread beside its engine), send SIGTERM to the engine's main thread: Flower's own
    handler then reports the run as failed, uploads the log (the refusal line included) and
    exits, as on ``Ctrl-C``. Flower offers a ServerApp no other way to stop the engine, which
    would otherwise finish setting up every node and start Ray before it noticed the failed
    ServerApp. Elsewhere (a deployment's ServerApp process, tests) nothing is done: there the
    raised error ends the run at once."""
    if Path(sys.argv[0]).name != "flwr-simulation":
        return
    log.info("fl-drift: stopping the simulation (flwr-simulation PID %d) before it starts its nodes", os.getpid())
    signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
