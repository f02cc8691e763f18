"""The cohort path: which path a run takes and its refusals, the server's routing
between N virtual clients and M cohort nodes, and end-to-end equivalence with the per-client path.

Tolerance of the end-to-end comparisons: a cohort node trains its K clients in one
``torch.func.vmap``, whose batched convolutions and matmuls sum in another order than K separate
loops, so a cohort client's weights equal its per-client twin's within float32 rounding (1e-5
relative after a round, ``tasks/functional/rounds.py``); three rounds of aggregation carry that
into metrics.csv, compared here (``close``) at 1e-4 relative for every metric but accuracy
(losses, norms, cosines, diversities: relative at any magnitude, so a norm of 0.005 such as
FedDyn's ``feddyn_grad_norm`` is held to 5e-7, not to an absolute floor) and 1e-3 absolute for
accuracy (one test example of the synthetic test split is 1/N_test, far larger, so a flip would
show). Measured over all 22 methods' runs of ``test_cohort_run_equals_per_client_run_within_tolerance``
(slow ones included; again, the same, once every method's client side was one ``LocalUpdate``):
at most 2.2e-7 relative on any metric (FedAdagrad's train loss), accuracy identical. A cohort
that holds one client runs unbatched, the same kernels as the per-client path: exactly equal.

A BatchNorm model (FedBN's ``lenet-bn``) normalises every batch by its own statistics, which
amplifies those rounding differences, while its cohort of one is exactly equal (so the code paths
are the same and the difference is vmap's summation order). Measured on the MNIST sample over the
3 rounds of FedBN's run, relative: test loss 9.3e-3, train loss 1.4e-3, drift_norm_max 3.3e-3,
body_diversity 2.8e-3, step_norm 2.2e-3, drift_norm_mean 1.6e-3, update_diversity 1.5e-3,
update_cosine_mean 1.0e-3, head_diversity 4.3e-4; accuracy 5 of 1,000 test images (5e-3). No
metric of it meets 1e-4, so BN models are compared at 2e-2 relative (about twice the worst, the
test loss) and 1e-2 absolute accuracy (``BN_TOLERANCE``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    GetPropertiesRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_proxy import ClientProxy

from fl_app.common.execution_checks import COHORT, PER_CLIENT, check_execution, cohort_problem
from fl_app.common.execution_path import launch_execution, server_execution
from fl_app.config import ConfigError
from fl_app.node.drift_client import DriftClient
from fl_app.registry import METHODS, Method, get_method, method_config, validate_config
from fl_app.server.cohort_routing import CohortFailure, fit_cohort
from fl_app.server.sampling import CohortClientManager, SeededClientManager
from protocol.cohort import bundle_replies, split_instructions
from tasks.functional import Hyper, LocalUpdate
from tests.kit_runs import NEEDS as SIMULATION_NEEDS


def config(**keys) -> dict:
    return validate_config({"dataset": "synthetic", "model": "logreg", **keys})


# ------------------------------------------------------------------ which path, and refusals
def test_every_registered_method_trains_through_its_local_update():
    """Every method's client side is a ``LocalUpdate``, the one way a client trains (per client
    and as a cohort); FedPGVC's one update holds both readings (its direction and finish step
    read ``pgvc-variant``, which reaches it in ``Hyper.keys``)."""
    for name, method in METHODS.items():
        assert isinstance(method.update, LocalUpdate), name
    pgvc = get_method("fedpgvc").update
    assert "pgvc-variant" in pgvc.key_names() and pgvc.finish is not None
    authors = config(strategy="fedpgvc", **{"pgvc-variant": "authors"})
    assert Hyper.from_config(authors, 0.1, pgvc.key_names()).keys["pgvc-variant"] == "authors"


class HookClient(DriftClient):
    """An unmigrated method's client: a client class where its ``LocalUpdate`` belongs (no
    registered method's client side is one)."""


NO_UPDATE = Method(get_method("fedavg").strategy, HookClient)


@pytest.mark.parametrize("execution", ["per-client", "cohort", "auto"])
def test_a_method_without_a_local_update_is_refused_in_one_line(execution):
    """The registry's checks of a method (``resolve`` applies them before any training) refuse
    a method whose client side is not a ``LocalUpdate``, whatever the path, in one line naming
    what it got."""
    with pytest.raises(TypeError) as err:
        method_config(config(execution=execution), NO_UPDATE)
    text = str(err.value)
    assert "HookClient" in text and "must be a tasks.functional LocalUpdate" in text and "\n" not in text
    check_execution(config(execution="cohort"), get_method("fedavg"))  # the registered FedAvg runs as a cohort


