"""Which path a run takes (``cohort`` or ``per-client``), decided here and nowhere else: by the
runner when it launches a simulation (``launch_execution``), and followed by the server
(``server_execution``).

``auto`` takes the cohort path where it can run: the method and settings allow it
(``fl_app.common.execution_checks.cohort_problem``), CUDA is available (vmap gains on a GPU
only: on a CPU it is 0.45-0.83x the per-client loop, docs/performance.md, "What was tried and did
not work"), and the simulation is
launched by fl-drift's runner (``run_simulation.py``, which then sets ``num-virtual-clients``);
else ``per-client``. The runner resolves ``auto`` (it knows CUDA and launches the nodes); the
server only follows what it was launched for (a run with ``num-virtual-clients`` > 0 is a cohort
run) and records the path and its reason in summary.json.
"""

from __future__ import annotations

from dataclasses import dataclass

from fl_app.common.execution_checks import COHORT, PER_CLIENT, cohort_problem
from fl_app.common.method import Method
from protocol.keys import ConfigError


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
    is refused (nothing launched cohort nodes). ``cfg`` is resolved (``fl_app.registry.resolve``,
    whose ``check_execution`` refused a cohort the method cannot run): not checked again here."""
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

