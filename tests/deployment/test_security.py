"""Acceptance: one attacker among 10 FedAvg clients on MNIST wrecks the unscreened model; norm
clipping and outlier rejection keep the final accuracy within 3 points of the clean run.

Real clients (inject-faults applies the attack in ``NodeClient.fit``), Flower's FedAvg inside
``DriftServer`` (which screens, driven by ``RoundByRound``), driven in process: no Ray, no SuperLink. Every client
holds 400 images of an IID split (the effect does not need all 60 000); 5 rounds of cnn-small.
Run with ``-s`` to see every run's accuracy per round.
"""

import functools
import json

import numpy as np
import pytest
from flwr.common import (
    ndarrays_to_parameters,
)
from flwr.server.client_manager import SimpleClientManager

from clients import fedavg
from fl_app.node.drift_client import DriftClient
from fl_app.node.node_client import NodeClient
from fl_app.registry import validate_config
from strategies.base import DriftFedAvg, fedavg_kwargs
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights, set_weights
from tasks.partitioning import PartitionSpec, load_partition, load_test_split
from tasks.train import evaluate
from tests.kit import Proxy, fake_context
from tests.kit_server import RoundByRound

K, PER_CLIENT, ROUNDS, TEST = 10, 400, 5, 2000


class Everyone(SimpleClientManager):
    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return [self.clients[str(k)] for k in range(K)]


@functools.lru_cache(maxsize=1)
def mnist(data_dir: str):
    spec = PartitionSpec("mnist", K, partitioner="iid", data_dir=data_dir)
    parts = [tuple(t[:PER_CLIENT] for t in load_partition(spec, k)) for k in range(K)]
    x, y = load_test_split("mnist", data_dir, 0)
    return parts, (x[:TEST], y[:TEST])


@functools.cache
def final_accuracy(data_dir: str, faults: str, screening: str) -> tuple[float, ...]:
    """Test accuracy after each round of FedAvg with the given attack and screening."""
    parts, test = mnist(data_dir)
    cfg = validate_config({
        "dataset": "mnist", "model": "cnn-small", "data-dir": data_dir, "learning-rate": 0.1,
        "fraction-fit": 1.0, "min-fit-clients": K, "min-available-clients": K,
        "inject-faults": faults, "screening": screening,
        "min-fit-fraction": 0.0,  # a wrecked model's clients may all return NaN: keep going
    })
    model = build_model("cnn-small", input_shape("mnist"), seed=0)
    w0 = get_weights(model)

    def evaluate_fn(server_round, arrays, config):
        set_weights(model, arrays)
        loss, accuracy = evaluate(model, *test)
        return loss, {"accuracy": accuracy}

    import tempfile

    inner = DriftFedAvg.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), evaluate_fn))
    strategy = RoundByRound(inner, cfg, tempfile.mkdtemp(prefix="fl-drift-security-"), num_rounds=ROUNDS)
    manager = Everyone()
    for k in range(K):
        client = DriftClient(fedavg.UPDATE, cfg, fake_context(), partition_id=k, num_partitions=K)
        client.use_data(parts[k])
        manager.register(Proxy(str(k), NodeClient(client)))
    parameters = ndarrays_to_parameters(w0)
    for t in range(1, ROUNDS + 1):
        instructions = strategy.configure_fit(t, parameters, manager)
        results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
        new, _ = strategy.aggregate_fit(t, results, [])
        parameters = new if new is not None else parameters
        strategy.evaluate(t, parameters)
    accs = tuple(r["test_accuracy"] for r in strategy.rows)
    print(f"{faults or 'clean':>12} screening={screening:<7} accuracy by round: "
          + " ".join(f"{a:.3f}" for a in accs))
    return accs


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["scale:0:100", "flip:0:100"])
def test_one_attacker_of_ten_is_contained(attack, shared_data):
    data_dir = str(shared_data)
    clean = final_accuracy(data_dir, "", "none")[-1]
    assert clean > 0.8
    attacked = final_accuracy(data_dir, attack, "none")[-1]
    assert attacked < 0.3, f"the attack did not wreck the unscreened model ({attacked:.3f} vs clean {clean:.3f})"
    for screening in ("clip", "reject"):
        screened = final_accuracy(data_dir, attack, screening)[-1]
        assert screened >= clean - 0.03, f"{screening}: {screened:.3f} vs clean {clean:.3f}"