def test_cohort_refused_for_client_mods_dp_fedavg():
    cfg = config(strategy="dp-fedavg", execution="cohort", **{"dp-mode": "client"})
    problem = cohort_problem(cfg, get_method("dp-fedavg"))
    assert "client mods" in problem and "fixedclipping_mod" in problem


@pytest.mark.parametrize("faults", ["raise:0", "nan:1", "scale:2:100", "flip:0@2"])
def test_client_faults_and_attacks_run_as_a_cohort(faults):
    """A client's fault or attack is a filter on its reply, run by a cohort node as by its own
    node (tests/node/test_cohort_rows.py), so a cohort run takes it."""
    cfg = config(execution="cohort", **{"inject-faults": faults, "num-virtual-clients": 4})
    check_execution(cfg, get_method("fedavg"))
    assert server_execution(cfg, get_method("fedavg"), cuda=False).path == COHORT


def test_server_crash_injection_runs_as_a_cohort():
    cfg = config(execution="cohort", **{"inject-faults": "crash-after:2", "num-virtual-clients": 4})
    assert server_execution(cfg, get_method("fedavg"), cuda=False).path == COHORT


def test_refusals_of_inconsistent_keys():
    fedavg = get_method("fedavg")
    with pytest.raises(ConfigError, match="'num-virtual-clients' = 4 is invalid with execution = 'per-client'"):
        check_execution(config(execution="per-client", **{"num-virtual-clients": 4}), fedavg)
    with pytest.raises(ConfigError, match="needs num-virtual-clients"):
        server_execution(config(execution="cohort"), fedavg, cuda=True)
    with pytest.raises(ConfigError, match="min-available-clients' = 5 is invalid: must be <= num-virtual-clients"):
        check_execution(config(execution="auto", **{"num-virtual-clients": 4, "min-available-clients": 5}), fedavg)
    with pytest.raises(ConfigError, match="valid choices: auto, per-client, cohort"):
        validate_config({"execution": "batched"})


def test_auto_chooses_cohort_only_on_cuda_in_a_runner_launch_for_a_supported_method():
    fedavg, cfg = get_method("fedavg"), config()
    assert launch_execution(cfg, fedavg, 10, cuda=True, gpus=2).path == COHORT
    assert launch_execution(cfg, fedavg, 10, cuda=True, gpus=2).nodes == 2
    cpu = launch_execution(cfg, fedavg, 10, cuda=False)
    assert (cpu.path, cpu.nodes) == (PER_CLIENT, 10) and "no CUDA GPU" in cpu.reason
    assert "Ray cluster" in launch_execution(cfg, fedavg, 10, cuda=True, gpus=1, cluster=True).reason
    explicit = launch_execution(config(execution="cohort"), fedavg, 10, cuda=False)
    assert (explicit.path, explicit.nodes) == (COHORT, 1)
    # the server follows what it was launched for, and says why
    flwr_run = server_execution(cfg, fedavg, cuda=True)
    assert flwr_run.path == PER_CLIENT and "not launched by run_simulation.py" in flwr_run.reason
    launched = server_execution(config(**{"num-virtual-clients": 6}), fedavg, cuda=True)
    assert launched.path == COHORT and "6 virtual clients" in launched.reason


# ------------------------------------------------------------------ routing
class PartitionNode(ClientProxy):
    """A per-client node: reports its partition."""

    def __init__(self, cid: str, partition: int, num_partitions: int):
        super().__init__(cid)
        self.partition, self.num_partitions = partition, num_partitions

    def get_properties(self, ins, timeout, group_id):
        return GetPropertiesRes(Status(Code.OK, ""), {"partition-id": self.partition,
                                                      "num-partitions": self.num_partitions})

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def fit(self, ins, timeout, group_id):
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


class EchoCohortNode(PartitionNode):
    """A cohort node: every virtual client replies its arrays + its partition id, its config's
    num-partitions and server-round as metrics; ``fail`` names partitions that fail;
    ``broken`` makes the whole node raise."""

    def __init__(self, cid, partition, num_partitions, fail=(), broken=False):
        super().__init__(cid, partition, num_partitions)
        self.fail, self.broken, self.bundles = set(fail), broken, []

    def fit(self, ins, timeout, group_id):
        if self.broken:
            raise RuntimeError("node lost")
        parts = split_instructions(parameters_to_ndarrays(ins.parameters), ins.config)
        self.bundles.append([p for p, _, _ in parts])
        replies = [(p, [a + p for a in arrays], 10 + p, {"num-partitions": config["num-partitions"],
                                                           "round": config["server-round"]})
                   for p, arrays, config in parts if p not in self.fail]
        arrays, total, metrics = bundle_replies(replies, {p: "out of memory" for p, _, _ in parts if p in self.fail})
        return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), total, metrics)


