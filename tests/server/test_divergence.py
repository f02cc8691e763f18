"""A diverged run reads as diverged: the one detector of
``fl_app/common/divergence.py`` on hand-built per-round series, summary.json's ``status``, the
comparison's rows (comparison.md/.csv, the terminal summary) for new and older kept runs alike,
and the tuning search, which never chooses a diverged point over one that did not diverge.

No training: every run here is a few hand-written rows."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from fl_app.common.divergence import divergence


def rows_of(accs, losses=None, **columns):
    """metrics.csv rows (as read_metrics gives them): round, test_accuracy, train_loss and any
    further column given as a list of per-round values."""
    losses = losses if losses is not None else [1.0] * len(accs)
    out = []
    for i, (acc, loss) in enumerate(zip(accs, losses)):
        row = {"round": i + 1, "test_accuracy": acc, "train_loss": loss, "num_clients": 10, "num_failures": 0}
        row.update({k: v[i] for k, v in columns.items()})
        out.append(row)
    return out


# A diverged SCAFFOLD run (NIID-Bench #C = 2, lr 0.01, momentum 0.9): it peaks at 0.765, its control
# variates grow from 0.05 to 6.6e7 and its accuracy ends at chance; the loss stays moderate.
SCAFFOLD_ACCS = [0.35, 0.55, 0.70, 0.765, 0.60, 0.31, 0.12, 0.10, 0.10, 0.10]
SCAFFOLD_LOSS = [1.2, 0.9, 0.7, 0.6, 0.9, 1.8, 2.2, 2.3, 2.3, 2.3]
SCAFFOLD_CV = [0.05, 0.07, 0.09, 0.12, 0.8, 40.0, 3e3, 2e5, 6e6, 6.6e7]

# A healthy label-skewed run: it swings by tens of points from round to round (down at chance in
# round 5 and in its last round), its control variates grow 20 x over the run.
NOISY_ACCS = [0.18, 0.35, 0.22, 0.41, 0.10, 0.38, 0.45, 0.29, 0.47, 0.10]
NOISY_LOSS = [0.30, 0.55, 0.41, 0.62, 0.70, 0.48, 0.52, 0.66, 0.44, 0.58]
NOISY_CV = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.9, 1.0]

# A run that never learnt (a rate far too big from the start): always at chance.
NEVER_ACCS = [0.10, 0.098, 0.11, 0.101, 0.10, 0.099]
NEVER_LOSS = [4.4, 2.4, 2.3, 2.31, 2.3, 2.3]


def test_the_issue_scaffold_run_is_flagged_by_its_control_variates_in_the_round_they_blew_up():
    why = divergence(rows_of(SCAFFOLD_ACCS, SCAFFOLD_LOSS, cv_norm=SCAFFOLD_CV), 10)
    assert why is not None
    # 0.09 is the largest of the first 3 rounds; 1000 x that is 90, first passed in round 7 (3e3)
    assert (why["signal"], why["round"], why["column"]) == ("state_norm", 7, "cv_norm")
    assert why["value"] == 3e3 and why["reference"] == 0.09 and math.isclose(why["bound"], 90.0)
    assert "cv_norm" in why["text"] and "round 7" in why["text"]
    assert why["signals"] == ["state_norm", "accuracy"]
    json.dumps(why)  # goes into summary.json as it is


def test_each_signal_alone_names_its_round_and_values():
    # accuracy only (no state column, loss moderate): back at chance from round 7 after 0.765 in round 4
    why = divergence(rows_of(SCAFFOLD_ACCS, SCAFFOLD_LOSS), 10)
    assert (why["signal"], why["round"], why["best_round"]) == ("accuracy", 7, 4)
    assert why["best_accuracy"] == 0.765 and why["value"] == 0.10 and why["chance"] == 0.1
    # training loss: 10 x max(first round 1.2, ln 10) = 23.0; NaN counts at once
    blown = divergence(rows_of([0.5, 0.6, 0.65, 0.7], [1.2, 1.0, 30.0, 1e9]), 10)
    assert (blown["signal"], blown["round"], blown["value"]) == ("train_loss", 3, 30.0)
    assert math.isclose(blown["bound"], 10 * math.log(10))
    nan = divergence(rows_of([0.5, 0.6, 0.65, 0.7], [1.2, 1.0, float("nan"), 0.9]), 10)
    assert (nan["signal"], nan["round"]) == ("train_loss", 3) and "not finite" in nan["text"]
    # a client-mean state norm that overflowed to inf (the unclipped FedDC runs)
    inf = divergence(rows_of([0.5, 0.6, 0.65, 0.7], feddc_h_norm_mean=[1.5, 1.6, float("inf"), 2.0]), 10)
    assert (inf["signal"], inf["round"], inf["column"]) == ("state_norm", 3, "feddc_h_norm_mean")


def test_a_healthy_noisy_run_and_a_run_that_never_learnt_are_not_diverged():
    assert divergence(rows_of(NOISY_ACCS, NOISY_LOSS, cv_norm=NOISY_CV, ci_norm_mean=NOISY_CV), 10) is None
    assert divergence(rows_of(NEVER_ACCS, NEVER_LOSS), 10) is None
    # a first round that fits one-class clients almost perfectly does not make later losses a blow-up
    assert divergence(rows_of([0.3, 0.5, 0.6, 0.62], [0.01, 0.4, 0.9, 0.7]), 10) is None
    # the server's own update diagnostics are not a state: a step that grows is not divergence
    assert divergence(rows_of([0.3, 0.5, 0.6, 0.62], step_norm=[0.01, 5.0, 50.0, 80.0],
                              drift_norm_mean=[0.01, 5.0, 50.0, 80.0]), 10) is None
    # empty cells as the server keeps them ('') and rounds that were not evaluated are skipped
    sparse = rows_of(["", 0.5, "", 0.6], ["", 0.9, 0.8, 0.7], cv_norm=["", 0.1, 0.2, 0.3])
    assert divergence(sparse, 10) is None


def test_chance_is_one_over_the_classes():
    # 100 classes: 0.30 -> 0.012 is a fall to chance (0.01); 10 classes: 0.30 -> 0.15 is not
    assert divergence(rows_of([0.2, 0.30, 0.015, 0.012]), 100)["signal"] == "accuracy"
    assert divergence(rows_of([0.2, 0.30, 0.16, 0.15]), 10) is None


def test_the_kept_unclipped_feddc_run_that_fell_in_its_last_two_rounds_is_flagged():
    """A kept unclipped FedDC run (feddc-mnist-dir03/feddc-seed1): 0.966 in round 38, then 0.159
    and 0.116, its loss only 9.6 (below the loss bound): the accuracy signal catches it."""
    accs = [0.97, 0.973, 0.961, 0.966, 0.159, 0.116]
    losses = [0.1, 0.08, 0.7, 0.11, 9.59, 2.37]
    why = divergence(rows_of(accs, [1.06] + losses[1:]), 10)
    assert (why["signal"], why["round"]) == ("accuracy", 5)


# ---- summary.json ------------------------------------------------------------------------------

def summary_of(tmp_path: Path, name: str, rows: list[dict], stopped: str | None = None) -> dict:
    from fl_app.registry import validate_config
    from fl_app.server.recording import RunRecorder

    record = RunRecorder(validate_config({"dataset": "mnist", "model": "lenet"}), tmp_path / name)
    record.fingerprint = {}  # no data here: not recorded
    for row in rows:
        record.write_row(row)
    record.write_summary(None, stopped=stopped)
    return json.loads((tmp_path / name / "summary.json").read_text())


def test_summary_says_diverged_with_the_reason_else_completed_or_stopped(tmp_path):
    diverged = summary_of(tmp_path, "scaffold-seed0", rows_of(SCAFFOLD_ACCS, SCAFFOLD_LOSS, cv_norm=SCAFFOLD_CV))
    assert diverged["status"] == "diverged" and diverged["stopped"] is None
    assert (diverged["diverged"]["signal"], diverged["diverged"]["round"]) == ("state_norm", 7)
    healthy = summary_of(tmp_path, "fedavg-seed0", rows_of(NOISY_ACCS, NOISY_LOSS, cv_norm=NOISY_CV))
    assert healthy["status"] == "completed" and healthy["diverged"] is None
    never = summary_of(tmp_path, "fedavg-seed1", rows_of(NEVER_ACCS, NEVER_LOSS))
    assert never["status"] == "completed" and never["diverged"] is None
    stopped = summary_of(tmp_path, "fedavg-seed2", rows_of([0.3, 0.5]), stopped="round 3: too few updates")
    assert stopped["status"] == "stopped" and stopped["stopped"] == "round 3: too few updates"
    # a run the server stopped because its updates were no longer finite, after it blew up
    both = summary_of(tmp_path, "scaffold-seed1", rows_of(SCAFFOLD_ACCS[:8], SCAFFOLD_LOSS[:8],
                                                          cv_norm=SCAFFOLD_CV[:8]), stopped="round 9: 0 usable")
    assert both["status"] == "diverged" and both["stopped"] == "round 9: 0 usable"


# ---- the comparison's rows ---------------------------------------------------------------------

def kept_run(folder: Path, accs, losses=None, summary_extra: dict | None = None, **columns) -> Path:
    """A finished run as an older kept one: metrics.csv and a summary.json without ``status``."""
    folder.mkdir(parents=True)
    rows = rows_of(accs, losses, **columns)
    with (folder / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    seed = int(folder.name.rsplit("seed", 1)[1])
    (folder / "summary.json").write_text(json.dumps({
        "config": {"dataset": "mnist", "seed": seed, "strategy": folder.name.split("-")[0]},
        "rounds": len(accs), "final_accuracy": accs[-1], "best_accuracy": max(accs), "final_loss": 1.0,
        "total_seconds": 5.0, "stopped": None, **(summary_extra or {})}))
    return folder


def test_a_diverged_run_marks_its_row_in_comparison_md_csv_and_the_terminal(tmp_path):
    from runner.results.report import compare, terminal_summary, write_comparison

    runs = {"fedavg": [kept_run(tmp_path / "fedavg-seed0", NOISY_ACCS, NOISY_LOSS),
                       kept_run(tmp_path / "fedavg-seed1", NEVER_ACCS, NEVER_LOSS)],
            "scaffold": [kept_run(tmp_path / "scaffold-seed0", SCAFFOLD_ACCS, SCAFFOLD_LOSS, cv_norm=SCAFFOLD_CV),
                         kept_run(tmp_path / "scaffold-seed1", NOISY_ACCS, NOISY_LOSS, cv_norm=NOISY_CV)]}
    table = compare(runs)
    rows = {r["method"]: r for r in table}
    assert rows["fedavg"]["diverged_runs"] == 0 and rows["fedavg"]["diverged"] == ""
    assert rows["scaffold"]["diverged_runs"] == 1
    assert rows["scaffold"]["diverged"].startswith("scaffold-seed0: diverged in round 7: cv_norm")
    out = tmp_path / "out"
    write_comparison(table, out)
    md = (out / "comparison.md").read_text()
    assert "| scaffold (!) |" in md and "(diverged: 1/2 seeds)" in md and "| fedavg |" in md
    assert "runs that diverged" in md and "scaffold-seed0: diverged in round 7" in md
    with (out / "comparison.csv").open() as f:
        csv_rows = {r["method"]: r for r in csv.DictReader(f)}
    assert csv_rows["scaffold"]["diverged_runs"] == "1" and "cv_norm" in csv_rows["scaffold"]["diverged"]
    text = terminal_summary(table, out)
    assert "| scaffold (!) |" in text and "(diverged: 1/2 seeds)" in text and "scaffold-seed0: diverged" in text


def test_a_run_without_metrics_is_judged_by_its_summary(tmp_path):
    from runner.results.report import diverged_runs

    reason = {"signal": "accuracy", "round": 5, "text": "test accuracy back at chance"}
    run = kept_run(tmp_path / "scaffold-seed0", [0.5, 0.6], summary_extra={"status": "diverged", "diverged": reason})
    (run / "metrics.csv").unlink()
    assert diverged_runs([run]) == ["scaffold-seed0: diverged in round 5: test accuracy back at chance"]


# ---- the tuning search -------------------------------------------------------------------------

def test_the_search_never_chooses_a_diverged_point_over_one_that_did_not_and_lists_it(tmp_path):
    """FedAvg's lr 0.1 peaks highest on the search's best-round metric, then blows up on seed 1:
    lr 0.03 (lower best, steady) is chosen, and the page marks and lists the diverged run."""
    from runner.plan import label, run_name
    from runner.tuning import Protocol, choose, diverged_points, tuning_lines, tuning_record

    protocol = Protocol((0, 1), 0.25, "best", 0.1, {"fedavg": {"learning-rate": [0.03, 0.1]}})
    steady, fast = label("fedavg", {"learning-rate": 0.03}), label("fedavg", {"learning-rate": 0.1})
    for seed in (0, 1):
        kept_run(tmp_path / run_name(steady, seed), [0.3, 0.5, 0.6, 0.62, 0.63])
    kept_run(tmp_path / run_name(fast, 0), [0.5, 0.8, 0.85, 0.86, 0.86])
    kept_run(tmp_path / run_name(fast, 1), [0.5, 0.8, 0.84, 0.11, 0.10])
    record = tuning_record(protocol, 20, tmp_path)
    points = record["rows"]["fedavg"]["points"]
    assert points[1]["mean"] > points[0]["mean"]  # the diverged point scores higher ...
    assert points[0]["diverged"] == [] and points[1]["diverged"][0].startswith(f"{run_name(fast, 1)}: diverged")
    assert record["rows"]["fedavg"]["chosen"] == {"learning-rate": 0.03}  # ... and is not chosen
    lines = tuning_lines(record)
    assert any("learning-rate=0.1: 0.8500 (diverged)" in line for line in lines)
    assert any(run_name(fast, 1) in line and "diverged" in line for line in diverged_points(record))
    # when every finished point diverged, the best of them (and the runner and page say so)
    both = [{"values": {"learning-rate": 0.1}, "mean": 0.8, "diverged": ["a"]},
            {"values": {"learning-rate": 0.3}, "mean": 0.7, "diverged": ["b"]}]
    assert choose(both) == {"learning-rate": 0.1}
    all_diverged = {"rows": {"fedavg": {"chosen": {"learning-rate": 0.1}, "points": both}}}
    assert any("every finished grid point diverged" in line for line in diverged_points(all_diverged))