@pytest.mark.slow
def test_screening_costs_nothing_without_an_attacker(shared_data):
    data_dir = str(shared_data)
    clean = final_accuracy(data_dir, "", "none")
    assert final_accuracy(data_dir, "", "reject") == clean  # no honest update exceeds 3 x the median
    for screening in ("clip", "median", "trimmed-mean"):  # clip: half the honest updates are cut to the median
        assert np.isclose(final_accuracy(data_dir, "", screening)[-1], clean[-1], atol=0.03)


@pytest.mark.slow  # a Flower simulation; the screening itself is unit-tested in tests/server/test_screening.py
def test_attack_and_screening_through_a_simulation(tmp_path):
    """The run-config keys reach both sides of a real Flower simulation: partition 0 scales its
    update by 100 (client side) and the server rejects it every round (server side)."""
    from runner.launch import LocalSimulation
    from runner.results.report import read_metrics

    cfg = {"strategy": "fedavg", "dataset": "synthetic", "model": "logreg", "num-server-rounds": 2,
           "fraction-fit": 1.0, "inject-faults": "scale:0:100", "screening": "reject",
           "results-dir": str(tmp_path), "run-name": "screened"}
    with LocalSimulation() as sim:
        assert sim.run(cfg, num_supernodes=4) == 0
    rows = read_metrics(tmp_path / "screened")
    assert len(rows) == 2
    for row in rows:
        assert row["num_rejected"] == 1 and row["num_clients"] == 3 and row["num_clipped"] == 0
        assert row["screen_bound"] > 0 and row["screen_median_norm"] > 0


# ------------------------------------------------------------------ scripts/security_table.py
def test_table_cells_follow_each_method_and_f():
    from scripts.security_table import cells, defences

    assert defences("fedavg", 3) == ["clip", "reject", "median", "trimmed-mean", "krum", "multi-krum",
                                     "geometric-median", "centered-clip", "nnm+trimmed-mean", "arc+nnm+trimmed-mean"]
    # 10 >= 4f + 3 only for f = 1; bucketing (s = 2): f = 1 spoils 1 of 5 buckets, f = 3 spoils 3 of 5
    assert defences("fedavg", 1)[6] == "bulyan" and defences("fedavg", 1)[-1] == "bucketing+median"
    assert defences("scaffold", 3) == ["clip", "reject", "krum", "multi-krum"]  # no robust value, no chain
    assert cells("scaffold", 3)[:2] == [("clean", "none"), ("scale-x10", "none")]
    # clean, each attack unscreened, then per screening: clean (its cost) and each attack
    assert len(cells("fedavg", 3)) == 1 + 3 + 10 * 4 and len(cells("scaffold", 1)) == 1 + 3 + 4 * 4
    assert cells("fedavg", 3)[4:8] == [("clean", "multi-krum")] + [
        (a, "multi-krum") for a in ("scale-x10", "sign-flip", "adaptive")]
    assert sorted(cells("fedavg", 1)) == sorted(set(cells("fedavg", 1)))  # each run once


def test_feddyn_is_the_third_method_with_the_whole_reply_rules_and_named_only_when_kept():
    from scripts.security_table import cells, defences, page_methods, render_page

    # FedDyn's declared screening keeps or drops whole replies: h sums the kept replies' drifts
    assert defences("feddyn", 3) == defences("feddyn", 1) == ["clip", "reject", "krum", "multi-krum"]
    assert len(cells("feddyn", 3)) == 1 + 3 + 4 * 4
    assert page_methods([]) == "FedAvg, SCAFFOLD and FedDyn"  # nothing kept: what the script runs
    records = _scaffold_table([0.9] * 3, {})
    assert page_methods(records) == "SCAFFOLD"
    page = render_page(records + [dict(r, strategy="feddyn") for r in records])
    assert page.startswith("# Security table: model poisoning against SCAFFOLD and FedDyn\n")
    assert "### FedDyn, f = 3 of 10" in page


