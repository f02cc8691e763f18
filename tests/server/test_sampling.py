"""SeededClientManager: the same seed samples the same partitions, whatever the node ids."""

import pytest

from fl_app.server.sampling import NotEnoughNodes, SeededClientManager
from tests.kit import Proxy


def sampled_partitions(seed, node_ids, rounds=3):
    manager = SeededClientManager(seed)
    for pid, cid in enumerate(node_ids):
        manager.register(Proxy(cid, partition=pid))
    return [sorted(c.partition for c in manager.sample(3)) for _ in range(rounds)]


def test_same_seed_same_partitions_despite_random_node_ids():
    ids_a = [str(1000 + 7 * i) for i in range(10)]
    ids_b = [str(99999 - 13 * i) for i in range(10)]  # different ids, different sort order
    assert sampled_partitions(0, ids_a) == sampled_partitions(0, ids_b)
    draws = sampled_partitions(0, ids_a)
    assert len({tuple(d) for d in draws}) > 1  # rounds differ
    assert sampled_partitions(1, ids_a) != draws  # seeds differ


def test_waits_for_min_available_only_until_reached():
    """Before the federation first reaches min-available-clients, sample() waits for it; after
    that a node that left (Flower unregisters dead nodes) must not stall later rounds."""
    manager = SeededClientManager(0)
    waited = []
    manager.wait_for = lambda n, timeout=86400: waited.append(n) or len(manager.clients) >= n
    proxies = [Proxy(str(100 + i), partition=i) for i in range(3)]
    for proxy in proxies[:2]:
        manager.register(proxy)
    manager.sample(2, 3)  # only 2 of 3 nodes so far: waits (here: returns at once, not reached)
    assert waited == [3]
    manager.register(proxies[2])
    assert len(manager.sample(3, 3)) == 3 and waited == [3, 3]
    manager.unregister(proxies[2])  # the node died
    chosen = manager.sample(2, 3)
    assert waited == [3, 3]  # no wait for the lost node
    assert sorted(c.partition for c in chosen) == [0, 1]


def test_wait_for_asks_flower_to_register_nodes():
    """Flower registers the grid's nodes with the manager only inside num_available / all /
    sample (it wraps them) or every 5 s; wait_for must call num_available itself, not sleep
    until that tick."""
    manager = SeededClientManager(0)
    grid_nodes = [Proxy(str(100 + i), partition=i) for i in range(3)]
    plain_num_available = manager.num_available

    def flowers_wrapper():  # what Flower's start_update_client_manager_thread installs
        for proxy in grid_nodes:
            if proxy.cid not in manager.clients:
                manager.register(proxy)
        return plain_num_available()

    manager.num_available = flowers_wrapper
    assert manager.wait_for(3, timeout=5) is True
    assert len(manager.clients) == 3
    with pytest.raises(NotEnoughNodes, match="min-available-clients = 4 but only 3 node"):
        manager.wait_for(4, timeout=0.3)  # a fourth node never comes
