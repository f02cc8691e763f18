"""The server's start-up between ``flwr run`` and round 1, as explicit steps that overlap with
the nodes' own start-up (``fl_app/node/background.py``):

1. ``begin()`` (in ``server_fn``): start decoding the test split in the background. A real
   dataset's test split does not depend on the partitioning, so it is decoded while Ray and the
   nodes start, instead of after they report.
2. ``test_split()`` (at round 0's evaluation, Flower's first call once it registers the nodes):
   ask the nodes for their partition ids in the background and return the decoded test split.
   The nodes are asked as soon as Flower knows them, since their first message starts their
   warm-up (``fl_app.node.node_client.start_warm_up``); asking from ``server_fn`` would come before Flower
   registers any node.
3. ``ready()`` (after round 0 is evaluated): wait for the nodes' answers and check the
   partitioning they reported (``check_data``), before round 1.

The synthetic dataset's test split pools every device's share, so there step 2 waits for the
nodes and checks the partitioning first.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch

from fl_app.node.background import in_background
from fl_app.server.sampling import SeededClientManager
from tasks.datasets import resolve_data_dir
from tasks.partitioning import PartitionSpec, check_data, check_partition_count, load_test, load_test_split


class ServerStartup:
    def __init__(self, cfg: dict, client_manager: SeededClientManager):
        self.cfg = cfg
        self.client_manager = client_manager
        self.prefetched: Future | None = None
        self.learning: Future | None = None

    def begin(self) -> None:
        """Start decoding a real dataset's test split in the background."""
        cfg = self.cfg
        if cfg["dataset"] != "synthetic":
            self.prefetched = in_background(
                load_test_split, cfg["dataset"], resolve_data_dir(cfg["data-dir"]), cfg["seed"])

    def test_split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Ask the nodes for their partitions (in the background); the decoded test split."""
        self.learning = in_background(self._learn)
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
        """Wait for the nodes; refuse a federation larger than the data can be cut into (a
        ``flwr run`` with num-supernodes = 100000, say) before asking every node; then ask."""
        self.client_manager.wait_for(self.cfg["min-available-clients"])
        check_partition_count(PartitionSpec.from_config(self.cfg, self.client_manager.num_available()))
        self.client_manager.learn_partitions()

    def _check(self) -> PartitionSpec:
        """Check the partitioning the nodes reported (before round 1)."""
        cm = self.client_manager
        spec = PartitionSpec.from_config(self.cfg, cm.num_partitions or cm.num_available())
        check_data(spec)
        return spec
