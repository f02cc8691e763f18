"""The cohort path on the server: the routing between the method's N virtual clients and the M
cohort nodes that host them (which path a run takes is decided in
``fl_app.common.execution_path``).

The routing keeps the method's ``Strategy`` unchanged: it samples from N clients and aggregates K
``FitRes``. fl-drift's client manager (``fl_app.server.sampling.CohortClientManager``) presents N
``VirtualClientProxy`` (partition p hosted by node p mod M, fixed for the run, so a client's state
stays on one node), and ``fit_cohort`` sends a round's instructions as one bundle per node
(``protocol.cohort``) and splits the replies back into one ``FitRes`` per virtual client.
``fit_cohort_summed`` asks each node for one summed reply instead (``protocol.cohort.sum_replies``),
for a method whose server declares ``REPLY_SUMS``: one ``NodeSum`` per node.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence

from flwr.common import (
    Code,
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    ReconnectIns,
    Status,
)
from flwr.server.client_proxy import ClientProxy

from protocol.cohort import (
    NUM_PARTITIONS,
    PARTITIONS,
    SUM,
    NodeSum,
    SumSpec,
    bundle_instructions,
    split_replies,
    split_summed_reply,
)


class VirtualClientProxy(ClientProxy):
    """Virtual client ``partition`` of ``num_partitions``, hosted by the cohort node ``host`` (a
    real node's proxy). Its fit and evaluate travel as a one-client bundle through ``host``; its
    properties are answered here (the partition is known without asking the node)."""

    def __init__(self, partition: int, num_partitions: int, host: ClientProxy):
        super().__init__(f"partition-{partition}")
        self.partition = partition
        self.num_partitions = num_partitions
        self.host = host
        self.node_id = getattr(host, "node_id", 0)

    def instruction(self, ins: FitIns) -> FitIns:
        """``ins`` as this virtual client receives it: with ``num-partitions`` = N."""
        return FitIns(ins.parameters, {**ins.config, NUM_PARTITIONS: self.num_partitions})

    def get_properties(self, ins: GetPropertiesIns, timeout, group_id) -> GetPropertiesRes:
        return GetPropertiesRes(status=Status(Code.OK, "Success"),
                                properties={"partition-id": self.partition, NUM_PARTITIONS: self.num_partitions})

    def get_parameters(self, ins: GetParametersIns, timeout, group_id) -> GetParametersRes:
        return self.host.get_parameters(ins, timeout, group_id)

    def fit(self, ins: FitIns, timeout, group_id) -> FitRes:
        """One client's round as a bundle of one; a failed client raises, naming its reason."""
        results, failures = fit_cohort([(self, ins)], max_workers=1, timeout=timeout, group_id=group_id)
        if failures:
            raise failures[0]
        return results[0][1]

    def evaluate(self, ins: EvaluateIns, timeout, group_id) -> EvaluateRes:
        config = {**ins.config, PARTITIONS: str(self.partition), NUM_PARTITIONS: self.num_partitions}
        return self.host.evaluate(EvaluateIns(ins.parameters, config), timeout, group_id)

    def reconnect(self, ins: ReconnectIns, timeout, group_id) -> DisconnectRes:
        return DisconnectRes(reason="")


class CohortFailure(RuntimeError):
    """A virtual client's fit failed on its cohort node (the node failed, or the client did)."""


def per_node(instructions: Sequence[tuple[VirtualClientProxy, FitIns]], extra_config: dict, split,
             max_workers: int | None, timeout: float | None, group_id: int):
    """The instructions grouped by host node, one bundle (with ``extra_config``) and one ``fit``
    per node (a thread each); yields, per node as it completes, (its instructions, ``split`` of
    its reply, None) or (its instructions, None, the exception its message raised)."""
    by_host: dict[str, list[tuple[VirtualClientProxy, FitIns]]] = {}
    for proxy, ins in instructions:
        by_host.setdefault(proxy.host.cid, []).append((proxy, ins))

    def send(items: list[tuple[VirtualClientProxy, FitIns]]):
        bundle = bundle_instructions([(proxy.partition, proxy.instruction(ins)) for proxy, ins in items])
        bundle.config.update(extra_config)
        return split(items[0][0].host.fit(bundle, timeout=timeout, group_id=group_id))

    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as pool:
        futures = {pool.submit(send, items): items for items in by_host.values()}
        for future in concurrent.futures.as_completed(futures):
            try:
                yield futures[future], future.result(), None
            except Exception as exc:  # the node (or its message) failed
                yield futures[future], None, exc


def node_failed(items: list, exc: BaseException) -> list[CohortFailure]:
    """A failed node's message: a failure for each of its clients."""
    host = items[0][0].host.cid
    return [CohortFailure(f"cohort node {host} failed for {proxy.cid}: {exc!r}") for proxy, _ in items]


def fit_cohort(instructions: Sequence[tuple[VirtualClientProxy, FitIns]], max_workers: int | None,
               timeout: float | None, group_id: int) -> tuple[list, list]:
    """``flwr.server.server.fit_clients`` for virtual clients: the instructions grouped by host
    node, one bundle and one ``fit`` per node (a thread each, ``per_node``), the replies split
    back into (virtual proxy, ``FitRes``) results and failures. A node that fails (raises, times
    out, a status not OK) is a failure for each of its clients; a client the node names as
    failed, or does not name, is one failure."""
    results: list[tuple[ClientProxy, FitRes]] = []
    failures: list[BaseException] = []
    for items, replies, exc in per_node(instructions, {}, split_replies, max_workers, timeout, group_id):
        if exc is not None:
            failures += node_failed(items, exc)
            continue
        host, replies = items[0][0].host.cid, dict(replies)
        for proxy, _ in items:
            reply = replies.get(proxy.partition, "the cohort node's reply does not name it")
            if isinstance(reply, str):
                failures.append(CohortFailure(f"{proxy.cid} failed on cohort node {host}: {reply}"))
            elif reply.status.code != Code.OK:
                failures.append((proxy, reply))
            else:
                results.append((proxy, reply))
    return results, failures


def fit_cohort_summed(instructions: Sequence[tuple[VirtualClientProxy, FitIns]], spec: SumSpec,
                      max_workers: int | None, timeout: float | None, group_id: int) -> tuple[list, list]:
    """``fit_cohort`` with summed replies: each node's bundle carries ``spec`` (``protocol.cohort.SUM``)
    and its reply comes back as one ``NodeSum`` (its clients' n_k-weighted mean and sums, the
    clients' own records). Results: (the node's proxy, its ``NodeSum``) in the order of each
    node's first partition (so float sums over nodes run in one order whatever order they reply
    in); failures: a ``CohortFailure`` per client of a failed node, and per client a node names
    as failed or does not name."""
    results: list[tuple[ClientProxy, NodeSum, int]] = []
    failures: list[BaseException] = []
    for items, node, exc in per_node(instructions, {SUM: spec.encode()}, split_summed_reply, max_workers, timeout,
                                     group_id):
        if exc is not None:
            failures += node_failed(items, exc)
            continue
        host = items[0][0].host
        named = {c.partition for c in node.clients} | {p for p, _ in node.rejected} | {p for p, _ in node.failed}
        failures += [CohortFailure(f"partition-{p} failed on cohort node {host.cid}: {why}")
                     for p, why in node.failed]
        failures += [CohortFailure(f"{proxy.cid} failed on cohort node {host.cid}: the cohort node's reply does "
                                   "not name it") for proxy, _ in items if proxy.partition not in named]
        results.append((host, node, min(proxy.partition for proxy, _ in items)))
    return [(host, node) for host, node, _ in sorted(results, key=lambda r: r[2])], failures