def test_new_attacks_are_selected_with_attacks_and_shown_when_kept():
    from types import SimpleNamespace

    from scripts.security_table import ATTACKS, cells, render_page, run_config, shown_attacks

    assert cells("fedavg", 3, ["alie"])[:3] == [("clean", "none"), ("alie", "none"), ("clean", "multi-krum")]
    args = SimpleNamespace(partitioner="dirichlet", alpha=0.3, data_dir="", rounds=10)
    for attack in ("alie", "ipm", "mimic", "label-flip", "gaussian"):
        cfg = run_config("fedavg", 3, attack, "multi-krum", 0, args)  # validated: the items parse
        assert cfg["inject-faults"] == ",".join(ATTACKS[attack].format(k=k) for k in range(3))
    assert cfg["partitioner"] == "dirichlet" and cfg["screen-attackers"] == 3
    assert shown_attacks([_record("clean", "none", 0.9)]) == ["scale-x10", "sign-flip", "adaptive"]
    records = _scaffold_table([0.9] * 3, {("alie", "multi-krum"): [0.8] * 3})
    assert shown_attacks(records) == ["scale-x10", "sign-flip", "adaptive", "alie"]
    page = render_page(records)
    # columns: no screening and the defences with a kept run (multi-krum); the others are named
    assert "| alie |  | 10.0 [10.0, 10.0] |" in page and "`alie` (Baruch et al. 2019)" in page
    assert "Not run for this table (no kept run): `clip`, `reject`, `krum`." in page


def test_shards_split_the_cells():
    from scripts.security_table import shard

    assert shard("1/3") == (1, 3)
    for bad in ("3/3", "a/2", "1"):
        with pytest.raises(ValueError):
            shard(bad)


def _record(attack, screening, acc, strategy="scaffold", f=3, seed=0, **setting):
    return {"strategy": strategy, "attackers": f, "attack": attack, "screening": screening, "clients": 10,
            "per_client": 400, "test_images": 2000, "setting": {"seed": seed, "learning-rate": 0.05, **setting},
            "accuracy": [0.1, acc], "num_rejected": [0, 0], "seconds": 60.0}


def _scaffold_table(clean, attacked, seeds=(0, 1, 2)):
    """Kept runs of SCAFFOLD, f = 3: ``clean`` and ``attacked[(attack, screening)]`` are lists of
    final accuracies, one per seed of ``seeds``."""
    records = [_record("clean", "none", acc, seed=s) for s, acc in zip(seeds, clean)]
    for (attack, screening), accs in attacked.items():
        records += [_record(attack, screening, acc, seed=s) for s, acc in zip(seeds, accs)]
    return records


def test_points_never_read_minus_zero():
    from runner.results.stats import Paired
    from scripts.security_table import points

    assert points(Paired(n=2, mean=-0.0004, low=-0.016, high=0.015)) == "0.0 [-1.6, 1.5]"


def test_loss_is_paired_by_seed_with_the_stats_interval():
    from runner.results.stats import paired_difference
    from scripts.security_table import loss, points

    records = _scaffold_table([0.90, 0.92, 0.88], {("adaptive", "multi-krum"): [0.89, 0.90, 0.88]})
    p = loss(records, "adaptive", "multi-krum")
    # by hand: losses 0.01, 0.02, 0.00 -> mean 0.01, sd 0.01, half-width 4.303 * 0.01 / sqrt(3) = 0.02484
    assert p.n == 3 and p.mean == pytest.approx(0.01) and p.high - p.mean == pytest.approx(0.024844, abs=1e-6)
    assert p == paired_difference({0: 0.90, 1: 0.92, 2: 0.88}, {0: 0.89, 1: 0.90, 2: 0.88})
    assert points(p) == "1.0 [-1.5, 3.5]"
    # a seed kept for the attacked run only is not paired: it does not count
    records.append(_record("adaptive", "clip", 0.5, seed=7))
    assert loss(records, "adaptive", "clip").n == 0 and points(loss(records, "adaptive", "clip")) == ""


