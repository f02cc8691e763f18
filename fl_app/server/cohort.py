"""The cohort path on the server: which path a run takes, and the routing between the method's
N virtual clients and the M cohort nodes that host them.

Which path (``execution``, decided here and nowhere else):

- ``per-client``: every node is one client (Flower's simulation with N SuperNodes, deployment).
- ``cohort``: M nodes (real SuperNodes) host N virtual clients (``num-virtual-clients`` = N, set by
  the launcher); each node trains the round's clients it hosts in one ``torch.func.vmap``
  (``fl_app.node.cohort_client``).
- ``auto``: ``cohort`` where it can run: the method has its own functional local update and the
  settings allow it (``cohort_problem``), CUDA is available (vmap gains on a GPU only: on a CPU
  it is 0.45-0.83x the per-client loop, docs/performance.md), and the simulation is launched by
  fl-drift's runner (``run_simulation.py``, which then sets ``num-virtual-clients``); else
  ``per-client``. The runner resolves ``auto`` (``launch_execution``: it knows CUDA and launches
  the nodes); the server only follows what it was launched for (``server_execution``: a run with
  ``num-virtual-clients`` > 0 is a cohort run) and records the path and its reason in
  summary.json. ``execution = "cohort"`` for a method or setting that cannot run as a cohort is
  refused at validation (``check_execution``), never run another way.

The routing keeps the method's ``Strategy`` unchanged: it samples from N clients and aggregates K
``FitRes``. fl-drift's client manager (``fl_app.server.sampling.CohortClientManager``) presents N
``VirtualClientProxy`` (partition p hosted by node p mod M, fixed for the run, so a client's state
stays on one node), and ``fit_cohort`` sends a round's instructions as one bundle per node
(``fl_app.node.cohort_wire``) and splits the replies back into one ``FitRes`` per virtual client.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Sequence
from dataclasses import dataclass

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

from fl_app.common.faults import parse_faults
from fl_app.common.method import Method
from fl_app.node.cohort_wire import NUM_PARTITIONS, PARTITIONS, bundle_instructions, split_replies
from protocol.keys import ConfigError

log = logging.getLogger("flwr.fl_drift")

PER_CLIENT, COHORT, AUTO = "per-client", "cohort", "auto"
CHOICES = (AUTO, PER_CLIENT, COHORT)


@dataclass(frozen=True)
class Execution:
    """The path a run takes (``cohort`` or ``per-client``), why, and (for the launcher) the nodes
    it starts: M cohort nodes or N per-client nodes."""

    path: str
    reason: str
    nodes: int = 0

    @property
    def cohort(self) -> bool:
        return self.path == COHORT

    def record(self) -> dict:
        """What summary.json records."""
        return {"path": self.path, "reason": self.reason}


# ------------------------------------------------------------------------------ which path
def cohort_update(method: Method, cfg: dict):
    """The functional local update the method's client trains through with ``cfg``
    (``DriftClient.local_update_for``, which refuses a client that names none): the update a
    cohort node runs vmapped, as the per-client path runs it for one client."""
    return method.client.local_update_for(cfg)


def cohort_problem(cfg: dict, method: Method) -> str:
    """Why ``cfg`` cannot run as a cohort ('' when it can): the method wraps its messages in
    client mods (a DP clipping mod acts on one client's message), or ``inject-faults`` asks a
    node to fault or attack (per partition, on the node's own message). Every method has a
    functional local update (``cohort_update``)."""
    name = cfg["strategy"]
    mods = method.client.mods(cfg)
    if mods:
        return (f"method {name!r} wraps every message in client mods ({', '.join(m.__name__ for m in mods)}),"
                " which act on one client's message, not on a cohort's")
    node_faults = sorted(str(k) for k in parse_faults(cfg["inject-faults"]) if isinstance(k, int))
    if node_faults:
        return (f"inject-faults = {cfg['inject-faults']!r} makes partition(s) {', '.join(node_faults)} fault or"
                " attack on their own node, which a cohort node does not do")
    return ""


def check_execution(cfg: dict, method: Method) -> None:
    """Refuse, before any training, ``execution = "cohort"`` (or a cohort launch,
    ``num-virtual-clients`` > 0) that cannot run as a cohort, and ``num-virtual-clients`` with
    ``execution = "per-client"``: one line naming the value, the reason and the valid choices."""
    execution, virtual = cfg["execution"], cfg["num-virtual-clients"]
    if execution == PER_CLIENT and virtual:
        raise ConfigError(f"run-config key 'num-virtual-clients' = {virtual} is invalid with execution = 'per-client'"
                          " (each node is one client there); use execution = 'cohort' or 'auto', or 0")
    if execution == COHORT or virtual:
        problem = cohort_problem(cfg, method)
        if problem:
            raise ConfigError(f"run-config key 'execution' = {execution!r} cannot run as a cohort: {problem};"
                              f" valid choices: {', '.join(c for c in CHOICES if c != COHORT)}")
    if virtual and cfg["min-available-clients"] > virtual:
        raise ConfigError(f"run-config key 'min-available-clients' = {cfg['min-available-clients']} is invalid:"
                          f" must be <= num-virtual-clients ({virtual}), the clients of a cohort run")


def auto_reason(cfg: dict, method: Method, *, cuda: bool, launcher: bool, cluster: bool = False) -> str:
    """Why ``auto`` would run ``cfg`` per-client ('' when it would run it as a cohort), the first
    of: the method or settings (``cohort_problem``), a Ray cluster, no CUDA, not launched by
    fl-drift's runner."""
    problem = cohort_problem(cfg, method)
    if problem:
        return problem
    if cluster:
        return "the simulation runs on a Ray cluster (--ray-address), whose GPUs the runner does not place"
    if not cuda:
        return ("no CUDA GPU: the cohort's vmap gains on a GPU only (on a CPU it is 0.45-0.83x the per-client loop,"
                " docs/performance.md)")
    if not launcher:
        return "not launched by run_simulation.py (num-virtual-clients = 0: each node is one client)"
    return ""


AUTO_COHORT = "a simulation launched by run_simulation.py on CUDA, and the method has its own functional local update"


def cohort_node_count(gpus: float, clients: int) -> int:
    """M, the cohort nodes of a simulation: one per whole GPU (never more than the clients), 1
    on a CPU (one process trains the cohort; more would only split the cores)."""
    return max(1, min(int(gpus), clients))


def launch_execution(cfg: dict, method: Method, clients: int, *, cuda: bool, gpus: int = 0,
                     cluster: bool = False) -> Execution:
    """The runner's decision for a simulation of ``clients`` partitions (``cfg`` validated): the
    path, why, and the nodes to launch: one cohort node per GPU (1 on CPU), or one per client."""
    execution = cfg["execution"]
    if execution == PER_CLIENT:
        return Execution(PER_CLIENT, "execution = 'per-client'", clients)
    nodes = cohort_node_count(gpus if cuda else 0, clients)
    if execution == COHORT:
        return Execution(COHORT, "execution = 'cohort'", nodes)
    why = auto_reason(cfg, method, cuda=cuda, launcher=True, cluster=cluster)
    if why:
        return Execution(PER_CLIENT, f"auto: per-client, {why}", clients)
    return Execution(COHORT, f"auto: cohort, {AUTO_COHORT}", nodes)


def server_execution(cfg: dict, method: Method, cuda: bool) -> Execution:
    """The path the server runs, from what the run was launched for: ``num-virtual-clients`` > 0
    is a cohort run (its nodes were started as cohort nodes); ``execution = "cohort"`` without it
    is refused (nothing launched cohort nodes). Checked by ``check_execution`` first."""
    check_execution(cfg, method)
    execution, virtual = cfg["execution"], cfg["num-virtual-clients"]
    if virtual:
        reason = "execution = 'cohort'" if execution == COHORT else f"auto: cohort, {AUTO_COHORT}"
        return Execution(COHORT, f"{reason} ({virtual} virtual clients)")
    if execution == COHORT:
        raise ConfigError("run-config key 'execution' = 'cohort' needs num-virtual-clients = N, the clients the cohort"
                          " nodes host (run_simulation.py sets it; with flwr run: --run-config"
                          " \"num-virtual-clients=N\" and --federation-config num-supernodes=M); valid choices"
                          " without it: auto, per-client")
    if execution == PER_CLIENT:
        return Execution(PER_CLIENT, "execution = 'per-client'")
    return Execution(PER_CLIENT, f"auto: per-client, {auto_reason(cfg, method, cuda=cuda, launcher=False)}")


# ------------------------------------------------------------------------------ routing
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


def fit_cohort(instructions: Sequence[tuple[VirtualClientProxy, FitIns]], max_workers: int | None,
               timeout: float | None, group_id: int) -> tuple[list, list]:
    """``flwr.server.server.fit_clients`` for virtual clients: the instructions grouped by host
    node, one bundle and one ``fit`` per node (a thread each), the replies split back into
    (virtual proxy, ``FitRes``) results and failures. A node that fails (raises, times out, a
    status not OK) is a failure for each of its clients; a client the node names as failed, or
    does not name, is one failure."""
    by_host: dict[str, list[tuple[VirtualClientProxy, FitIns]]] = {}
    for proxy, ins in instructions:
        by_host.setdefault(proxy.host.cid, []).append((proxy, ins))

    def send(items: list[tuple[VirtualClientProxy, FitIns]]) -> list:
        host = items[0][0].host
        bundle = bundle_instructions([(proxy.partition, proxy.instruction(ins)) for proxy, ins in items])
        return split_replies(host.fit(bundle, timeout=timeout, group_id=group_id))

    results: list[tuple[ClientProxy, FitRes]] = []
    failures: list[BaseException] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as pool:
        futures = {pool.submit(send, items): items for items in by_host.values()}
        for future in concurrent.futures.as_completed(futures):
            items = futures[future]
            host = items[0][0].host.cid
            try:
                replies = dict(future.result())
            except Exception as exc:  # the node (or its message) failed: each of its clients did
                failures += [CohortFailure(f"cohort node {host} failed for {p.cid}: {exc!r}") for p, _ in items]
                continue
            for proxy, _ in items:
                reply = replies.get(proxy.partition, "the cohort node's reply does not name it")
                if isinstance(reply, str):
                    failures.append(CohortFailure(f"{proxy.cid} failed on cohort node {host}: {reply}"))
                elif reply.status.code != Code.OK:
                    failures.append((proxy, reply))
                else:
                    results.append((proxy, reply))
    return results, failures
