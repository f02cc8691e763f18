"""scripts/make_results.py on fabricated run folders: table values, rounds to target, claimed
orderings with their paired intervals and "not run yet" (no training, no dataset)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from fl_app.registry import validate_config
from tests.kit_runs import GHOST, TOY, load_make_results, row, section, write_run

mr = load_make_results()

ROOT = Path(__file__).resolve().parents[2]


BEST = """
name = "bestcell"
paper = "Other (Roe et al. 2021), Table 2: average of the best test accuracy"
strategies = ["fedavg", "fedpgvc"]
seeds = [0]
clients = 10
target-accuracy = 0.99

[paper-results]
fedavg = 0.9900
fedpgvc = 0.9905

# how the rows' settings were chosen: one known protocol for all, so their claims are counted
[chosen-by]
all = "fixed from the toy paper"
"""


@pytest.fixture
def report(tmp_path):
    exps, results = tmp_path / "experiments", tmp_path / "results"
    exps.mkdir()
    for name, text in (("toy", TOY), ("bestcell", BEST), ("ghost", GHOST)):
        (exps / f"{name}.toml").write_text(text)
    runs = results / "toy" / "runs"
    write_run(runs, "fedavg", 0, [0.2, 0.5, 0.6], min_class=0.1)    # reaches 0.5 at round 2
    write_run(runs, "fedavg", 1, [0.55, 0.4, 0.4], min_class=0.3)   # reaches 0.5 at round 1
    write_run(runs, "fedsol", 0, [0.3, 0.6, 0.7])    # round 2
    write_run(runs, "fedsol", 1, [0.3, 0.48, 0.45])  # never
    write_run(runs, "fedprox", 0, [0.1, 0.2, 0.3])
    write_run(runs, "fedprox", 1, [0.1, 0.2, 0.35], stopped="round 4: only 1 of 10 sampled clients returned a usable update")
    write_run(runs, "fedntd", 0, [0.9, 0.9], finished=False)  # interrupted: not counted
    runs = results / "bestcell" / "runs"
    write_run(runs, "fedavg", 0, [0.8, 0.9, 0.85])
    write_run(runs, "fedpgvc", 0, [0.7, 0.88, 0.87])
    out = tmp_path / "docs" / "results.md"
    text = mr.make_results(exps, results, out)
    return text, out


def test_table_values_and_rounds_to_target(report):
    text, out = report
    assert out.read_text() == text
    toy = section(text, "toy")
    # fedavg finals 0.6 / 0.4: mean 0.5, sample std 0.1414; bests 0.6 / 0.55; target 0.5 at rounds 2 and 1;
    # last-round minimum class accuracy 0.13 / 0.33: mean 0.23, std 0.1414; the runs predate the
    # cost columns (MB per client per round, client compute per round): n/a.
    assert row(toy, "fedavg") == ["fedavg", "0.5000 ± 0.1414", "0.5750 ± 0.0354", "1.5", "n/a", "n/a",
                                  "0.2300 ± 0.1414", "0.5600", "2", "3", "P1"]
    # fedsol reaches the target with one seed only; its runs predate the min-class column.
    assert row(toy, "fedsol") == ["**fedsol**", "0.5750 ± 0.1768", "0.5900 ± 0.1556", "2.0 (1/2 seeds)",
                                  "n/a", "n/a", "n/a", "0.6400", "2", "3", "P1"]
    assert row(toy, "fedprox")[3] == "not reached"
    # A run that stopped early (e.g. diverged) is a result, marked as such and explained.
    assert row(toy, "fedprox")[1] == "0.3250 ± 0.0354 (stopped: 1/2 seeds)"
    assert "- fedprox-seed1: round 4: only 1 of 10 sampled clients returned a usable update" in toy
    assert "Findings: fedprox seed 1 diverged" in toy and "Findings:" not in section(text, "bestcell")
    # An interrupted run (no summary.json) is not a result.
    assert row(toy, "fedntd") == ["fedntd", "not run yet", "not run yet", "not run yet", "-", "-", "-", "0.6300",
                                  "0", "-", "P1"]
    # Overview: finished runs and their summed run time (5 s each in write_run).
    overview = next(l for l in text.splitlines() if l.startswith("| [toy]"))
    finished = sum(int(r[8]) for r in (row(toy, m) for m in ("fedavg", "fedsol", "fedprox", "fedntd")))
    assert overview.split(" | ")[2].split("/")[0] == str(finished)
    assert overview.endswith(f" | {finished * 5 / 60:.1f} min |") and finished == 6


def claim_row(sec: str, claim: str) -> list[str]:
    return row(sec, claim)


def test_claims_paired_interval_and_verdict(report):
    """Without a `claims` list the paper-results imply the claims; each is a paired difference
    with a 95% t interval, checked here against a hand computation."""
    text, _ = report
    toy = section(text, "toy")
    assert "Does the paper's ordering hold" not in toy
    # fedsol - fedavg final, per seed: 0.7 - 0.6 = 0.10, 0.45 - 0.4 = 0.05; mean 0.075,
    # sd 0.035355, t(0.975, df 1) = 12.706: half width 12.706 * 0.035355 / sqrt(2) = 0.31765.
    cells = claim_row(toy, "fedsol > fedavg")
    assert cells[:3] + cells[4:6] == ["fedsol > fedavg", "paper-results: 0.6400 vs 0.5600", "+0.0800", "2",
                                      "**undecided**"]
    # last 5 rounds (all 3 here): seed 0 0.5333 - 0.4333 = 0.10, seed 1 0.41 - 0.45 = -0.04; mean 0.03,
    # sd 0.098995, half width 12.706 * 0.098995 / sqrt(2) = 0.88942
    assert cells[6] == "+0.0300 [-0.8594, +0.9194] undecided"
    mean, low, high = (float(x) for x in cells[3].replace("[", "").replace("]", "").replace(",", "").split())
    assert (mean, low, high) == pytest.approx((0.075, 0.075 - 0.31765, 0.075 + 0.31765), abs=1.01e-4)
    # The strongest baseline of the paper's table (FedNTD 0.63) has no finished run.
    assert claim_row(toy, "fedsol > fedntd")[3:] == ["not run yet", "0", "not run yet", "-", "P1 / P1"]
    best = section(text, "bestcell")
    # "best" in the paper entry: best accuracies, 0.88 - 0.90 on one seed: no interval.
    assert "(best accuracy, paired by seed" in best
    assert claim_row(best, "fedpgvc > fedavg")[3:6] == ["-0.0200 (1 seed, no interval)", "1", "**undecided**"]


def test_explicit_claims_refuted_and_holds(tmp_path):
    exps, results = tmp_path / "experiments", tmp_path / "results"
    exps.mkdir()
    (exps / "c.toml").write_text(GHOST.replace('name = "ghost"', 'name = "c"').replace(
        "target-accuracy = 0.9", 'target-accuracy = 0.9\nclaims = ["fedgam > fedavg (Table 3)", '
        '"fedavg < fedgam (Table 3 again)"]').replace("seeds = [0, 1]", "seeds = [0, 1, 2]"))
    runs = results / "c" / "runs"
    for seed, (a, g) in enumerate([(0.90, 0.85), (0.91, 0.87), (0.92, 0.86)]):
        write_run(runs, "fedavg", seed, [a])
        write_run(runs, "fedgam", seed, [g])
    text = mr.make_results(exps, results, tmp_path / "r.md")
    sec = section(text, "c")
    # d = g - a = -0.05, -0.04, -0.06: mean -0.05, sd 0.01, t(df 2) = 4.303: half 0.024843.
    assert claim_row(sec, "fedgam > fedavg")[1:] == ["Table 3", "+0.0300", "-0.0500 [-0.0748, -0.0252]", "3",
                                                     "**refuted**", "-0.0500 [-0.0748, -0.0252] refuted",
                                                     "P1 / P1"]
    assert claim_row(sec, "fedgam > fedavg")[1] == "Table 3"
    assert sec.count("| fedgam > fedavg |") == 2  # "fedavg < fedgam" is the same claim turned round
    # The overview counts the section's verdicts, one per listed claim.
    overview = next(line for line in text.splitlines() if line.startswith("| [c]"))
    assert overview.split(" | ")[4] == "2 refuted"


def test_overview_counts_verdicts_and_claims_without_runs(report):
    """The overview's claims column: the verdicts of the section's claims table, counted, with
    claims that have no finished run on a side counted as not run."""
    text, _ = report
    cells = {line.split(" | ")[0]: line.split(" | ")[4] for line in text.splitlines() if line.startswith("| [")}
    # toy: fedsol > fedavg undecided (interval [-0.24, +0.39] above), fedsol > fedntd: no fedntd run.
    assert cells["| [toy](#toy)"] == "1 undecided, 1 not run yet"
    assert cells["| [bestcell](#bestcell)"] == "1 undecided"  # one seed: no interval
    assert cells["| [ghost](#ghost)"] == "1 not run yet"


def test_last_rounds_column_separates_an_ordering_that_one_round_hides(tmp_path):
    """Runs whose last round swings: the paper's metric (final accuracy) leaves the claim
    undecided, the mean over the last 5 rounds decides it (hand computation)."""
    exps, results = tmp_path / "experiments", tmp_path / "results"
    exps.mkdir()
    (exps / "c.toml").write_text(GHOST.replace('name = "ghost"', 'name = "c"').replace(
        "seeds = [0, 1]", "seeds = [0, 1, 2]"))
    runs = results / "c" / "runs"
    for seed, (x, y) in enumerate([(0.75, 0.70), (0.70, 0.72), (0.72, 0.73)]):
        write_run(runs, "fedavg", seed, [0.1, 0.7, 0.7, 0.7, 0.7, x])  # round 1 is outside the last 5
        write_run(runs, "fedgam", seed, [0.9, 0.8, 0.8, 0.8, 0.8, y])
    cells = claim_row(section(mr.make_results(exps, results, tmp_path / "r.md"), "c"), "fedgam > fedavg")
    # final: -0.05, +0.02, +0.01: mean -0.00667, sd 0.037859, half 4.303 * 0.037859 / sqrt(3) = 0.094055
    assert cells[3:6] == ["-0.0067 [-0.1007, +0.0874]", "3", "**undecided**"]
    # last 5: (4 x 0.10 + final difference) / 5 = 0.070, 0.084, 0.082: mean 0.078667, sd 0.0075719,
    # half 4.303 * 0.0075719 / sqrt(3) = 0.018811
    assert cells[6] == "+0.0787 [+0.0599, +0.0975] holds"


def test_each_table_names_the_code_revisions_of_its_runs(tmp_path):
    """A table completed with a later seed mixes code revisions: the section says which, with
    run counts (two uncommitted states of one commit apart, by their app digest), and counts the
    runs that recorded none."""
    runs = tmp_path / "runs"
    dirty = ["b" * 40 + "+dirty.0123456789ab", "b" * 40 + "+dirty.ba9876543210"]  # two uncommitted states
    for seed, revision in enumerate(["a" * 40, "a" * 40, *dirty, None]):
        write_run(runs, "fedavg", seed, [0.5])
        summary = json.loads((runs / f"fedavg-seed{seed}" / "summary.json").read_text())
        summary["code_revision"] = revision or "unknown"
        (runs / f"fedavg-seed{seed}" / "summary.json").write_text(json.dumps(summary))
    line = mr.provenance_line(sorted(runs.iterdir()))[0]
    assert line.startswith("Code that made the kept runs (git revision): `aaaaaaa` (2 runs), "
                           "`bbbbbbb+dirty.0123456789ab` (1 runs), `bbbbbbb+dirty.ba9876543210` (1 runs), "
                           "not recorded (1 runs")
    assert mr.provenance_line([]) == []


def test_bad_claim_is_one_clear_error():
    from runner.results.stats import parse_claims

    with pytest.raises(ValueError, match=r"names 'fedsoll', not a row of the experiment; valid: \['fedavg'"):
        parse_claims(["fedsoll > fedavg"], ["fedavg", "fedsol"])
    with pytest.raises(ValueError, match="is invalid: write"):
        parse_claims(["fedsol beats fedavg"], ["fedavg", "fedsol"])


def test_not_run_yet_and_figures(report, tmp_path):
    text, out = report
    ghost = section(text, "ghost")
    assert "**not run yet.**" in ghost
    assert "0.9800" not in ghost and "|" not in ghost  # no table, no invented numbers
    assert "Findings:" not in ghost  # the ghost file has none; a file's own findings text is shown
    assert "| [ghost](#ghost) | Ghost (Poe et al. 2022), Table 3 | 0/4 | not run yet |" in text
    assert "| [toy](#toy) |" in text and "| 6/8 | partial |" in text
    assert "| 2/2 | complete |" in text
    assert (out.parent / "results" / "toy-accuracy.png").stat().st_size > 0
    assert (out.parent / "results" / "bestcell-accuracy.png").exists()
    assert not (out.parent / "results" / "ghost-accuracy.png").exists()
    assert "![toy accuracy](results/toy-accuracy.png)" in text
    # The order of PROPOSED: fedpgvc before fedsol before fedgam.
    assert text.index("## bestcell") < text.index("## toy") < text.index("## ghost")


def test_real_experiment_files_are_valid(tmp_path):
    """Every experiments/*.toml builds its full list of run configs (no unknown keys or values)."""
    from runner import checks, cli

    files = sorted((ROOT / "experiments").glob("*.toml"))
    assert files
    for f in files:
        args = cli.parse_args(["--config", str(f)])
        configs = checks.build_configs(args, tmp_path)
        exp = args.experiment
        rows = mr.experiment_rows(exp)
        assert len(configs) == len(rows) * len(exp["seeds"])
        assert [(row, seed) for row, seed, _ in configs] == [(row, s) for row, _, _ in rows for s in exp["seeds"]]
        assert exp["reduction"]
        labels = [row for row, _, _ in rows]
        if exp.get("grid") and "claims" not in exp:  # a search: one seed per point, no paper cell
            assert "paper-results" not in exp
            continue
        # a paper's table, or a paper's grid table (FedGAM Tables 4-5: paper cells keyed by row label)
        assert len(exp["seeds"]) >= 3  # every table over at least 3 seeds
        assert set(exp["paper-results"]) <= set(labels)
        assert mr.experiment_claims(exp, labels)
        assert 0 < exp["target-accuracy"] < 1


def test_rerun_refuses_runs_made_with_another_config(tmp_path):
    """A finished run (summary.json) or a started one (run-config.json) whose config differs from
    the one asked now is named with the differing key, so a sweep never mixes two experiments."""
    import json

    from fl_app.registry import validate_config
    from runner import checks, cli

    args = cli.parse_args(["--strategy", "fedavg,fedprox", "--dataset", "synthetic", "--rounds", "3", "--set", "model=logreg"])
    configs = checks.build_configs(args, tmp_path)
    assert checks.changed_runs(configs, tmp_path) == []  # nothing there yet

    same = validate_config({**configs[0][2], "resume": True})  # resumed runs record resume = true
    (tmp_path / "fedavg-seed0").mkdir()
    (tmp_path / "fedavg-seed0" / "summary.json").write_text(json.dumps({"config": same}))
    assert checks.changed_runs(configs, tmp_path) == []

    other = validate_config({**configs[1][2], "num-server-rounds": 2})
    (tmp_path / "fedprox-seed0").mkdir()
    (tmp_path / "fedprox-seed0" / "run-config.json").write_text(json.dumps(other))
    problems = checks.changed_runs(configs, tmp_path)
    assert len(problems) == 1 and "fedprox-seed0" in problems[0] and "num-server-rounds 2 -> 3" in problems[0]


def test_rerun_refuses_an_old_run_for_a_key_added_after_it_unless_asked_at_its_default(tmp_path):
    """A run made before a key existed recorded no value for it; it ran as the key's default.
    Asking for another value now is a change (it was kept silently before), the default is not."""
    import json

    from fl_app.registry import validate_config
    from runner import checks, cli

    base = ["--strategy", "dp-fedavg", "--dataset", "synthetic", "--rounds", "3", "--set", "model=logreg"]
    configs = checks.build_configs(cli.parse_args(base), tmp_path)
    old = validate_config(configs[0][2])
    del old["dp-noise-seeded"]  # as recorded by the code before the key was added
    (tmp_path / "dp-fedavg-seed0").mkdir()
    (tmp_path / "dp-fedavg-seed0" / "summary.json").write_text(json.dumps({"config": old}))
    assert checks.changed_runs(configs, tmp_path) == []
    seeded = checks.build_configs(cli.parse_args([*base, "--set", "dp-noise-seeded=true"]), tmp_path)
    problems = checks.changed_runs(seeded, tmp_path)
    assert len(problems) == 1 and "dp-noise-seeded False -> True" in problems[0]


SEARCH = """
name = "search"
paper = "Search (Doe 2020), Sec. 5"
reduction = "one seed"
strategies = ["fedavg", "fedavg-slow"]
seeds = [0]
clients = 10

[grid]
learning-rate = [0.01, 0.05]

[methods.fedavg-slow]
strategy = "fedavg"
local-epochs = 1
"""


def test_grid_and_variant_rows_and_the_chosen_point(tmp_path):
    """A grid's rows are labelled as the runner labels them (its folders included), a variant
    (another label of one method) is a row of its own, and the best point per label is named."""
    exps, results = tmp_path / "experiments", tmp_path / "results"
    exps.mkdir()
    (exps / "search.toml").write_text(SEARCH)
    runs = results / "search" / "runs"
    write_run(runs, "fedavg", 0, [0.5, 0.6], folder="fedavg_learning-rate=0.01-seed0")
    write_run(runs, "fedavg", 0, [0.5, 0.7], folder="fedavg_learning-rate=0.05-seed0")
    write_run(runs, "fedavg", 0, [0.5, 0.8], folder="fedavg-slow_learning-rate=0.01-seed0")  # a variant of fedavg
    text = mr.make_results(exps, results, tmp_path / "docs" / "results.md")
    sec = section(text, "search")
    assert row(sec, "fedavg[learning-rate=0.05]")[2] == "0.7000"
    assert row(sec, "fedavg-slow[learning-rate=0.01]")[2] == "0.8000"
    assert row(sec, "fedavg-slow[learning-rate=0.05]")[1] == "not run yet"
    assert "- fedavg: **[learning-rate=0.05]** (best accuracy 0.7000; [learning-rate=0.01] 0.6000)" in sec
    assert "- fedavg-slow: **[learning-rate=0.01]** (best accuracy 0.8000)" in sec
    assert "| 3/4 | partial |" in text


def test_collect_keeps_finished_runs_without_machine_paths(tmp_path):
    """--collect copies metrics.csv and summary.json of finished runs into the store, blanks the
    machine's folders, skips unfinished runs; the report then reads the store's flat layout."""
    exps, source, store = tmp_path / "experiments", tmp_path / "results", tmp_path / "store"
    exps.mkdir()
    (exps / "toy.toml").write_text(TOY)
    runs = source / "toy" / "runs"
    write_run(runs, "fedavg", 0, [0.2, 0.5, 0.6])
    (runs / "fedavg-seed0" / "checkpoint.npz").write_bytes(b"x")
    write_run(runs, "fedntd", 0, [0.9], finished=False)
    summary = json.loads((runs / "fedavg-seed0" / "summary.json").read_text())
    summary["config"].update({"data-dir": "/machine/data", "results-dir": "/machine/results"})
    summary.update(num_clients=10, config=validate_config({**summary["config"], "num-server-rounds": 3}))
    (runs / "fedavg-seed0" / "summary.json").write_text(json.dumps(summary))  # the settings TOY fixes
    assert mr.main(["--experiments", str(exps), "--results", str(store), "--collect", str(source),
                    "--out", str(tmp_path / "docs" / "results.md")]) == 0
    kept = store / "toy" / "fedavg-seed0"
    assert sorted(p.name for p in kept.iterdir()) == ["metrics.csv", "summary.json"]
    assert not (store / "toy" / "fedntd-seed0").exists()
    text = json.dumps(json.loads((kept / "summary.json").read_text()))
    assert "/machine" not in text
    assert row(section((tmp_path / "docs" / "results.md").read_text(), "toy"), "fedavg")[2] == "0.6000"


def test_client_accuracy_column_when_clients_evaluated(tmp_path):
    """Runs with per-client evaluation (client-test-fraction) add the clients' final mean / std /
    worst-10% accuracy, each the mean over seeds; experiments without them keep the old table."""
    exps, results = tmp_path / "experiments", tmp_path / "results"
    exps.mkdir()
    (exps / "g.toml").write_text(GHOST.replace('name = "ghost"', 'name = "g"'))
    runs = results / "g" / "runs"
    for seed, (mean, std, worst) in enumerate([(0.8, 0.1, 0.6), (0.9, 0.2, 0.7)]):
        for method in ("fedavg", "fedgam"):
            d = runs / f"{method}-seed{seed}"
            write_run(runs, method, seed, [0.5, 0.6])
            text = (d / "metrics.csv").read_text().splitlines()
            text[0] += ",client_accuracy_mean,client_accuracy_std,client_accuracy_worst10"
            text[1] += ",0.1,0.1,0.1"
            text[2] += f",{mean},{std},{worst}"
            (d / "metrics.csv").write_text("\n".join(text) + "\n")
    sec = section(mr.make_results(exps, results, tmp_path / "r.md"), "g")
    assert "client accuracy, local test splits (final): mean / std / worst 10%" in sec
    assert row(sec, "fedavg")[-1] == "0.8500 / 0.1500 / 0.6500"


def test_no_client_accuracy_column_without_client_evaluation(report):
    assert "client accuracy" not in report[0]


def test_budget_fraction_by_hand(tmp_path):
    """rounds x local epochs x participation, summed over grid points, against experiments/paper/."""
    exp = {"run-config": {"num-server-rounds": 15, "fraction-fit": 0.1}, "grid": {"local-epochs": [1, 2, 3, 4]}}
    assert mr.budget(exp) == pytest.approx(15 * 0.1 * (1 + 2 + 3 + 4))
    (tmp_path / "paper").mkdir()
    (tmp_path / "paper" / "x.toml").write_text('seeds = [0, 1, 2]\n[run-config]\nnum-server-rounds = 100\n'
                                               'fraction-fit = 1.0\n[grid]\nlocal-epochs = [5, 10, 15, 20]\n')
    line = mr.budget_line(tmp_path / "x.toml", {**exp, "seeds": [0, 1]})[0]
    # ours 15, the paper's 100 x 1.0 x 50 = 5000: 0.003
    assert "15 against the paper's 5000" in line and "**0.003 of the paper's**" in line and "seeds 2 (paper file: 3)" in line
    assert mr.budget_line(tmp_path / "y.toml", exp) == []  # no paper file: no line


def test_paper_settings_exist_and_build(tmp_path):
    """Every reproduced table has its paper's exact setting in experiments/paper/, and each
    builds its full list of run configs, as `run_simulation.py --check --config FILE` does."""
    from runner import checks, cli

    tables = [f for f in (ROOT / "experiments").glob("*.toml") if "claims" in tomllib.loads(f.read_text())]
    assert tables
    for f in tables:
        paper = ROOT / "experiments" / "paper" / f.name
        assert paper.is_file(), f"no paper setting for {f.name}"
        args = cli.parse_args(["--config", str(paper)])
        configs = checks.build_configs(args, tmp_path)
        assert len(configs) == len(mr.experiment_rows(args.experiment)) * len(args.experiment["seeds"])
        assert args.experiment["name"] == f"paper-{f.stem}"


def test_runs_of_an_earlier_budget_are_counted_apart(tmp_path):
    exps, results = tmp_path / "experiments", tmp_path / "results"
    exps.mkdir()
    (exps / "g.toml").write_text(GHOST.replace('name = "ghost"', 'name = "g"') + "\n[run-config]\nnum-server-rounds = 3\n")
    runs = results / "g" / "runs"
    write_run(runs, "fedavg", 0, [0.5, 0.6, 0.7])
    write_run(runs, "fedgam", 0, [0.5, 0.6])
    summary = json.loads((runs / "fedgam-seed0" / "summary.json").read_text())
    summary["config"]["num-server-rounds"] = 2  # made when the file planned 2 rounds
    (runs / "fedgam-seed0" / "summary.json").write_text(json.dumps(summary))
    text = mr.make_results(exps, results, tmp_path / "r.md")
    line = next(l for l in text.splitlines() if l.startswith("| [g]"))
    assert "| 1/4 | partial (1 more runs from an earlier setting) |" in line
    # The section never mixes the two settings: the earlier run is left out of its tables and said so.
    sec = section(text, "g")
    assert row(sec, "fedavg")[8:10] == ["1", "3"]
    assert row(sec, "fedgam")[1] == "not run yet"
    assert ("Left out: 1 kept runs made with an earlier setting of this file (e.g. num-server-rounds = 2, the "
            "file fixes 3)") in sec
    assert line.split(" | ")[4] == "1 not run yet"  # the claim fedgam > fedavg has no fedgam run of this setting


def test_a_key_added_after_a_run_counts_as_its_default_for_that_run(tmp_path):
    """A run made before a run-config key existed did not record it and ran with what its
    default does: a file that now sets the key to another value never shows that run as its
    result (feddc-mnist-dir03's runs before local-clip-norm = 10), one that sets the default
    still does."""
    exps, results = tmp_path / "experiments", tmp_path / "results"
    exps.mkdir()
    runs = results / "g" / "runs"
    for method in ("fedavg", "fedgam"):
        write_run(runs, method, 0, [0.5, 0.6, 0.7])
        summary = json.loads((runs / f"{method}-seed0" / "summary.json").read_text())
        summary["config"]["num-server-rounds"] = 3  # a whole config, made before the key existed
        (runs / f"{method}-seed0" / "summary.json").write_text(json.dumps(summary))
    base = GHOST.replace('name = "ghost"', 'name = "g"') + "\n[run-config]\nnum-server-rounds = 3\n"
    (exps / "g.toml").write_text(base + "local-clip-norm = 10.0\n")
    sec = section(mr.make_results(exps, results, tmp_path / "r.md"), "g")
    assert "**Earlier setting.** All 2 kept runs were made with an earlier setting" in sec
    assert "local-clip-norm = 0.0 (not a key then), the file fixes 10.0" in sec
    (exps / "g.toml").write_text(base + "local-clip-norm = 0.0\n")
    sec = section(mr.make_results(exps, results, tmp_path / "r.md"), "g")
    assert "Earlier setting" not in sec and "Left out" not in sec


def test_a_section_whose_runs_all_predate_the_files_setting_shows_them_as_such(tmp_path):
    """A raised budget not yet re-run: the earlier runs are the only results there are; the
    section shows them, under a line that says they are not a result of the plan."""
    exps, results = tmp_path / "experiments", tmp_path / "results"
    exps.mkdir()
    (exps / "g.toml").write_text(GHOST.replace('name = "ghost"', 'name = "g"') + "\n[run-config]\nnum-server-rounds = 3\n")
    runs = results / "g" / "runs"
    for method in ("fedavg", "fedgam"):
        write_run(runs, method, 0, [0.5, 0.6])
        summary = json.loads((runs / f"{method}-seed0" / "summary.json").read_text())
        summary["config"]["num-server-rounds"] = 2
        (runs / f"{method}-seed0" / "summary.json").write_text(json.dumps(summary))
    text = mr.make_results(exps, results, tmp_path / "r.md")
    sec = section(text, "g")
    assert ("**Earlier setting.** All 2 kept runs were made with an earlier setting of this file (e.g. "
            "num-server-rounds = 2, the file fixes 3)") in sec
    assert row(sec, "fedavg")[8:10] == ["1", "2"] and row(sec, "fedgam")[8:10] == ["1", "2"]
    line = next(l for l in text.splitlines() if l.startswith("| [g]"))
    assert "| 0/4 | partial (2 more runs from an earlier setting) |" in line


def test_experiment_target_reaches_every_run_and_never_makes_a_kept_run_stale(tmp_path):
    """An experiment file's top-level target-accuracy becomes each run's run-config key (so the
    runner's comparison.md shows rounds to it, as docs/results.md does), and a run kept from
    before the key existed, or made with another target, is not a changed run: the target only
    reads the accuracies afterwards."""
    import json

    from fl_app.registry import validate_config
    from runner import checks, cli

    f = ROOT / "experiments" / "fedgam-mnist-dir03.toml"
    args = cli.parse_args(["--config", str(f)])
    configs = checks.build_configs(args, tmp_path)
    target = args.experiment["target-accuracy"]
    assert {raw["target-accuracy"] for _, _, raw in configs} == {target}
    row, seed, raw = configs[0]
    other = validate_config({**raw, "target-accuracy": 0.5 if target != 0.5 else 0.6})
    (tmp_path / raw["run-name"]).mkdir()
    (tmp_path / raw["run-name"] / "run-config.json").write_text(json.dumps(other))
    assert checks.changed_runs(configs[:1], tmp_path) == []


# ---- docs/results.md itself: each row's protocol named, claims counted only between rows tuned alike ----

RESULTS_PAGE = ROOT / "docs" / "results.md"


def _sections(text: str) -> dict[str, str]:
    return {part.split("\n", 1)[0]: part for part in text.split("\n## ")[1:]}


def page_problems(text: str) -> list[str]:
    """What docs/results.md gets wrong about tuning: a results table without its tuning column, a
    tuning label without a legend line, a claim counted between rows of two protocols, of an
    unknown one or of a search on the test split, or a not-counted claim with a bare verdict."""
    from runner.tuning import NOT_RECORDED

    problems = []
    for name, sec in _sections(text).items():
        lines = sec.splitlines()
        legend = dict(line[2:].split(": ", 1) for line in lines if line[:3] == "- P" and ": " in line)
        header = next((line for line in lines if line.startswith("| method | final accuracy |")), None)
        if header is None:
            continue  # not run yet: no table
        cells = [c.strip() for c in header.strip("|").split("|")]
        if "tuning" not in cells:
            problems.append(f"{name}: results table without a tuning column")
            continue
        col = cells.index("tuning")
        table = [line for line in lines if line.startswith("| ") and not line.startswith(("| method", "| claim"))
                 and len(line.strip("|").split("|")) == len(cells)]
        for line in table:
            label = line.strip("|").split("|")[col].strip()
            if label not in legend:
                problems.append(f"{name}: row {line.split('|')[1].strip()} has tuning {label!r}, not in the legend")
        start = next((i for i, line in enumerate(lines) if line.startswith("| claim | source |")), None)
        for line in lines[start + 2:] if start is not None else []:
            if not line.startswith("| "):
                break
            cl = [c.strip() for c in line.strip("|").split("|")]
            claim, verdict, tail, (pa, pb) = cl[0], cl[5], cl[6], cl[7].split(" / ")
            if verdict == mr.NOT_RUN:
                continue
            known = pa == pb and legend.get(pa) and legend[pa] != NOT_RECORDED and not legend[pa].startswith(
                ("mixed protocols", mr.TEST_SPLIT_SEARCH))
            if not known and not verdict.startswith(mr.NOT_COUNTED):
                problems.append(f"{name}: {claim} is counted ({verdict}) between {pa} and {pb}")
            if verdict.startswith(mr.NOT_COUNTED) and not (verdict.endswith("if counted)") and
                                                           (tail == "-" or tail.endswith("if counted)"))):
                problems.append(f"{name}: {claim} is not counted but reads a verdict: {verdict} / {tail}")
    return problems


def test_the_page_check_finds_a_claim_counted_between_rows_tuned_differently():
    """page_problems can fail: a counted claim between P1 and P2, a label without a legend line,
    a not-counted claim with a bare tail verdict, a table without a tuning column."""
    good = ("# r\n\n## x\n\n| method | final accuracy | seeds | tuning |\n|---|---|---|---|\n| a | 0.5 | 3 | P1 |\n"
            "| b | 0.4 | 3 | P2 |\n\n- P1: fixed from the paper\n- P2: project default\n\n"
            "| claim | source | paper | difference | n | verdict | last 5 | tuning (better / worse) |\n|---|---|---|---|---|---|---|---|\n"
            "| a > b | T1 | +0.1 | +0.1 [0.05, 0.15] | 3 | not counted: a and b were tuned differently (holds if counted)"
            " | +0.1 [0.05, 0.15] (holds if counted) | P1 / P2 |\n")
    assert page_problems(good) == []
    counted = good.replace("not counted: a and b were tuned differently (holds if counted)", "**holds**")
    assert page_problems(counted) == ["x: a > b is counted (**holds**) between P1 and P2"]
    assert "reads a verdict" in page_problems(good.replace("(holds if counted) | P1", "holds | P1"))[0]
    assert "not in the legend" in page_problems(good.replace("| b | 0.4 | 3 | P2 |", "| b | 0.4 | 3 | P3 |"))[0]
    assert page_problems(good.replace("| tuning |\n", "| rounds |\n", 1)) == ["x: results table without a tuning column"]
    test_split = good.replace("- P2: project default", f"- P2: {mr.TEST_SPLIT_SEARCH}").replace("P1 / P2", "P2 / P2")
    assert page_problems(test_split.replace("not counted: a and b were tuned differently (holds if counted)",
                                            "**holds**")) == ["x: a > b is counted (**holds**) between P2 and P2"]


def test_the_results_page_names_every_rows_protocol_and_counts_claims_only_between_rows_tuned_alike():
    text = RESULTS_PAGE.read_text()
    assert page_problems(text) == []
    assert text.count("| claim | source |") >= 10  # the check read the claims tables


def test_the_results_page_is_what_make_results_writes_from_the_kept_runs(tmp_path):
    """docs/results.md and docs/atlas.md (written with it, from the same rows) are generated:
    regenerating them from experiments/ and the kept runs gives the committed texts and the
    atlas's picture (else run `python scripts/make_results.py` and commit the result). One
    regeneration for both pages: it reads every kept run (about 25 s)."""
    out = tmp_path / "docs" / "results.md"
    assert mr.make_results(ROOT / "experiments", mr.STORE, out) == RESULTS_PAGE.read_text()
    assert (tmp_path / "docs" / "atlas.md").read_text() == (ROOT / "docs" / "atlas.md").read_text()
    assert (tmp_path / "docs" / "results" / "atlas.png").is_file()


def test_every_file_with_claims_says_how_each_rows_values_were_chosen():
    """Every experiment file with claims (experiments/ and experiments/paper/) carries a
    [tune] table (one protocol for its rows) or a [chosen-by] statement that covers every row
    (``all`` or the row itself), so docs/results.md can name each row's protocol."""
    from runner.experiment import read_experiment
    from runner.tuning import read_protocol

    files = sorted((ROOT / "experiments").glob("*.toml")) + sorted((ROOT / "experiments" / "paper").glob("*.toml"))
    missing = []
    for path in files:
        exp = read_experiment(path)
        if not exp.get("claims"):
            continue
        rows = list(exp["strategies"])
        protocol = read_protocol(exp, rows, path)
        stated = exp.get("chosen-by", {})
        for name in rows:
            tuned = protocol is not None and (name in protocol.grids or name in protocol.untuned)
            if not (tuned or name in stated or "all" in stated):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing
