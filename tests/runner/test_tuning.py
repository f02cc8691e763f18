"""The tuning protocol (runner/tuning.py): the validation split held out of
the training data, the search's choice, the chosen values in the table's runs, make_results'
refusal to count a claim between rows tuned differently, and the [tune] table's errors.

No training: tiny parquet files whose rows carry an id (``uid``), fabricated run folders."""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import run_simulation
from fl_app.config import ConfigError
from fl_app.registry import validate_config
from fl_app.server.startup import ServerStartup
from runner import checks
from runner.experiment import read_experiment
from runner.plan import label, run_name
from runner.tuning import (
    NOT_RECORDED,
    Protocol,
    apply_choice,
    choose,
    edge_choices,
    plan_search,
    read_protocol,
    score_points,
    tuning_lines,
    tuning_record,
    write_tuning,
)
from tasks.catalogue import DATASETS
from tasks.datasets import to_tensors
from tasks.partition_spec import PartitionSpec
from tasks.partitioning import (
    VALIDATION,
    _partition_rows,
    federated_dataset,
    load_validation_split,
    train_rows,
    validation_size,
)
from tests.kit_runs import non_split_files

ROOT = Path(__file__).resolve().parents[2]
# the Hugging Face features the hub's MNIST parquet declares: the image column decodes as an image
HF_FEATURES = json.dumps({"info": {"features": {"image": {"_type": "Image"}, "label": {
    "names": [str(i) for i in range(10)], "_type": "ClassLabel"}, "uid": {"dtype": "int64", "_type": "Value"}}}})
TRAIN, TEST = 300, 60


def _png(array: np.ndarray) -> dict:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": None}


@pytest.fixture(scope="module")
def tiny_mnist(tmp_path_factory) -> Path:
    """A data folder mnist/{train,test}.parquet: 300 training rows (uid 0-299) and 60 test rows
    (uid 1000-1059), 28x28 images whose first pixel is the uid mod 256, labels 0-9."""
    folder = tmp_path_factory.mktemp("data")
    (folder / "mnist").mkdir()
    rng = np.random.default_rng(0)
    for split, uids in (("train", range(TRAIN)), ("test", range(1000, 1000 + TEST))):
        images = rng.integers(0, 256, size=(len(uids), 28, 28), dtype=np.uint8)
        images[:, 0, 0] = [u % 256 for u in uids]
        labels = np.array([u % 10 for u in uids], dtype=np.int64)
        cells = pa.array([_png(a) for a in images], pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        table = pa.table({"image": cells, "label": labels, "uid": list(uids)})
        pq.write_table(table.replace_schema_metadata({"huggingface": HF_FEATURES}), folder / "mnist" / f"{split}.parquet")
    return folder


# ---- the validation split -------------------------------------------------------------------

@pytest.mark.parametrize("partitioner", ["dirichlet", "iid"])
def test_validation_split_is_disjoint_from_test_and_from_every_partition(tiny_mnist, partitioner):
    spec = PartitionSpec("mnist", 4, partitioner, alpha=1.0, min_partition_size=5, seed=3,
                         data_dir=str(tiny_mnist), validation_fraction=0.2)
    fds = federated_dataset(spec)
    validation = list(fds.load_split(VALIDATION)["uid"])
    test = set(fds.load_split("test")["uid"])
    parts = [set(_partition_rows(spec, pid)["uid"]) for pid in range(4)]
    assert len(validation) == len(set(validation)) == validation_size(TRAIN, 0.2) == 60
    assert not set(validation) & test, "the validation split overlaps the test split"
    assert test == set(range(1000, 1000 + TEST)), "the test split is the test file's, whole"
    for pid, part in enumerate(parts):
        assert not part & set(validation), f"partition {pid} trains on validation rows"
    assert set().union(*parts) | set(validation) == set(range(TRAIN)), "a training row was lost"
    assert sum(len(p) for p in parts) == train_rows(spec) == TRAIN - 60
    assert validation != list(range(60)), "the validation rows are a seeded random sample, not the first rows"


def test_server_scores_the_clients_held_out_rows(tiny_mnist):
    """The server loads the validation split without the partitioning (iid, one partition) and
    gets the very rows the clients' partitioning held out; its tuning run scores them."""
    spec = PartitionSpec("mnist", 4, "dirichlet", alpha=1.0, min_partition_size=5, seed=3,
                         data_dir=str(tiny_mnist), validation_fraction=0.2)
    held_out = to_tensors(federated_dataset(spec).load_split(VALIDATION), DATASETS["mnist"])
    server = load_validation_split("mnist", str(tiny_mnist), 3, 0.2)
    assert torch.equal(server[0], held_out[0]) and torch.equal(server[1], held_out[1])
    cfg = validate_config({"dataset": "mnist", "data-dir": str(tiny_mnist), "seed": 3, "validation-fraction": 0.2})
    startup = ServerStartup(cfg, client_manager=None, data_dir=str(tiny_mnist))
    startup.begin()
    x, y = startup.prefetched.result()
    assert torch.equal(x, server[0]) and len(y) == 60
    plain = ServerStartup({**cfg, "validation-fraction": 0.0}, client_manager=None, data_dir=str(tiny_mnist))
    plain.begin()
    assert len(plain.prefetched.result()[1]) == TEST  # without the key: the test split, as before


def test_no_validation_fraction_keeps_every_training_row(tiny_mnist):
    spec = PartitionSpec("mnist", 3, "iid", seed=1, data_dir=str(tiny_mnist))
    assert sorted(u for pid in range(3) for u in _partition_rows(spec, pid)["uid"]) == list(range(TRAIN))
    assert "validation-fraction" not in spec.identity()  # earlier runs' fingerprints unchanged


def test_validation_fraction_is_refused_where_it_cannot_apply():
    with pytest.raises(ConfigError, match="'validation-fraction' = 0.1 needs an image dataset"):
        validate_config({"dataset": "synthetic", "model": "mlp", "validation-fraction": 0.1})
    with pytest.raises(ConfigError, match=r"'validation-fraction' = 0.6 is invalid: must be in \[0, 0.5\]"):
        validate_config({"validation-fraction": 0.6})


# ---- choosing -------------------------------------------------------------------------------

def test_choose_takes_the_highest_mean_first_on_ties_and_skips_unfinished_points():
    points = [{"values": {"learning-rate": 0.01}, "mean": 0.50},
              {"values": {"learning-rate": 0.03}, "mean": 0.70},
              {"values": {"learning-rate": 0.05}, "mean": None},
              {"values": {"learning-rate": 0.1}, "mean": 0.70}]
    assert choose(points) == {"learning-rate": 0.03}
    assert choose([{"values": {"learning-rate": 0.1}, "mean": None}]) is None


def write_run(runs: Path, row: str, seed: int, accs: list[float], protocol: str = "", lr: float | None = None,
              strategy: str | None = None) -> None:
    d = runs / run_name(row, seed)
    d.mkdir(parents=True)
    with (d / "metrics.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "test_accuracy", "test_loss", "train_loss", "num_clients", "round_seconds"])
        for r, a in enumerate(accs, 1):
            w.writerow([r, a, 1 - a, 0.5, 10, 1.0])
    config = {"strategy": strategy or row.split("[")[0], "seed": seed, "tuning-protocol": protocol}
    if lr is not None:
        config["learning-rate"] = lr
    (d / "summary.json").write_text(json.dumps({
        "config": config, "rounds": len(accs), "final_accuracy": accs[-1], "best_accuracy": max(accs),
        "final_loss": 0.1, "total_seconds": 5.0, "stopped": None}))


PEAKY = [0.2, 0.9, 0.5, 0.5, 0.5, 0.5, 0.5]  # best 0.9, last-5 mean 0.5
STEADY = [0.2, 0.6, 0.8, 0.8, 0.8, 0.8, 0.8]  # best 0.8, last-5 mean 0.8


@pytest.mark.parametrize("metric, chosen", [("last-5-mean", 0.01), ("best", 0.1), ("final", 0.01)])
def test_the_search_picks_the_argmax_of_its_metric_over_seeds(tmp_path, metric, chosen):
    protocol = Protocol((0, 1), 0.25, metric, 0.1, {"fedavg": {"learning-rate": [0.01, 0.1, 0.3]}})
    for seed in (0, 1):
        write_run(tmp_path, label("fedavg", {"learning-rate": 0.01}), seed, STEADY)
        write_run(tmp_path, label("fedavg", {"learning-rate": 0.1}), seed, PEAKY)
    write_run(tmp_path, label("fedavg", {"learning-rate": 0.3}), 0, [0.95] * 7)  # seed 1 missing: not compared
    points = score_points(protocol, tmp_path)["fedavg"]
    assert [p["mean"] for p in points][2] is None
    want = {"last-5-mean": (0.8, 0.5), "best": (0.8, 0.9), "final": (0.8, 0.5)}[metric]
    assert [p["mean"] for p in points][:2] == pytest.approx(list(want))
    record = tuning_record(protocol, 28, tmp_path)
    assert record["rows"]["fedavg"]["chosen"] == {"learning-rate": chosen}
    assert record["search-rounds"] == 7 and record["scored-on"] == "validation split"


def test_search_runs_whose_clients_failed_are_named_in_the_record_and_on_the_page(tmp_path):
    """A score from a run that lost clients (a FedBN client failing on a batch of one, say)
    comes from fewer clients than the point claims: the record names the runs, the page marks
    the point (!) and lists them."""
    protocol = Protocol((0,), 0.25, "best", 0.1, {"fedbn": {"learning-rate": [0.01, 0.1]}})
    write_run(tmp_path, label("fedbn", {"learning-rate": 0.01}), 0, STEADY)
    write_run(tmp_path, label("fedbn", {"learning-rate": 0.1}), 0, PEAKY)
    failing = tmp_path / run_name(label("fedbn", {"learning-rate": 0.1}), 0)
    rows = list(csv.DictReader((failing / "metrics.csv").open()))
    rows[1]["num_clients"], rows[1]["num_failures"] = 9, 1
    with (failing / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*rows[0], "num_failures"])
        w.writeheader()
        w.writerows({"num_failures": 0, **r} for r in rows)
    record = tuning_record(protocol, 28, tmp_path)
    points = record["rows"]["fedbn"]["points"]
    assert points[0]["client-failures"] == []
    assert points[1]["client-failures"] == [f"{failing.name}: 1 failed client update in 1 of 7 rounds"]
    lines = tuning_lines(record)
    assert "learning-rate=0.1: 0.9000 (!)" in lines[2] and any(failing.name in line for line in lines)


def test_a_row_without_a_finished_point_stops_the_table(tmp_path):
    protocol = Protocol((0,), 0.25, "best", 0.1, {"fedavg": {"learning-rate": [0.01]}})
    with pytest.raises(ConfigError, match="tuning chose nothing for fedavg"):
        tuning_record(protocol, 20, tmp_path)


# ---- the choice in the table's runs ---------------------------------------------------------

EXPERIMENT = """
name = "tiny"
strategies = ["fedavg", "fedprox", "fedavg-fixed"]
seeds = [5]
clients = 3

[run-config]
dataset = "mnist"
model = "lenet"
partitioner = "iid"
num-server-rounds = 8
fraction-fit = 1.0

[methods.fedprox]
optimizer = "sgd"
learning-rate = 0.05

[methods.fedavg-fixed]
strategy = "fedavg"
learning-rate = 0.02

[tune]
seeds = [0, 1]
budget = 0.25
metric = "last-5-mean"
validation-fraction = 0.2
untuned = ["fedavg-fixed"]

[tune.grid]
learning-rate = [0.001, 0.01]

[tune.fedprox]
learning-rate = [0.03, 0.1]
proximal-mu = [0.01, 0.1]
"""


def runner_args(exp: dict, data: Path, **given) -> argparse.Namespace:
    base = dict(experiment=exp, strategy=",".join(exp["strategies"]), seeds=exp["seeds"], clients=exp["clients"],
                overrides=[], grid=[], dataset=None, rounds=None, fraction=None, alpha=None, data_dir=str(data),
                cwd=None, env_data_dir=None, tune=None, config="tiny.toml")
    return argparse.Namespace(**{**base, **given})


def test_the_chosen_values_flow_into_the_tables_runs(tmp_path, tiny_mnist):
    (tmp_path / "tiny.toml").write_text(EXPERIMENT)
    exp = read_experiment(tmp_path / "tiny.toml")
    args = runner_args(exp, tiny_mnist)
    search = plan_search(args)
    configs = checks.build_configs(search.args, tmp_path / "tuning" / "runs")
    rows = sorted({row for row, _, _ in configs})
    assert rows == ["fedavg[learning-rate=0.001]", "fedavg[learning-rate=0.01]",
                    "fedprox[learning-rate=0.03,proximal-mu=0.01]", "fedprox[learning-rate=0.03,proximal-mu=0.1]",
                    "fedprox[learning-rate=0.1,proximal-mu=0.01]", "fedprox[learning-rate=0.1,proximal-mu=0.1]"]
    assert {seed for _, seed, _ in configs} == {0, 1}
    assert all(raw["num-server-rounds"] == 2 and raw["validation-fraction"] == 0.2 for _, _, raw in configs)
    for row, seed, _ in configs:  # the search's runs, as if they had finished
        good = row in ("fedavg[learning-rate=0.01]", "fedprox[learning-rate=0.1,proximal-mu=0.01]")
        write_run(tmp_path / "tuning" / "runs", row, seed, [0.5, 0.9 if good else 0.7])
    record = tuning_record(search.protocol, search.rounds, tmp_path / "tuning" / "runs")
    write_tuning(tmp_path, record)
    args.experiment = apply_choice(args.experiment, record)
    table = {row: raw for row, _, raw in checks.build_configs(args, tmp_path / "runs")}
    assert table["fedavg"]["learning-rate"] == 0.01
    assert (table["fedprox"]["learning-rate"], table["fedprox"]["proximal-mu"]) == (0.1, 0.01)
    assert table["fedavg"]["tuning-protocol"] == table["fedprox"]["tuning-protocol"] == record["protocol"]
    assert "2 of 8 rounds" in record["protocol"] and "validation split (0.2" in record["protocol"]
    assert table["fedavg-fixed"]["learning-rate"] == 0.02 and "tuning-protocol" not in table["fedavg-fixed"]
    assert all(raw.get("validation-fraction", 0) == 0 for raw in table.values())  # the table trains on all


def test_command_line_keys_the_search_sets_are_refused(tmp_path, tiny_mnist):
    (tmp_path / "tiny.toml").write_text(EXPERIMENT)
    exp = read_experiment(tmp_path / "tiny.toml")
    with pytest.raises(ConfigError, match=r"\['learning-rate'\] given on the command line.*--no-tune"):
        plan_search(runner_args(exp, tiny_mnist, overrides=["learning-rate=0.01"]))
    with pytest.raises(ConfigError, match="--grid"):
        plan_search(runner_args(exp, tiny_mnist, grid=["local-epochs=1,2"]))
    assert plan_search(runner_args(exp, tiny_mnist, tune=False)) is None
    plain = {k: v for k, v in exp.items() if k != "tune"}
    with pytest.raises(ConfigError, match=r"--tune needs an experiment file with a \[tune\] table"):
        plan_search(runner_args(plain, tiny_mnist, tune=True))
    assert plan_search(runner_args(plain, tiny_mnist)) is None
    search = plan_search(runner_args(exp, tiny_mnist, rounds=40))  # --rounds: the table's, the search a share
    assert search.rounds == 40 and search.args.experiment["run-config"]["num-server-rounds"] == 10


# ---- the [tune] table's errors --------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (('metric = "last-5-mean"', 'metric = "bestest"'),
     "[tune] metric = 'bestest' is invalid; valid choices: best, final, last-5-mean"),
    (("budget = 0.25", "budget = 0"), "[tune] budget = 0 is invalid: must be a number in (0, 1]"),
    (("seeds = [0, 1]", "seed = [0, 1]"), "[tune] key 'seed' is unknown; valid keys: seeds, budget, metric"),
    (("[tune.fedprox]", "[tune.fedproxx]"), "[tune.fedproxx] names no row of the file; valid rows: fedavg, fedprox"),
    (("[tune.grid]\nlearning-rate", "[tune.grid]\nnum-server-rounds"),
     "[tune.grid] key 'num-server-rounds' is set by the protocol itself"),
    (("[tune.grid]\nlearning-rate", "[tune.grid]\nlearning-rat"),
     "[tune.grid] key 'learning-rat' is not a run-config key (did you mean 'learning-rate'?)"),
    (("[tune.grid]\nlearning-rate = [0.001, 0.01]\n", ""), "[tune] gives row 'fedavg' no grid"),
    (('untuned = ["fedavg-fixed"]', 'untuned = ["fedsol"]'), "[tune] untuned = ['fedsol'] is invalid"),
    (("validation-fraction = 0.2", "validation-fraction = 0.9"), "[tune] validation-fraction = 0.9 is invalid"),
    (('metric = "last-5-mean"\n', ""), "[tune] has no 'metric'"),
    (("[tune.fedprox]\nlearning-rate = [0.03, 0.1]", "[tune.fedprox]\nlearning-rate = []"),
     "[tune.fedprox] learning-rate = [] is invalid: must be a non-empty list"),
])
def test_a_bad_tune_table_is_one_line_naming_the_key(tmp_path, change, message):
    old, new = change
    assert old in EXPERIMENT
    path = tmp_path / "bad.toml"
    path.write_text(EXPERIMENT.replace(old, new, 1))
    with pytest.raises(ConfigError) as caught:
        read_experiment(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(path) in str(caught.value)


def test_a_grid_beside_tune_is_refused(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(EXPERIMENT.replace("[tune]", "[grid]\nlocal-epochs = [1, 2]\n\n[tune]"))
    with pytest.raises(ConfigError, match=r"\[tune\] and a \[grid\] in one file"):
        read_experiment(path)


def test_the_fedpgvc_files_tune_every_claimed_row():
    """Every row a claim names is tuned (a grid of its own or the shared one); the SGD rows'
    grids reach past the earlier choice 0.05, the top of the earlier search."""
    for path in sorted((ROOT / "experiments").glob("fedpgvc-*-dir*.toml")):
        if "lr-search" in path.name:
            continue
        exp = read_experiment(path)
        protocol = read_protocol(exp, exp["strategies"], path)
        claimed = {side.split()[0] for c in exp["claims"] for side in c.split(">")}
        assert claimed <= set(protocol.grids), path.name
        for row in ("scaffold", "fednova", "fedpvr"):
            rates = protocol.grids[row]["learning-rate"]
            assert min(rates) < 0.05 < max(rates), (path.name, row)


def test_every_tune_grid_brackets_the_value_its_row_ran_before():
    """A [tune] grid reaches past the value the row's earlier runs used (its [methods]
    or [run-config] value) on both sides, so the earlier choice is inside the search and not its
    edge (FedProx, FedBN and FedPGVC ran Adam 0.01, the top of the earlier grid; the SGD rows 0.05,
    the top of theirs). Every file with [tune], the papers' settings included."""
    files = sorted((ROOT / "experiments").glob("*.toml")) + sorted((ROOT / "experiments" / "paper").glob("*.toml"))
    checked = 0
    for path in files:
        exp = read_experiment(path)
        protocol = read_protocol(exp, exp["strategies"], path)
        if protocol is None:
            continue
        for row, axes in protocol.grids.items():
            for key, values in axes.items():
                before = {**exp.get("run-config", {}), **exp.get("methods", {}).get(row, {})}.get(key)
                assert before is not None, (path.name, row, key)
                assert min(values) < before < max(values), (path.name, row, key, before, values)
                checked += 1
    assert checked >= 8 * 8  # the four FedPGVC files and their paper settings, 8 tuned rows each


def test_a_choice_at_the_end_of_its_keys_allowed_range_is_not_called_unbracketed():
    """FedRS's alpha 0 (its key allows [0, 1]) or a momentum of 0 chosen at the low end of a grid
    has no value outside the grid to try, so it is not listed as unbracketed (the old code listed
    it and told the user to widen a grid that cannot be widened); a learning rate or FedProx's mu
    at the low end still is (smaller values are allowed), and alpha at 0.9 on top of a grid that
    stops below 1 still is."""
    def entry(chosen, grids):
        points = [{"values": dict(zip(grids, combo)), "mean": 0.5}
                  for combo in itertools.product(*grids.values())]
        return {"chosen": chosen, "points": points}

    record = {"rows": {
        "fedrs": entry({"learning-rate": 0.01, "fedrs-alpha": 0.0},
                       {"learning-rate": [0.003, 0.01, 0.03], "fedrs-alpha": [0.0, 0.1, 0.5, 0.9]}),
        "fedrs-top": entry({"learning-rate": 0.01, "fedrs-alpha": 1.0},
                           {"learning-rate": [0.003, 0.01, 0.03], "fedrs-alpha": [0.5, 1.0]}),
        "fedrs-high": entry({"learning-rate": 0.01, "fedrs-alpha": 0.9},
                            {"learning-rate": [0.003, 0.01, 0.03], "fedrs-alpha": [0.5, 0.9]}),
        "fedavgm": entry({"learning-rate": 0.003, "momentum": 0.0},
                         {"learning-rate": [0.003, 0.01], "momentum": [0.0, 0.9]}),
        "fedprox": entry({"learning-rate": 0.01, "proximal-mu": 0.0001},
                         {"learning-rate": [0.003, 0.01, 0.03], "proximal-mu": [0.0001, 0.001]}),
    }}
    assert edge_choices(record) == [
        "fedrs-high: fedrs-alpha = 0.9 is the highest value of its grid (0.5, 0.9)",
        "fedavgm: learning-rate = 0.003 is the lowest value of its grid (0.003, 0.01)",
        "fedprox: proximal-mu = 0.0001 is the lowest value of its grid (0.0001, 0.001)",
    ]


# ---- make_results: claims only between rows tuned alike -------------------------------------

_spec = importlib.util.spec_from_file_location("make_results_tuning", ROOT / "scripts" / "make_results.py")
mr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mr)

CLAIMS = """
name = "fair"
paper = "Toy (Doe 2020), Table 1: test accuracy"
strategies = ["fedavg", "fedprox", "fedsol"]
seeds = [0, 1, 2]
clients = 10
claims = ["fedsol > fedavg (Table 1)", "fedsol > fedprox (Table 1)"]

[run-config]
num-server-rounds = 4
"""


def _store(tmp_path: Path, protocols: dict[str, str], chosen_by: str = "") -> tuple[Path, Path]:
    exps, store = tmp_path / "exps", tmp_path / "store"
    exps.mkdir(parents=True)
    (exps / "fair.toml").write_text(CLAIMS + chosen_by)
    for row, protocol in protocols.items():
        for seed in range(3):
            top = 0.8 if row == "fedsol" else 0.6
            write_run(store / "fair", row, seed, [0.3, 0.5, top - 0.01 * seed, top + 0.01 * seed], protocol)
    return exps, store


def test_a_claim_between_differently_tuned_rows_is_not_counted(tmp_path):
    exps, store = _store(tmp_path, {"fedavg": "tuned: A", "fedprox": "tuned: B", "fedsol": "tuned: A"})
    text = mr.make_results(exps, store, tmp_path / "out" / "results.md")
    lines = {line.split(" |")[0]: line for line in text.splitlines() if line.startswith("| fedsol > ")}
    assert "| **holds** |" in lines["| fedsol > fedavg"]
    assert "not counted: fedsol and fedprox were tuned differently (holds if counted)" in lines["| fedsol > fedprox"]
    assert lines["| fedsol > fedprox"].endswith("| P1 / P2 |") and lines["| fedsol > fedavg"].endswith("| P1 / P1 |")
    assert "| [fair](#fair) | Toy (Doe 2020), Table 1 | 9/9 | complete | 1 holds, 1 not counted |" in text
    assert "- P1: tuned: A" in text and "- P2: tuned: B" in text
    assert "| fedprox | " in text and text.split("| fedprox | ")[1].split("\n")[0].count("| P2 |") == 1
    # the last-rounds column of a claim not counted gives no verdict either
    assert lines["| fedsol > fedprox"].endswith("(holds if counted) | P1 / P2 |")
    assert lines["| fedsol > fedavg"].endswith("] holds | P1 / P1 |")


def test_a_claim_between_rows_searched_on_the_test_split_is_not_counted(tmp_path):
    """Rows that one search chose alike, but by their test accuracy, decide nothing: the protocol
    never looks at the test split. The same rows fixed from the paper decide their claims."""
    stated = f'\n[chosen-by]\nall = "{mr.TEST_SPLIT_SEARCH} (grid 0.01, 0.1; seed 0)"\n'
    exps, store = _store(tmp_path, {"fedavg": "", "fedprox": "", "fedsol": ""}, stated)
    text = mr.make_results(exps, store, tmp_path / "out" / "results.md")
    lines = [line for line in text.splitlines() if line.startswith("| fedsol > ")]
    assert len(lines) == 2 and all("not counted: the rows' values were chosen on the test split (holds if counted)"
                                   in line and line.endswith("(holds if counted) | P1 / P1 |") for line in lines)
    assert "| 9/9 | complete | 2 not counted |" in text
    exps, store = _store(tmp_path / "paper", {"fedavg": "", "fedprox": "", "fedsol": ""},
                         '\n[chosen-by]\nall = "fixed from the paper; not searched on the test split"\n')
    assert "| 9/9 | complete | 2 holds |" in mr.make_results(exps, store, tmp_path / "out2" / "results.md")


def test_a_choice_at_the_edge_of_its_grid_is_flagged():
    """The lowest or highest value of a numeric grid axis is flagged (the search did not bracket
    it); a choice inside its grid, a one-value axis and a text axis are not."""
    def entry(chosen, grid, key="learning-rate"):
        return {"chosen": {key: chosen}, "points": [{"values": {key: v}, "mean": 0.5} for v in grid]}

    record = {"rows": {"scaffold": entry(0.05, [0.001, 0.01, 0.05]), "fedavg": entry(0.001, [0.001, 0.01, 0.05]),
                       "fedprox": entry(0.01, [0.001, 0.01, 0.05]), "fedbn": entry(0.01, [0.01]),
                       "fedsol": entry("axis", ["axis", "layer"], "fedsol-radius")}}
    lines = mr.edge_lines(record)
    assert lines[0].startswith("**Choices at the edge of their grid**")
    assert lines[2:-1] == ["- scaffold: learning-rate = 0.05 is the highest value of its grid (0.001, 0.01, 0.05)",
                           "- fedavg: learning-rate = 0.001 is the lowest value of its grid (0.001, 0.01, 0.05)"]
    del record["rows"]["scaffold"], record["rows"]["fedavg"]
    assert mr.edge_lines(record) == [] and mr.edge_lines(None) == []


def test_rows_without_a_recorded_protocol_take_the_files_statement_or_are_not_counted(tmp_path):
    exps, store = _store(tmp_path, {"fedavg": "", "fedprox": "", "fedsol": ""})
    text = mr.make_results(exps, store, tmp_path / "out" / "results.md")
    assert f"- P1: {NOT_RECORDED}" in text and "0 holds" not in text and "| 2 not counted |" in text
    exps2, store2 = _store(tmp_path / "stated", {"fedavg": "", "fedprox": "", "fedsol": ""},
                           '\n[chosen-by]\nall = "fixed from the paper"\nfedprox = "project default mu"\n')
    text = mr.make_results(exps2, store2, tmp_path / "out2" / "results.md")
    assert "- P1: fixed from the paper" in text and "- P2: project default mu" in text
    assert "| 1 holds, 1 not counted |" in text


def test_make_results_shows_the_tuning_record_and_expects_its_choice(tmp_path):
    protocol = "tuned on a validation split (0.1 of the training data), seeds 0 1, 1 of 4 rounds"
    exps, store = _store(tmp_path, {})
    for row, lr in (("fedavg", 0.01), ("fedprox", 0.03), ("fedsol", 0.01)):
        for seed in range(3):
            top = 0.8 if row == "fedsol" else 0.6
            write_run(store / "fair", row, seed, [0.3, 0.5, top - 0.01 * seed, top + 0.01 * seed], protocol, lr)
    record = {"protocol": protocol, "metric": "last-5-mean", "rows": {
        row: {"chosen": {"learning-rate": lr}, "points": [{"values": {"learning-rate": lr}, "mean": 0.7},
                                                          {"values": {"learning-rate": 0.3}, "mean": None}]}
        for row, lr in (("fedavg", 0.01), ("fedprox", 0.03), ("fedsol", 0.01))}}
    (store / "fair" / "tuning.json").write_text(json.dumps(record))
    text = mr.make_results(exps, store, tmp_path / "out" / "results.md")
    assert "| 9/9 | complete | 2 holds |" in text
    assert "- fedprox: **learning-rate=0.03: 0.7000**; learning-rate=0.3: -" in text
    record["rows"]["fedprox"]["chosen"] = {"learning-rate": 0.3}  # the kept fedprox runs are not this choice
    (store / "fair" / "tuning.json").write_text(json.dumps(record))
    text = mr.make_results(exps, store, tmp_path / "out" / "results.md")
    assert "| 6/9 | partial (3 more runs from an earlier setting) |" in text


def test_check_validates_and_estimates_the_search_and_the_table(tmp_path, tiny_mnist, capsys):
    """``--check`` on a file with [tune]: every search run (validation split, the budget's rounds)
    and every table run is validated, each part estimated, nothing launched or written."""
    (tmp_path / "tiny.toml").write_text(EXPERIMENT.replace('partitioner = "iid"', 'partitioner = "iid"\ntracking = "none"'))
    out = tmp_path / "out"
    code = run_simulation.main(["--config", str(tmp_path / "tiny.toml"), "--data-dir", str(tiny_mnist),
                                "--out", str(out), "--check", "--tune"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "tuning search (tuned on a validation split (0.2 of the training data), seeds 0 1, 2 of 8 rounds" in printed
    assert "ok: fedprox[learning-rate=0.1,proximal-mu=0.1] seed 1 -> " in printed and "ok: fedavg-fixed seed 5" in printed
    assert printed.count("estimated run time") == 2 and non_split_files(out) == []


def test_the_runner_says_after_its_search_which_choices_its_grid_did_not_bracket(tmp_path, monkeypatch, capsys):
    """After the search, before the table is run, the runner prints one line per choice at the
    edge of its grid (the same test as docs/results.md's, runner.tuning.edge_choices) and how to
    widen it; a choice inside its grid prints none. Launching is replaced: only the lines after
    the search are under test."""
    from types import SimpleNamespace

    import runner.sweep as sweep

    def entry(chosen, grid):
        return {"chosen": {"learning-rate": chosen},
                "points": [{"values": {"learning-rate": v}, "mean": 0.5} for v in grid]}

    record = {"rows": {"fedavg": entry(0.1, [0.01, 0.03, 0.1]), "fedprox": entry(0.03, [0.01, 0.03, 0.1])}}
    monkeypatch.setattr(sweep, "launch", lambda *a, **k: [])
    monkeypatch.setattr(sweep, "report", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "tuning_record", lambda *a, **k: record)
    monkeypatch.setattr(sweep, "apply_choice", lambda exp, rec: exp)
    monkeypatch.setattr(sweep, "validate", lambda args, runs: [])
    search = SimpleNamespace(args=None, configs=[], rounds=10,
                             protocol=SimpleNamespace(describe=lambda rounds: "a protocol"))
    sweep.run_search(SimpleNamespace(experiment={}), search, tmp_path, 0.0, None)
    lines = [line for line in capsys.readouterr().out.splitlines() if "not bracketed" in line]
    assert lines == ["tuning: not bracketed: fedavg: learning-rate = 0.1 is the highest value of its grid (0.01, 0.03,"
                     " 0.1); a better value may lie outside it: widen the file's [tune] grid past it and run again"
                     " (the kept search runs are reused)"]


# ---- a committed record's scores reused ----------------------------------------------------

def test_a_committed_records_matching_runs_are_reused_and_the_others_run_again(tmp_path, monkeypatch, capsys):
    """A widened search on a fresh checkout: the grid points the committed record
    (docs/results/runs/<name>/tuning.json) scored with the same app code, run config, data
    fingerprint and library versions are not launched, their scores are taken; a point recorded
    with another fingerprint or other versions, or by an older record that kept none of it, runs
    again. The launch is replaced: only which runs it is given is under test."""
    from types import SimpleNamespace

    import runner.sweep as sweep
    from fl_app.api import write_run_config
    from runner.tuning import identity_now, made_with

    protocol = Protocol((0, 1), 0.5, "final", 0.1, {"fedavg": {"learning-rate": [0.01, 0.1, 0.3]}})

    def config(lr, seed):
        row = label("fedavg", {"learning-rate": lr})
        return row, seed, {"strategy": "fedavg", "dataset": "synthetic", "model": "logreg", "learning-rate": lr,
                           "seed": seed, "num-server-rounds": 2,
                           "run-name": run_name(row, seed), "results-dir": str(tmp_path / "out" / "tuning" / "runs")}

    configs = [config(lr, seed) for lr in (0.01, 0.1, 0.3) for seed in (0, 1)]
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "fab.sha256").write_text("c0de" * 16 + "\n")
    now = {raw["run-name"]: identity_now(raw, 4, "c0de" * 16) for _, _, raw in configs}
    other = {0: {"fingerprint": "0123456789ab"}, 1: {"versions": {**now[configs[2][2]["run-name"]]["versions"],
                                                                   "torch": "0.0.1"}}}
    record = {"protocol": "p", "metric": "final", "rows": {"fedavg": {"chosen": {"learning-rate": 0.01}, "points": [
        {"values": {"learning-rate": 0.01}, "scores": {"0": 0.7, "1": 0.8}, "mean": 0.75, "client-failures": [],
         "diverged": [], "runs": {str(s): now[configs[s][2]["run-name"]] for s in (0, 1)}},
        {"values": {"learning-rate": 0.1}, "scores": {"0": 0.9, "1": 0.9}, "mean": 0.9, "client-failures": [],
         "diverged": [], "runs": {str(s): {**now[configs[2 + s][2]["run-name"]], **other[s]} for s in (0, 1)}},
        {"values": {"learning-rate": 0.3}, "scores": {"0": 0.1, "1": 0.1}, "mean": 0.1}]}}}  # an older record
    committed = tmp_path / "checkout" / "docs" / "results" / "runs" / "widened"
    committed.mkdir(parents=True)
    (committed / "tuning.json").write_text(json.dumps(record))

    launched = []

    def launch(args, configs, runs, *rest):
        for row, seed, raw in configs:
            launched.append(raw["run-name"])
            write_run(runs, row, seed, [0.5, 0.6], lr=raw["learning-rate"])
            (runs / raw["run-name"] / "app.sha256").write_text("c0de" * 16 + "\n")
            write_run_config(runs / raw["run-name"], raw)
        return []

    monkeypatch.setattr(sweep, "APP_DIR", tmp_path / "checkout")
    monkeypatch.setattr(sweep, "launch", launch)
    monkeypatch.setattr(sweep, "report", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "validate", lambda args, runs: [])
    search = SimpleNamespace(args=None, configs=configs, rounds=4, protocol=protocol)
    sweep.run_search(SimpleNamespace(experiment={"name": "widened"}, clients=4), search, tmp_path / "out", 0.0, None,
                     tmp_path / "app")
    assert launched == [run_name(label("fedavg", {"learning-rate": lr}), s) for lr in (0.1, 0.3) for s in (0, 1)]
    printed = capsys.readouterr().out
    assert "tuning: reused 2 search runs' scores from " in printed
    assert "1 with another fingerprint than now (fedavg_learning-rate=0.1-seed0)" in printed
    assert "1 with another versions than now" in printed
    assert "2 with no record of what its run was made with (written before tuning.json kept it) (" in printed
    written = json.loads((tmp_path / "out" / "tuning.json").read_text())["rows"]["fedavg"]
    assert written["chosen"] == {"learning-rate": 0.01}  # the reused 0.75 beats the two runs of 0.6
    assert written["points"][0]["scores"] == {"0": 0.7, "1": 0.8}
    assert written["points"][0]["runs"]["0"]["reused-from"] == str(committed / "tuning.json")
    ran = written["points"][1]["runs"]["1"]  # what a run made here records, for the next search to reuse
    assert ran == made_with(tmp_path / "out" / "tuning" / "runs" / configs[3][2]["run-name"])
    assert ran["code"] == "c0de" * 16 and ran["config"] == now[configs[3][2]["run-name"]]["config"]


def test_check_leaves_out_of_its_estimate_the_search_runs_a_committed_record_holds(tmp_path, tiny_mnist, capsys,
                                                                                   monkeypatch):
    """``--check`` says which search runs the committed record would give (``committed_reuse``,
    replaced here by one answer) and lists and estimates only the others."""
    reused = run_name(label("fedprox", {"learning-rate": 0.1, "proximal-mu": 0.1}), 1)
    monkeypatch.setattr(checks, "committed_reuse", lambda args, search, runs, code, root: (
        {reused: {}}, [f"tuning: reused 1 search runs' scores from the record: {reused}"]))
    (tmp_path / "tiny.toml").write_text(EXPERIMENT.replace('partitioner = "iid"', 'partitioner = "iid"\ntracking = "none"'))
    code = run_simulation.main(["--config", str(tmp_path / "tiny.toml"), "--data-dir", str(tiny_mnist),
                                "--out", str(tmp_path / "out"), "--check", "--tune"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert f"tuning: reused 1 search runs' scores from the record: {reused}" in printed
    assert "ok: fedprox[learning-rate=0.1,proximal-mu=0.1] seed 1 -> " not in printed
    assert "ok: fedprox[learning-rate=0.1,proximal-mu=0.1] seed 0 -> " in printed