def cohort_manager(n: int, nodes: list[ClientProxy], seed: int = 0) -> CohortClientManager:
    manager = CohortClientManager(seed, n, wait_seconds=1)
    for node in nodes:
        manager.register(node)
    manager.host(len(nodes))
    return manager


def test_cohort_samples_the_same_partitions_as_per_client():
    """Sampling from N virtual clients draws the partitions N partition nodes would (random node
    ids, registered in another order), round after round."""
    n, rounds = 13, 6
    per_client = SeededClientManager(seed=3, wait_seconds=1)
    for p in np.random.default_rng(1).permutation(n):
        per_client.register(PartitionNode(str(1000 + 37 * int(p) % 101), int(p), n))
    cohort = cohort_manager(n, [EchoCohortNode("77", 1, 2), EchoCohortNode("5", 0, 2)], seed=3)
    for size in (4, 4, 7, 1, 13, 4)[:rounds]:
        nodes = [per_client.partition_of[c.cid] for c in per_client.sample(size)]
        virtual = [c.partition for c in cohort.sample(size)]
        assert virtual == nodes
    assert per_client.draws == cohort.draws == rounds - 1  # sampling all 13 uses no draw


def test_virtual_clients_are_hosted_by_partition_mod_nodes_in_the_nodes_own_order():
    a, b, c = EchoCohortNode("900", 2, 3), EchoCohortNode("12", 0, 3), EchoCohortNode("450", 1, 3)
    manager = cohort_manager(8, [a, b, c])
    assert manager.num_available() == 8 and manager.num_partitions == 8
    assert [v.host.cid for v in manager.virtual] == ["12", "450", "900"] * 2 + ["12", "450"]
    props = manager.virtual[5].get_properties(None, None, None).properties
    assert props == {"partition-id": 5, "num-partitions": 8}
    assert manager.ordered(["partition-7", "partition-2", "partition-5"]) == ["partition-2", "partition-5",
                                                                              "partition-7"]


def test_a_data_path_node_cannot_host_a_cohort():
    class DataPathNode(PartitionNode):
        def get_properties(self, ins, timeout, group_id):
            return GetPropertiesRes(Status(Code.OK, ""), {"data-path": "/data/mine.parquet"})

    with pytest.raises(ConfigError, match="data-path"):
        cohort_manager(4, [DataPathNode("1", 0, 1)])


def instructions(manager, partitions, weights):
    return [(manager.virtual[p], FitIns(ndarrays_to_parameters(weights), {"server-round": 2})) for p in partitions]


def test_fit_cohort_sends_one_bundle_per_node_and_splits_the_replies():
    nodes = [EchoCohortNode("a", 0, 2), EchoCohortNode("b", 1, 2)]
    manager = cohort_manager(6, nodes)
    weights = [np.arange(3, dtype=np.float32), np.ones((2, 2), dtype=np.float32)]
    results, failures = fit_cohort(instructions(manager, [0, 1, 3, 4], weights), None, None, 2)
    assert failures == []
    assert nodes[0].bundles == [[0, 4]] and nodes[1].bundles == [[1, 3]]
    by_partition = {proxy.partition: res for proxy, res in results}
    assert sorted(by_partition) == [0, 1, 3, 4]
    for p, res in by_partition.items():
        got = parameters_to_ndarrays(res.parameters)
        assert all(np.array_equal(g, w + p) for g, w in zip(got, weights))
        assert res.num_examples == 10 + p
        assert res.metrics == {"num-partitions": 6, "round": 2}  # N reached every virtual client


def test_a_failed_client_and_a_failed_node_are_failures_per_client():
    nodes = [EchoCohortNode("a", 0, 2, fail={2}), EchoCohortNode("b", 1, 2, broken=True)]
    manager = cohort_manager(6, nodes)
    results, failures = fit_cohort(instructions(manager, [0, 1, 2, 3], [np.zeros(2, np.float32)]), 2, None, 1)
    assert [proxy.partition for proxy, _ in results] == [0]
    assert len(failures) == 3 and all(isinstance(f, CohortFailure) for f in failures)
    text = " ".join(str(f) for f in failures)
    assert "partition-2 failed on cohort node a: out of memory" in text
    assert "cohort node b failed for partition-1" in text and "cohort node b failed for partition-3" in text


def test_a_virtual_clients_own_fit_is_a_bundle_of_one():
    node = EchoCohortNode("a", 0, 1, fail={1})
    manager = cohort_manager(3, [node])
    res = manager.virtual[2].fit(FitIns(ndarrays_to_parameters([np.zeros(1, np.float32)]), {"server-round": 1}),
                                 None, 1)
    assert parameters_to_ndarrays(res.parameters)[0][0] == 2 and node.bundles == [[2]]
    with pytest.raises(CohortFailure, match="out of memory"):
        manager.virtual[1].fit(FitIns(ndarrays_to_parameters([np.zeros(1, np.float32)]), {"server-round": 1}),
                               None, 1)