def test_page_verdicts_come_from_the_kept_runs():
    from scripts.security_table import render_page

    attacked = {}
    for attack in ("scale-x10", "sign-flip", "adaptive"):
        attacked.update({(attack, "none"): [0.10] * 3, (attack, "clip"): [0.50] * 3,
                         (attack, "reject"): [0.20] * 3, (attack, "multi-krum"): [0.89, 0.88, 0.87]})
    records = _scaffold_table([0.90, 0.90, 0.90], attacked)
    records.append(_record("scale-x10", "krum", 0.86))  # one seed of krum only
    page = render_page(records)
    assert "| clean (accuracy) | 0.900 over seeds 0, 1, 2 | | | | |" in page
    assert "| sign-flip | 80.0 [80.0, 80.0] | 40.0 [40.0, 40.0] | 70.0 [70.0, 70.0] |  | 2.0 [-0.5, 4.5] |" in page
    assert "| scale-x10 | 80.0 [80.0, 80.0] | 40.0 [40.0, 40.0] | 70.0 [70.0, 70.0] | 4.0 (1 seed) |" in page
    assert ("- adaptive: best screening `multi-krum`, loss 2.0 points [-0.5, 4.5] over 3 seeds, mean accuracy "
            "0.880: within 3 points; the interval's upper end 4.5 is above 3 points, so the bar is met by the mean, "
            "not shown at 95%") in page
    assert "- `clip` fails against: scale-x10 (40.0 points), sign-flip (40.0 points), adaptive (40.0 points)" in page
    assert "- `krum` fails against: scale-x10 (4.0 points); holds against: none" in page
    assert "**met**" in page
    # 20 cells a seed; missing: clean under each of 4 screenings (12), krum: 2 seeds of scale-x10, 3 + 3 (8)
    assert "20 of 60 runs (every cell shown, on seeds 0, 1, 2) are not kept yet" in page
    # adaptive's multi-krum loses 4 points on average: other screenings could still hold (krum not run)
    for r in records:
        if r["attack"] == "adaptive" and r["screening"] == "multi-krum":
            r["accuracy"][-1] = 0.86
    undecided = render_page(records)
    assert "- adaptive: best so far `multi-krum`, loss 4.0 points" in undecided
    assert "0.860: not decided (fewer than 3 seeds kept for krum)" in undecided
    assert "**not decided (runs missing)**" in undecided
    # every screening run on 3 seeds and the best still loses 4 points: NOT met
    for seed in (0, 1, 2):
        records.append(_record("adaptive", "krum", 0.80, seed=seed))
    assert "- adaptive: best screening `multi-krum`, loss 4.0 points" in render_page(records)
    assert "**NOT met**" in render_page(records)


def test_fewer_than_three_seeds_do_not_decide():
    from scripts.security_table import render_page

    attacked = {(a, "multi-krum"): [0.90, 0.90] for a in ("scale-x10", "sign-flip", "adaptive")}
    page = render_page(_scaffold_table([0.90, 0.90], attacked, seeds=(0, 1)))
    assert ("- adaptive: best so far `multi-krum`, loss 0.0 points [0.0, 0.0] over 2 seeds, mean accuracy 0.900: "
            "not decided (fewer than 3 seeds kept for clip, reject, krum, multi-krum)") in page
    assert "**not decided (runs missing)**" in page
    partial = render_page(_scaffold_table([0.9], {}))
    assert "- adaptive: no screened run kept yet" in partial


def test_runs_of_two_settings_are_refused():
    from scripts.security_table import render_page

    records = [_record("clean", "none", 0.9), _record("adaptive", "krum", 0.9, seed=1, **{"learning-rate": 0.1})]
    with pytest.raises(ValueError, match=r"scaffold-f3-clean-none-s0 and scaffold-f3-adaptive-krum-s1 differ in "
                                         r"learning-rate \(0.05 vs 0.1\)"):
        render_page(records)


def test_render_keeps_the_hand_written_part(tmp_path, monkeypatch):
    import json

    import scripts.security_table as table

    kept, page = tmp_path / "kept", tmp_path / "security.md"
    kept.mkdir()
    monkeypatch.setattr(table, "KEPT", kept)
    monkeypatch.setattr(table, "PAGE", page)
    monkeypatch.setattr(table, "ROOT", tmp_path)
    record = _record("clean", "none", 0.9)
    name = table.run_name("scaffold", 3, "clean", "none", 0)
    assert name == "scaffold-f3-clean-none-s0"
    (kept / f"{name}.json").write_text(json.dumps(record))
    assert table.main(["--render"]) == 0
    generated = page.read_text()
    assert generated.rstrip().endswith(table.HAND_WRITTEN) and "0.900 over seeds 0" in generated
    page.write_text(generated + "\n## Deployment\n\nWritten by hand.\n")
    record["accuracy"][-1] = 0.8
    (kept / f"{name}.json").write_text(json.dumps(record))
    assert table.main(["--render"]) == 0
    again = page.read_text()
    assert "0.800 over seeds 0" in again and again.endswith("\n## Deployment\n\nWritten by hand.\n")
    assert again.count(table.HAND_WRITTEN) == 1


def test_bad_seeds_are_refused(capsys):
    from scripts.security_table import main

    with pytest.raises(SystemExit):
        main(["--seeds", "-1", "--render"])
    assert "--seeds -1 is invalid: a seed must be >= 0" in capsys.readouterr().err


def test_an_interval_inside_the_bar_says_nothing_more():
    from scripts.security_table import render_page

    attacked = {(a, "multi-krum"): [0.89, 0.90, 0.91] for a in ("scale-x10", "sign-flip", "adaptive")}
    attacked.update({(a, d): [0.5] * 3 for a in ("scale-x10", "sign-flip", "adaptive") for d in ("clip", "reject")})
    page = render_page(_scaffold_table([0.90, 0.91, 0.92], attacked))
    assert ("- adaptive: best screening `multi-krum`, loss 1.0 points [1.0, 1.0] over 3 seeds, mean accuracy 0.900: "
            "within 3 points\n") in page
    assert "**met**" in page and "above 3 points" not in page


def test_each_split_has_its_part_and_the_screenings_cost_without_attack():
    from scripts.security_table import KEPT, kept_folder, render_page

    assert kept_folder("iid", 0.3) == KEPT and kept_folder("dirichlet", 0.3) == KEPT / "dirichlet-0.3"
    iid = _scaffold_table([0.90, 0.90, 0.90], {("sign-flip", "krum"): [0.89] * 3})
    skewed = [_record("clean", "none", acc, seed=s, partitioner="dirichlet", alpha=0.3)
              for s, acc in enumerate([0.80, 0.84, 0.82])]
    skewed += [_record("clean", "krum", acc, seed=s, partitioner="dirichlet", alpha=0.3)
               for s, acc in enumerate([0.70, 0.80, 0.75])]
    skewed.append(_record("sign-flip", "krum", 0.60, seed=0, partitioner="dirichlet", alpha=0.3))
    page = render_page(iid + skewed)  # two splits: two parts, not refused as two settings
    head, _, tail = page.partition("## Dirichlet(0.3) clients")
    assert "## IID clients" in head and tail and "partitioner = dirichlet, alpha = 0.3" in tail
    assert "0.900 over seeds 0, 1, 2" in head and "0.820 over seeds 0, 1, 2" in tail
    # by hand: clean - clean under krum = 0.10, 0.04, 0.07 -> mean 7.0 points, sd 3.0, 4.303 * 3 / sqrt(3) = 7.5
    assert "| no attack (the screening's cost) | | 7.0 [-0.5, 14.5] |" in tail
    assert "- `krum` costs 7.0 [-0.5, 14.5] points without attack; fails against: sign-flip (20.0 points)" in tail
    assert "no attack" not in head  # no clean run under a screening kept for IID here
    assert "The IID acceptance bar applied to these clients" in tail and "\nAcceptance (" in head
    with pytest.raises(ValueError, match=r"learning-rate.*out of docs/results/security/dirichlet-0.3$"):  # one split
        render_page(skewed + [_record("clean", "clip", 0.8, seed=1, partitioner="dirichlet", alpha=0.3,
                                      **{"learning-rate": 0.1})])


