"""Can a run config run as a cohort? The checks of the run-config keys ``execution`` and
``num-virtual-clients`` against the method, applied to every run config once
(``fl_app.registry.method_config``, for the ServerApp, the ClientApp and the runner alike).

The paths (``execution``):

- ``per-client``: every node is one client (Flower's simulation with N SuperNodes, deployment).
- ``cohort``: M nodes (real SuperNodes) host N virtual clients (``num-virtual-clients`` = N, set by
  the launcher); each node trains the round's clients it hosts in one ``torch.func.vmap``
  (``fl_app.node.cohort_client``).
- ``auto``: ``cohort`` where it can run, else ``per-client`` (decided in
  ``fl_app.common.execution_path``).

A method and settings can run as a cohort (every method has a functional local update) when it
wraps its messages in no client mods (``cohort_problem``); an injected fault or attack acts on a
virtual client as on its own node (``fl_app.node.attacks``). ``execution = "cohort"`` (or a
cohort launch) for a method or setting that cannot is refused here, before any training, never
run another way (``check_execution``).

What a cohort node replies (``cohort-replies``, ``summed_replies``): ``full``, every client's
arrays; ``sum``, one n_k-weighted mean and sums for all its clients (``protocol.cohort``),
for a method whose server declares ``REPLY_SUMS`` and a run without update screening (which
acts on each reply) or an omniscient attack (``alie``, ``ipm``, ``mimic``: the server replaces
single replies); ``auto``, ``sum`` where it can and the method's update is batched, else
``full``. ``sum`` where it cannot is refused in one line (``sum_problem``).
"""

from __future__ import annotations

from fl_app.common.faults import server_attacks
from fl_app.common.method import Method
from protocol.keys import ConfigError

PER_CLIENT, COHORT, AUTO = "per-client", "cohort", "auto"
CHOICES = (AUTO, PER_CLIENT, COHORT)


def cohort_problem(cfg: dict, method: Method) -> str:
    """Why ``cfg`` cannot run as a cohort ('' when it can): the method wraps its messages in
    client mods (a DP clipping mod acts on one client's message). Every method's client side is
    a ``LocalUpdate``, which a cohort node runs vmapped; a client's injected fault or attack is a
    filter on its reply, the same on both paths."""
    name = cfg["strategy"]
    mods = method.update.client_mods(cfg)
    if mods:
        return (f"method {name!r} wraps every message in client mods ({', '.join(m.__name__ for m in mods)}),"
                " which act on one client's message, not on a cohort's")
    return ""


def sum_problem(cfg: dict, strategy: type) -> str:
    """Why a cohort node of ``cfg`` cannot reply one sum for its clients to a server of the
    strategy class ``strategy`` ('' when it can)."""
    if getattr(strategy, "REPLY_SUMS", None) is None:
        return (f"the server of method {cfg['strategy']!r} ({strategy.__name__}) needs every client's reply"
                " (it declares no REPLY_SUMS)")
    if cfg["screening"] != "none":
        return f"screening = {cfg['screening']!r} acts on each client's reply"
    attacks = server_attacks(cfg["inject-faults"])
    if attacks:
        kinds = ", ".join(sorted({a.kind for a in attacks.values()}))
        return f"inject-faults' omniscient attacks ({kinds}) replace single clients' replies at the server"
    return ""


def summed_replies(cfg: dict, strategy: type, unbatched: bool = False) -> bool:
    """Whether the cohort nodes of ``cfg`` reply one sum each to a server of the strategy class
    ``strategy`` (``cohort-replies``, module docstring). ``auto`` replies in full for an
    ``unbatched`` update (FedDecorr's): its clients train exactly as on the per-client path, and
    full replies keep the server's mean exactly the per-client path's too, where a node's sum
    (float64, then float32) rounds the aggregate differently, which such a method's next round
    amplifies (0.8365 against 0.8323 test accuracy after 2 rounds, measured)."""
    if cfg["cohort-replies"] == AUTO:
        return not unbatched and not sum_problem(cfg, strategy)
    return cfg["cohort-replies"] == "sum"


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
    if cfg["cohort-replies"] == "sum":
        problem = sum_problem(cfg, method.strategy) or (
            "execution = 'per-client' has no cohort node" if execution == PER_CLIENT else "")
        if problem:
            raise ConfigError(f"run-config key 'cohort-replies' = 'sum' is invalid: {problem};"
                              " valid choices: auto, full")
    if virtual and cfg["min-available-clients"] > virtual:
        raise ConfigError(f"run-config key 'min-available-clients' = {cfg['min-available-clients']} is invalid:"
                          f" must be <= num-virtual-clients ({virtual}), the clients of a cohort run")