def close(key: str, a, b, rel=1e-4, acc=1e-3) -> bool:
    """Column ``key``'s values of two metrics.csv rows equal within the module docstring's
    tolerance: an accuracy column (its name contains ``accuracy``: a count of test examples over
    N_test) within ``acc`` absolute; every other float (losses, norms, cosines, diversities, at
    any magnitude, zero too) within ``rel`` relative, with no absolute floor; NaN only against
    NaN; strings and ints exactly."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if "accuracy" in key:
            return abs(a - b) <= acc
        return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)
    return a == b


def test_close_holds_every_metric_but_accuracy_to_relative_tolerance():
    """``close`` is what the module docstring says: a small norm, loss or zero is compared
    relatively (no absolute floor: a 1% error of a 0.005 norm, as FedDyn's metrics rounded to 4
    decimals on the wire would make it, fails), accuracy absolutely."""
    assert not close("feddyn_grad_norm_mean", 0.0049, 0.004931)  # 6e-3 relative, 3e-5 absolute
    assert not close("train_loss", 0.846, 0.8462)  # 2.4e-4 relative
    assert close("train_loss", 0.846, 0.84605) and close("ci_norm_mean", 2.7293, 2.72935)  # < 1e-4 relative
    assert not close("drift_norm_max", 0.0, 1e-9) and close("drift_norm_max", 0.0, 0.0)
    assert close("test_accuracy", 0.892, 0.8925) and not close("test_accuracy", 0.892, 0.8935)
    assert close("test_loss", 0.728, 0.735, **BN_TOLERANCE) and not close("test_loss", 0.728, 0.75, **BN_TOLERANCE)
    assert close("test_loss", math.nan, math.nan) and not close("test_loss", math.nan, 0.5)
    assert close("num_clients", 2, 2) and not close("num_clients", 2, 3)


# ------------------------------------------------------------------ end to end, in process
NODES = 4  # the per-client run's nodes: partitions of the synthetic data
# what a method needs beyond the defaults: test_simulation's settings, and DP-FedAvg's server-side
# clipping (its client mode clips per message, a mod: refused) with noise seeded from (seed, round)
NEEDS = {**SIMULATION_NEEDS, "dp-fedavg": {"dp-mode": "server", "dp-noise-seeded": True}}
# every method runs its cohort-vs-per-client comparison; these five (stateless, proximal, control
# variates, FedDyn's state, SAM's two passes) in the default run, the others marked slow
DEFAULT_RUN = ("fedavg", "fedprox", "scaffold", "feddyn", "fedsam")
TIMING = ("seconds",)  # columns of time, which differ between any two runs
# a summed reply (cohort-replies, the default where the server declares REPLY_SUMS) is one node's
# traffic over its clients, not each client's: bytes_up_per_client differs by design
SUMMED_TRAFFIC = ("bytes_up",)


def serve_cohort(run_config: dict, nodes: int) -> None:
    """One cohort run in this process: the ServerApp's ``server_fn`` components, and ``nodes``
    cohort nodes (node config partition-id m of ``nodes``, as Flower's simulation gives its
    SuperNodes) served by the ClientApp's ``client_fn`` (``tests.kit.Proxy``), one message
    at a time (``serve_in_process``'s reason: in one process the nodes share the cached model)."""
    from flwr.app import Context, RecordDict

    from fl_app.server_app import server_fn
    from tests.kit import Proxy, without_picture

    run_config = without_picture(run_config)
    components = server_fn(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    server = components.server
    for m in range(nodes):
        context = Context(run_id=0, node_id=500 + 11 * m, node_config={"partition-id": m, "num-partitions": nodes},
                          state=RecordDict(), run_config=run_config)
        server.client_manager().register(Proxy(str(500 + 11 * m), context))
    server.set_max_workers(1)  # one process: the nodes share the cached models, as one Ray actor's clients do
    server.fit(components.config.num_rounds, timeout=None)


def base_config(method: str, tmp_path, **keys) -> dict:
    return {"strategy": method, "dataset": "synthetic", "model": "logreg", "num-server-rounds": 3,
            "fraction-fit": 0.5, "min-available-clients": NODES, "learning-rate": 0.05, "tracking": "none",
            "results-dir": str(tmp_path), **NEEDS.get(method, {}), **keys}


def cohort_keys(**keys) -> dict:
    return {"execution": "cohort", "num-virtual-clients": NODES, **keys}


BN_TOLERANCE = {"rel": 2e-2, "acc": 1e-2}  # BatchNorm models (module docstring)


def compared(a_rows: list[dict], b_rows: list[dict], exact: bool, skip: tuple = (), **tolerance) -> list[str]:
    """The differences between two runs' metrics.csv rows (timing columns and ``skip`` aside):
    every value equal (``exact``) or within the module docstring's tolerance (``tolerance``:
    ``close``'s ``rel`` and ``acc``, e.g. ``BN_TOLERANCE``)."""
    problems = []
    assert len(a_rows) == len(b_rows)
    for a, b in zip(a_rows, b_rows):
        shared = [k for k in a if k in b and not any(t in k for t in TIMING + skip)]
        assert {"test_accuracy", "test_loss", "train_loss", "num_clients"} <= set(shared)
        for k in shared:
            if not (a[k] == b[k] if exact else close(k, a[k], b[k], **tolerance)):
                problems.append(f"round {a['round']} {k}: {a[k]!r} vs {b[k]!r}")
    return problems


def per_client_run(method: str, tmp_path, **keys) -> list[dict]:
    from runner.results.report import read_metrics
    from tests.kit import serve_in_process

    serve_in_process(base_config(method, tmp_path, **keys, **{"run-name": "per-client"}), NODES)
    return read_metrics(tmp_path / "per-client")


def cohort_run(method: str, tmp_path, nodes: int = 1, name: str = "cohort", **keys) -> list[dict]:
    from runner.results.report import read_metrics, read_summary

    serve_cohort(base_config(method, tmp_path, **cohort_keys(**keys), **{"run-name": name}), nodes)
    assert read_summary(tmp_path / name)["execution"]["path"] == "cohort"
    return read_metrics(tmp_path / name)


def runnable_as_cohort() -> list:
    """Every method that runs as a cohort with ``NEEDS``' settings, the slow ones marked."""
    names = [m for m in METHODS
             if not cohort_problem(config(**{**NEEDS.get(m, {}), "strategy": m}), get_method(m))]
    return [m if m in DEFAULT_RUN else pytest.param(m, marks=pytest.mark.slow) for m in names]


@pytest.mark.parametrize("method", runnable_as_cohort())
def test_cohort_run_equals_per_client_run_within_tolerance(method, tmp_path, request):
    """3 rounds, 2 of 4 clients a round, on one cohort node (both clients in one vmap) against
    4 per-client nodes of the same seed: metrics.csv within the module docstring's tolerance.
    The node replies every client's arrays (``cohort-replies = "full"``): what is compared is
    vmap's; its summed reply is compared with full replies in ``test_summed_replies_equal_full_replies``."""
    keys = {"data-dir": str(request.getfixturevalue("small_mnist"))} if NEEDS.get(method, {}).get("dataset") else {}
    per_client = per_client_run(method, tmp_path, **keys)
    cohort = cohort_run(method, tmp_path, **keys, **{"cohort-replies": "full"})
    assert [r["num_clients"] for r in cohort] == [2, 2, 2]
    bn = "-bn" in NEEDS.get(method, {}).get("model", "")
    # BN: min_class_accuracy is one class's ~100 test images, which BN's amplified rounding moved
    # by 7 (0.73 vs 0.66, measured 2026-11-29): left out, test_accuracy is held
    assert compared(per_client, cohort, exact=False, skip=("min_class",) if bn else (),
                    **(BN_TOLERANCE if bn else {})) == []


def test_an_unbatched_method_replies_in_full_by_default():
    """``cohort-replies = "auto"`` sums for a summing server, but not for an ``unbatched`` update
    (FedDecorr's), whose run is then its per-client run exactly (next test); ``sum`` asked for
    is still taken."""
    from fl_app.common.execution_checks import summed_replies

    strategy = get_method("feddecorr").strategy
    assert strategy.REPLY_SUMS is not None
    assert summed_replies(config(strategy="feddecorr"), strategy) is True
    assert summed_replies(config(strategy="feddecorr"), strategy, unbatched=True) is False
    assert summed_replies(config(strategy="feddecorr", **{"cohort-replies": "sum"}), strategy, unbatched=True)


def test_an_unbatched_methods_cohort_run_is_its_per_client_run_bit_for_bit(tmp_path, mnist_sample):
    """FedDecorr (``unbatched``) on real MNIST, ``cnn-small``, float32: 2 rounds of 2 of 4 clients
    on one cohort node with the default ``cohort-replies`` against 4 per-client nodes: metrics.csv
    identical in every column but times. Its clients train alone (at the per-client path's threads,
    tests/training/test_cohort_mnist.py) and reply in full, so the server's mean is the per-client
    one; a node's summed reply rounded the mean otherwise, and FedDecorr's round 2 amplified it."""
    keys = {"dataset": "mnist", "data-dir": str(mnist_sample(1200, 200)), "model": "cnn-small",
            "num-server-rounds": 2, "batch-size": 32}
    per_client = per_client_run("feddecorr", tmp_path, **keys)
    cohort = cohort_run("feddecorr", tmp_path, **keys)
    assert [r["num_clients"] for r in cohort] == [2, 2]
    assert compared(per_client, cohort, exact=True) == []


@pytest.mark.parametrize("faults", ["alie:0", "mimic:1,label-flip:2"])
def test_omniscient_and_data_attacks_act_alike_on_both_paths(faults, tmp_path):
    """The server replaces the attackers' replies from the honest ones whichever path brought them
    (fl_app/server/omniscient.py: each reply names its partition), and a label-flipping virtual
    client trains as its own node would: the same run within tolerance, and not the clean run."""
    keys = {"inject-faults": faults, "fraction-fit": 1.0, "cohort-replies": "auto"}  # auto: full replies here
    per_client = per_client_run("fedavg", tmp_path, **keys)
    cohort = cohort_run("fedavg", tmp_path, **keys)
    assert compared(per_client, cohort, exact=False) == []
    clean = cohort_run("fedavg", tmp_path, name="clean", **{"fraction-fit": 1.0})
    assert compared(clean, cohort, exact=False) != []


@pytest.mark.parametrize("method", ["fedavg", "scaffold", pytest.param("fedbn", marks=pytest.mark.slow)])
def test_cohort_of_one_client_equals_per_client_exactly(method, tmp_path, request):
    """One of 4 clients a round, on one of 2 cohort nodes: a cohort of one runs unbatched, the
    same kernels as the per-client path, so metrics.csv is identical. The clients also score the
    global model on their local test splits (``client-test-fraction``: one evaluate message per
    virtual client through its node), identically."""
    keys = {"fraction-fit": 0.25, "min-fit-clients": 1, "client-test-fraction": 0.25, "cohort-replies": "full"}
    if NEEDS.get(method, {}).get("dataset"):
        keys["data-dir"] = str(request.getfixturevalue("small_mnist"))
    per_client = per_client_run(method, tmp_path, **keys)
    cohort = cohort_run(method, tmp_path, nodes=2, **keys)
    assert [r["num_clients"] for r in cohort] == [1, 1, 1]
    assert all(r["client_eval_clients"] >= 1 for r in cohort)
    assert compared(per_client, cohort, exact=True) == []


@pytest.mark.parametrize("method", ["fedavg", "scaffold"])
def test_cohort_resume_equals_uninterrupted_cohort_run(method, tmp_path):
    """A cohort run crashes after round 2 (``crash-after:2``) and resumes with new cohort nodes
    (empty ``context.state``): rounds 3-4 equal the uninterrupted cohort run's (the clients'
    state comes back from the rows' journal, the sampler's draws from the checkpoint)."""
    from runner.results.report import read_metrics, read_summary

    keys = {"num-server-rounds": 4}
    full = cohort_run(method, tmp_path, name="full", **keys)
    with pytest.raises(RuntimeError, match="injected crash after round 2"):
        cohort_run(method, tmp_path, name="cut", **keys, **{"inject-faults": "crash-after:2"})
    if method == "scaffold":  # the clients' state, journalled by the cohort node's rows
        assert any((tmp_path / "cut" / "client-rows").rglob("round-*.npz"))
    serve_cohort(base_config(method, tmp_path, **cohort_keys(**keys), **{"run-name": "cut", "resume": True}), 1)
    resumed = read_metrics(tmp_path / "cut")
    assert [r["round"] for r in resumed] == [1, 2, 3, 4]
    # state_arrays_in too: counted after the mirror's state is restored
    assert compared(full, resumed, exact=True) == []
    assert read_summary(tmp_path / "cut")["execution"]["path"] == "cohort"


# ------------------------------------------------------------------ summed replies
# test_summed_replies_equal_full_replies' docstring: metrics as the cohort comparison above (``close``'s
# defaults), BatchNorm models within 5e-2 relative and a class's accuracy (min_class_accuracy: about
# 100 test examples a class) within 2 examples; the arrays of the last checkpoint within 1e-4 of each array's scale
SUM_BN_TOLERANCE = {"rel": 5e-2, "acc": 2.5e-2}
SUM_ARRAYS_REL = 1e-4
# RI-FedAvg's index at l = 0.01 measures rounding noise (clients/ri_fedavg.py: float32, several per
# cent for a one-ulp change of w_t; float64, about 1e-17), so the comparison measures it at l = 1
SUM_NEEDS = {"ri-fedavg": {"ri-interval": 1.0}}
DEFAULT_SUMMED = ("fedavg", "scaffold", "fedgam-cv")  # the others marked slow


def summing_methods() -> list:
    """Every method whose server declares ``REPLY_SUMS`` and that runs as a cohort."""
    names = [m for m in METHODS if METHODS[m].strategy.REPLY_SUMS is not None
             and not cohort_problem(config(**{**NEEDS.get(m, {}), "strategy": m}), get_method(m))]
    return [m if m in DEFAULT_SUMMED else pytest.param(m, marks=pytest.mark.slow) for m in names]


@pytest.mark.parametrize("method", summing_methods())
def test_summed_replies_equal_full_replies(method, tmp_path, request):
    """Every client of 4 each round on 2 cohort nodes (2 clients a node), 3 rounds: each node
    replying one n_k-weighted mean and sums (``cohort-replies = "sum"``) against every client's
    own reply (``"full"``): the same clients and training, so metrics.csv's every column (times
    and the traffic aside) and the last checkpoint's model and server state (c for the control
    variate methods) agree within the rounding of the other summation order. The node's float64
    mean is cast to float32 before the server's weighted mean of the nodes (1 float32 ulp, 6e-8
    relative, per array and round); over 3 rounds the metrics are held to 1e-5 relative (accuracy
    1e-3 absolute) and the arrays to 1e-4 of each array's scale. FedGAM-CV divides c's update by
    the round's participants, which a summed reply counts by its ``SUMMED_CLIENTS``.

    Measured (all 20 summing methods, 2026-11-29): fedavg-like servers within 1e-6 on every
    array; the adaptive servers divide by sqrt(v_t) + tau, which carries the mean's ulp up to
    7.5e-6 (FedAdagrad's model); FedDecorr amplifies it in training to 2.2e-5 relative on
    drift_norm_mean in round 2 and 4e-5 on its model; FedBN's BatchNorm to 2 test examples of
    a class, 1e-2 of its first array's scale and 3.6e-2 of its evaluation-only BN mean (the
    unit test of every summing server's aggregation, tests/server/test_summed_replies.py,
    holds FedBN's to 1e-6 on the same replies). Hence the
    metrics at the cohort comparison's tolerance (``close``: 1e-4 relative, accuracy 1e-3),
    BatchNorm models at ``SUM_BN_TOLERANCE`` (their arrays too), the arrays at ``SUM_ARRAYS_REL``."""
    from fl_app.server.checkpoint import load_checkpoint
    from tests.kit import assert_arrays_close

    keys = {"fraction-fit": 1.0, **SUM_NEEDS.get(method, {})}
    if NEEDS.get(method, {}).get("dataset"):
        keys["data-dir"] = str(request.getfixturevalue("small_mnist"))
    full = cohort_run(method, tmp_path, nodes=2, name="full", **keys, **{"cohort-replies": "full"})
    summed = cohort_run(method, tmp_path, nodes=2, name="sum", **keys, **{"cohort-replies": "sum"})
    assert [r["num_clients"] for r in summed] == [NODES] * 3
    bn = "-bn" in NEEDS.get(method, {}).get("model", "")
    assert compared(full, summed, exact=False, skip=SUMMED_TRAFFIC, **(SUM_BN_TOLERANCE if bn else {})) == []
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "sum")
    assert a.round == b.round == 3
    rel = SUM_BN_TOLERANCE["rel"] if bn else SUM_ARRAYS_REL
    assert_arrays_close(b.weights, a.weights, rel=rel, what=f"{method}: the model")
    assert a.strategy_state.keys() == b.strategy_state.keys()
    for name in a.strategy_state:
        assert_arrays_close(b.strategy_state[name], a.strategy_state[name], rel=rel, what=f"{method}: {name}")


def test_a_summed_reply_is_one_nodes_sum_and_counts_its_clients(tmp_path):
    """A summed fedavg run on one node: the node's reply stands for both clients of a round
    (num_clients 2, not 1 node), each client's own metrics are summarised (train_loss, the fit
    seconds' min and max), and the reply carries 1 model and the drift sums (float64: 2 x 2
    float32 models' bytes over the trainable entries) over 2 clients: 2.5 models a client."""
    from runner.results.report import read_metrics

    rows = cohort_run("fedavg", tmp_path, **{"cohort-replies": "sum"})
    full = cohort_run("fedavg", tmp_path, name="full", **{"cohort-replies": "full"})
    assert [r["num_clients"] for r in rows] == [2, 2, 2]
    assert all(r["fit_seconds_min"] <= r["fit_seconds_max"] and r["train_loss"] > 0 for r in rows)
    assert rows[0]["bytes_up_per_client"] == pytest.approx(2.5 * full[0]["bytes_up_per_client"])
    assert read_metrics(tmp_path / "full")[0]["bytes_up_per_client"] == full[0]["bytes_up_per_client"]


# ------------------------------------------------------------------ end to end, through Flower
def test_cohort_run_through_flowers_simulation_equals_per_client(simulated, sim, tmp_path, request):
    """The cohort path through ``flwr run`` (``LocalSimulation``: one cohort SuperNode hosting the
    virtual clients, Flower's transport and node registration) against the per-client fedavg
    run of ``tests/runner/test_simulation.py`` (shared: ``simulated``), metrics.csv within the module
    docstring's tolerance; summary.json records the path and why."""
    from runner.results.report import read_metrics, read_summary
    from tests.kit_runs import SUPERNODES, simulated_config

    cfg = simulated_config("fedavg", request)
    per_client = simulated("fedavg", cfg, SUPERNODES)
    assert per_client.rc == 0
    lines: list[str] = []
    keys = {"execution": "cohort", "num-virtual-clients": SUPERNODES, "results-dir": str(tmp_path), "run-name": "c"}
    assert sim.run({**cfg, **keys}, num_supernodes=SUPERNODES, on_line=lines.append) == 0, "\n".join(lines[-30:])
    assert any(f"cohort: {SUPERNODES} virtual clients on 1 cohort node(s)" in line for line in lines)
    assert compared(read_metrics(per_client.run_dir), read_metrics(tmp_path / "c"), exact=False,
                    skip=SUMMED_TRAFFIC) == []
    summary = read_summary(tmp_path / "c")
    assert summary["execution"] == {"path": "cohort", "reason": f"execution = 'cohort' ({SUPERNODES} virtual clients)"}
    assert summary["num_clients"] == SUPERNODES
    assert read_summary(per_client.run_dir)["execution"]["path"] == "per-client"


# ------------------------------------------------------------------ the runner
SYNTH = ["--dataset", "synthetic", "--set", "model=logreg", "--rounds", "2", "--clients", "6"]


def test_runner_sets_the_virtual_clients_of_a_cohort_run():
    from runner.launch import execution_for

    raw = {"dataset": "synthetic", "model": "logreg", "execution": "cohort", "min-available-clients": 6}
    launched, execution = execution_for(raw, 6)
    assert launched["num-virtual-clients"] == 6 and execution.cohort and execution.nodes >= 1
    per_client, execution = execution_for({**raw, "execution": "per-client"}, 6)
    assert "num-virtual-clients" not in per_client and (execution.path, execution.nodes) == (PER_CLIENT, 6)
    with pytest.raises(ConfigError, match="'num-virtual-clients' = 3 is set by the runner"):
        execution_for({**raw, "num-virtual-clients": 3}, 6)


@pytest.mark.parametrize("cpus_per_client, threads", [(1, 1), (0.5, 1), (2, 2)])
def test_a_cohort_launch_trains_alone_at_the_per_client_paths_threads(monkeypatch, tmp_path, cpus_per_client,
                                                                     threads):
    """A cohort run is launched with ``client-threads`` = the per-client actor's torch threads
    (its CPU share, ``match_threads_to_cpu_share``), which an unbatched client then trains at;
    a per-client run is launched without it."""
    import runner.launch as launch

    sent = []
    monkeypatch.setattr(launch, "stream_flwr_run", lambda app, fed, cfg, *a, **k: sent.append(cfg) or 0)
    sim = launch.LocalSimulation(home=tmp_path)
    sim.managed = type("Managed", (), {"refresh": lambda self: None})()
    sim.run({"num-virtual-clients": 4}, num_supernodes=4, cpus_per_client=cpus_per_client)
    sim.run({"num-virtual-clients": 0}, num_supernodes=4, cpus_per_client=cpus_per_client)
    assert sent[0]["client-threads"] == threads and "client-threads" not in sent[1]


def test_check_states_each_runs_path_and_refuses_a_cohort_that_cannot_run(tmp_path, capsys, monkeypatch):
    import run_simulation

    monkeypatch.setattr("runner.launch.visible_gpus", lambda devices: 0)  # as on this CPU
    out = tmp_path / "out"
    assert run_simulation.main(["--check", "--strategy", "fedavg", *SYNTH, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "(to run; per-client)" in printed and "per-client (1 of 1 runs): auto: per-client, no CUDA GPU" in printed
    assert run_simulation.main(["--check", "--strategy", "fedavg", *SYNTH, "--set", "execution=cohort",
                                "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "(to run; cohort)" in printed and "cohort (1 of 1 runs): execution = 'cohort'" in printed
    assert "1 of them on the cohort path" in printed
    refused = tmp_path / "refused"  # a fresh folder: --check writes the split's picture into --out
    assert run_simulation.main(["--check", "--strategy", "dp-fedavg", *SYNTH, "--set", "execution=cohort",
                                "--out", str(refused)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'execution' = 'cohort' cannot run as a cohort: method 'dp-fedavg'" in err[0]
    assert "valid choices: auto, per-client" in err[0] and not refused.exists()