def test_chains_are_one_defence_name_split_into_pre_and_rule(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import scripts.security_table as table

    assert table.split_defence("arc+nnm+trimmed-mean") == ("arc+nnm", "trimmed-mean")
    assert table.split_defence("bucketing+median") == ("bucketing", "median")
    assert table.split_defence("krum") == ("none", "krum")
    args = SimpleNamespace(partitioner="dirichlet", alpha=0.3, data_dir="", rounds=10)
    cfg = table.run_config("fedavg", 3, "alie", "arc+nnm+trimmed-mean", 0, args)  # validated
    assert (cfg["screen-pre"], cfg["screening"]) == ("arc+nnm", "trimmed-mean")
    assert table.defence_keys(cfg) == ("screen-pre",)
    assert table.defence_keys(table.run_config("fedavg", 1, "clean", "bucketing+median", 0, args)) == (
        "screen-pre", "screen-bucket-size")
    assert table.defence_keys(table.run_config("fedavg", 3, "clean", "centered-clip", 0, args)) == (
        "screen-cc-tau", "screen-cc-iters")
    assert table.defence_keys(table.run_config("fedavg", 3, "clean", "multi-krum", 0, args)) == ()  # as before
    assert table.run_name("fedavg", 3, "ipm", "nnm+trimmed-mean", 2) == "fedavg-f3-ipm-nnm+trimmed-mean-s2"
    # --screenings takes them (the page written from an empty folder here)
    monkeypatch.setattr(table, "KEPT", tmp_path)
    monkeypatch.setattr(table, "PAGE", tmp_path / "security.md")
    monkeypatch.setattr(table, "ROOT", tmp_path)
    assert table.main(["--screenings", "nnm+trimmed-mean", "bucketing+median", "--render"]) == 0
    # a chain's record (with screen-pre) and one kept before the key existed are one setting
    records = [_record("clean", "none", 0.9, strategy="fedavg"),
               _record("clean", "nnm+trimmed-mean", 0.88, strategy="fedavg")]
    records[1]["setting"].update({"screen-pre": "nnm", "screening": "trimmed-mean"})
    table.check_one_setting(records)  # no error
    assert "| no attack (the screening's cost) | | 2.0 (1 seed) |" in table.render_page(records)


def test_bad_chain_is_refused(capsys):
    from scripts.security_table import main

    with pytest.raises(SystemExit):
        main(["--screenings", "nnm+krum+median", "--render"])
    assert "--screenings: invalid choice: 'nnm+krum+median'" in capsys.readouterr().err


def _fedavg_table(clean, attacked, seeds=(0, 1, 2)):
    records = [_record("clean", "none", acc, strategy="fedavg", seed=s) for s, acc in zip(seeds, clean)]
    for (attack, screening), accs in attacked.items():
        records += [_record(attack, screening, acc, strategy="fedavg", seed=s) for s, acc in zip(seeds, accs)]
    return records


def test_worst_case_row_and_the_best_worst_case_defence():
    from scripts.security_table import best_worst_case, render_page, worst_case

    attacks = ("scale-x10", "sign-flip", "adaptive", "alie")
    # by hand, clean 0.90 on every seed: trimmed-mean loses 1, 2, 3, 5 points (worst: alie, 5.0);
    # multi-krum 4, 4, 2, 1 (worst: scale-x10 and sign-flip tie at 4.0, the first is named);
    # nnm+trimmed-mean 0, 1, 6, 2 on two seeds only for alie: left out of the comparison
    losses = {"trimmed-mean": (0.01, 0.02, 0.03, 0.05), "multi-krum": (0.04, 0.04, 0.02, 0.01),
              "nnm+trimmed-mean": (0.0, 0.01, 0.06, 0.02)}
    attacked = {(a, d): [0.90 - x] * 3 for d, xs in losses.items() for a, x in zip(attacks, xs)}
    attacked.update({(a, "none"): [0.5] * 3 for a in attacks})
    attacked[("clean", "multi-krum")] = [0.89, 0.90, 0.88]  # costs 1.0 [-1.5, 3.5]
    records = _fedavg_table([0.90] * 3, attacked)
    records = [r for r in records if not (r["screening"] == "nnm+trimmed-mean" and r["attack"] == "alie"
                                          and r["setting"]["seed"] == 2)]
    attack, p = worst_case(records, "multi-krum", list(attacks))
    assert attack == "scale-x10" and p.mean == pytest.approx(0.04)
    best, attack, p, left_out = best_worst_case(records, "fedavg", 3)
    assert (best, attack, left_out) == ("multi-krum", "scale-x10", ["nnm+trimmed-mean"])
    assert p.mean == pytest.approx(0.04)
    page = render_page(records)
    assert ("| **worst case** (attack) | 40.0 [40.0, 40.0] (scale-x10) | 5.0 [5.0, 5.0] (alie) | "
            "4.0 [4.0, 4.0] (scale-x10) | 6.0 [6.0, 6.0] (adaptive) |") in page
    assert ("- Worst case over the 4 attacks shown, each on at least 3 seeds: the smallest is `multi-krum`'s, "
            "4.0 [4.0, 4.0] points against scale-x10; it costs 1.0 [-1.5, 3.5] points without attack; "
            "**no defence holds every attack within 3 points** (left out, fewer attacks or seeds kept: "
            "nnm+trimmed-mean).") in page
    # multi-krum 2 points better everywhere: within the bar, said so, and nothing plain about none holding
    for r in records:
        if r["screening"] == "multi-krum" and r["attack"] != "clean":
            r["accuracy"][-1] += 0.02
    page = render_page(records)
    assert "the smallest is `multi-krum`'s, 2.0 [2.0, 2.0] points against scale-x10" in page
    assert "it holds every attack within 3 points by the mean (left out" in page
    assert "no defence holds" not in page


def test_worst_case_counts_only_the_attacks_kept_for_a_defence():
    from scripts.security_table import render_page

    records = _fedavg_table([0.90] * 3, {("sign-flip", "median"): [0.80] * 3, ("alie", "median"): [0.85] * 3})
    page = render_page(records)
    assert "| **worst case** (attack) |  | 10.0 [10.0, 10.0] (sign-flip; 2 of 4 attacks) |" in page
    assert ("- Worst case: no defence is kept yet for all 4 attacks shown on at least 3 seeds each "
            "(left out, fewer attacks or seeds kept: median).") in page


def test_columns_of_runs_made_before_the_rollback_are_marked():
    """A stateful method's runs under a rule that drops replies, kept without ``client_rollback``
    (made before a left-out client's state went back), mark their column ‡ with a line under
    the table saying how many; runs that carry it, and the rules that drop nothing, are not
    marked; FedAvg (no client state) never is."""
    from scripts.security_table import ROLLED_BACK, render_page

    attacked = {("sign-flip", s): [0.5] * 3 for s in ("none", "clip", "reject")}
    records = _scaffold_table([0.9] * 3, attacked)
    page = render_page(records)
    assert "| attack | no screening | clip | reject ‡ |" in page
    assert "‡ reject (3 runs): made before a client whose reply the rule left out" in page
    for r in records:
        if r["screening"] == "reject":
            r[ROLLED_BACK] = True
    assert "| attack | no screening | clip | reject |" in render_page(records) and "‡" not in render_page(records)
    fedavg = [{**r, "strategy": "fedavg"} for r in records]
    for r in fedavg:
        r.pop(ROLLED_BACK, None)
    assert "‡" not in render_page(fedavg)


def test_redo_before_rollback_runs_the_marked_runs_again_and_only_those(tmp_path, monkeypatch):
    """``--redo-before-rollback`` replaces a kept SCAFFOLD reject run lacking ``client_rollback``
    and leaves the others (a clip run, a run that carries it) as they are; without the flag
    every kept run stands."""
    from types import SimpleNamespace

    import scripts.security_table as table

    monkeypatch.setattr(table, "KEPT", tmp_path)
    ran = []

    def fake_run(cfg, parts, test):
        ran.append((cfg["screening"], cfg["inject-faults"]))
        return {"accuracy": [0.5], "num_rejected": [0], "seconds": 1.0}
    monkeypatch.setattr(table, "one_run", fake_run)
    monkeypatch.setattr(table, "cells", lambda strategy, attackers, attacks: [
        ("clean", "clip"), ("clean", "reject"), ("sign-flip", "reject")])
    names = {c: table.run_name("scaffold", 1, *c, 0) for c in [("clean", "clip"), ("clean", "reject"),
                                                              ("sign-flip", "reject")]}
    for (attack, screening), name in names.items():
        record = _record(attack, screening, 0.9, f=1)
        if attack == "sign-flip":
            record[table.ROLLED_BACK] = True
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
    args = SimpleNamespace(partitioner="iid", alpha=0.3, data_dir="", rounds=10, shard=(0, 1), screenings=None,
                           attacks=[], per_client=400, test=2000, redo_before_rollback=False)
    table.run_table("scaffold", 1, 0, args, (None, None))
    assert ran == []
    table.run_table("scaffold", 1, 0, SimpleNamespace(**{**vars(args), "redo_before_rollback": True}), (None, None))
    assert ran == [("reject", "")]
    redone = json.loads((tmp_path / f"{names[('clean', 'reject')]}.json").read_text())
    assert redone[table.ROLLED_BACK] is True and redone["accuracy"] == [0.5]
