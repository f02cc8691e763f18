"""Seeds pair runs across methods: for one seed every method trains on the same partitioning and
samples the same clients each round, so a per-seed difference of two methods (runner.results.stats) removes
the split's and the sampling's share of the variance."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest
from flwr.common import ndarrays_to_parameters

from fl_app.registry import get_method, method_names, validate_config
from fl_app.server.sampling import SeededClientManager
from runner.plan import resolve_rows
from strategies.base import fedavg_kwargs
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tasks.partition_spec import PartitionSpec
from tests.kit import CLIENTS, Proxy
from tests.kit_server import RoundByRound

ROOT = Path(__file__).resolve().parents[2]


def sampled(method: str, seed: int, tmp_path: Path, rounds: int = 4, **extra) -> list[list[int]]:
    """The partitions a method's server samples for fit in each round, as the ServerApp builds it
    (DriftServer around the method's strategy, SeededClientManager): its configure step each
    round (client-side evaluation is off, as by default)."""
    cfg = validate_config({"strategy": method, "dataset": "mnist", "model": "lenet-bn" if method == "fedbn" else "lenet",
                           "fraction-fit": 0.3, "min-available-clients": CLIENTS, "seed": seed,
                           "num-server-rounds": rounds, **extra})
    params = ndarrays_to_parameters(get_weights(build_model(cfg["model"], input_shape("mnist"), seed=seed)))
    inner = get_method(method).strategy.from_config(cfg, **fedavg_kwargs(cfg, params, None))
    strategy = RoundByRound(inner, cfg, tmp_path / f"{method}-{seed}", rounds)
    manager = SeededClientManager(seed)
    for pid in range(CLIENTS):  # node ids in another order than the partitions
        manager.register(Proxy(str(9000 - 37 * pid), partition=pid))
    out = []
    for rnd in range(1, rounds + 1):
        out.append(sorted(c.partition for c, _ in strategy.configure_fit(rnd, params, manager)))
    return out


def test_every_method_samples_the_same_clients_for_a_seed(tmp_path):
    reference = sampled("fedavg", 3, tmp_path)
    assert len({tuple(r) for r in reference}) > 1  # the rounds differ
    assert sampled("fedavg", 4, tmp_path) != reference  # and so do the seeds
    for method in method_names():
        if method == "ccvr":  # its last round (calibration) asks every client by default (ccvr-clients)
            assert sampled(method, 3, tmp_path)[:-1] == reference[:-1]
            assert sampled(method, 3, tmp_path)[-1] == list(range(CLIENTS))
            assert sampled(method, 3, tmp_path, **{"ccvr-clients": "sampled"}) == reference
            continue
        assert sampled(method, 3, tmp_path) == reference, method


def load(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def _experiment_files() -> list[Path]:
    return sorted((ROOT / "experiments").rglob("*.toml"))


@pytest.mark.parametrize("path", _experiment_files(), ids=lambda p: p.relative_to(ROOT / "experiments").as_posix())
def test_claimed_rows_share_partition_and_sampling(path):
    """Both rows of every claim see the same split and the same sampling schedule per seed."""
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "scripts" / "make_results.py")
    mr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mr)
    exp = load(path)
    if exp.get("grid"):
        return
    rows = {name: keys for name, _, keys, _ in resolve_rows(list(exp["strategies"]), exp.get("methods", {}),
                                                           method_names())}
    for claim in mr.experiment_claims(exp, list(rows)):
        for seed in exp.get("seeds", [0]):
            cfgs = [validate_config({**exp.get("run-config", {}), **rows[m], "seed": seed,
                                     "min-available-clients": exp["clients"]}) for m in (claim.better, claim.worse)]
            specs = {PartitionSpec.from_config(c, exp["clients"]) for c in cfgs}
            assert len(specs) == 1, (claim, seed)
            sampling = {(c["fraction-fit"], c["min-available-clients"], c["seed"]) for c in cfgs}
            assert len(sampling) == 1, (claim, seed)


def test_pairing_keys_are_not_method_keys():
    """No method declares a key that moves the partitioning or the sampling."""
    partition_keys = {"dataset", "partitioner", "alpha", "shards-per-client", "min-partition-size", "seed",
                      "fraction-fit", "min-available-clients", "data-dir"}
    from fl_app.registry import config_keys

    for method in method_names():
        assert not partition_keys & set(config_keys(get_method(method))), method
