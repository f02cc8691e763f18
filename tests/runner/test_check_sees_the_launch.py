"""`--check` refuses what the launch would fail on, and nothing is silently ignored.

A run folder name over a file system's limit (a 300-character label passed `--check`, then the
launch stopped on "File name too long" and advised a `--resume` that hit the same error), an
`--out` the runner cannot write, keys no run reads (`--set sam-rho=0.1` with FedAvg alone,
`[methods.fedavg] proximal-mu`, a `[methods.X]` table of a row the file does not list), and a
shared grid whose key one of the methods does not read (it ran that method once per value,
identical runs under different labels)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import run_simulation
from fl_app.config import ConfigError
from runner import checks, cli
from runner.experiment import read_experiment
from runner.plan import NAME_MAX
from runner.sweep import file_problem

SYNTH = ["--dataset", "synthetic", "--set", "model=logreg", "--clients", "4"]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "usage:" not in err
    return err


def refused(argv: list[str], capsys) -> str:
    """The one line of a refusal before anything is launched (exit code 2), whether it comes while
    the arguments are read or from the checks."""
    try:
        assert run_simulation.main(argv) == 2
    except SystemExit as exit_:
        assert exit_.code == 2
    return one_line_error(capsys)


VARIANT = """
strategies = ["{label}"]
seeds = {seeds}
clients = 4
[run-config]
dataset = "synthetic"
model = "logreg"
num-server-rounds = 1
[methods."{label}"]
strategy = "fedavg"
"""


# ---- a run folder name the file system refuses ----------------------------------------------------

def test_a_300_character_label_is_refused_by_check(tmp_path, capsys):
    exp = tmp_path / "exp.toml"
    exp.write_text(VARIANT.format(label="v" * 300, seeds="[0]"))
    out = tmp_path / "o"
    err = refused(["--config", str(exp), "--out", str(out), "--check"], capsys)
    assert "is 306 bytes, over the 255" in err and "File name too long" in err and "shorter label" in err
    assert not out.exists()


def test_the_limit_is_measured_on_the_folder_of_the_longest_seed(tmp_path, capsys):
    """A label whose folder `<label>-seed0` is exactly NAME_MAX bytes passes (and such a folder
    can be made); with seed 10 as well, `<label>-seed10` is one byte over and is refused."""
    name = "v" * (NAME_MAX - len("-seed0"))
    (tmp_path / f"{name}-seed0").mkdir()  # the limit is this file system's
    with pytest.raises(OSError) as too_long:
        (tmp_path / f"{name}-seed10").mkdir()
    assert too_long.value.errno == errno.ENAMETOOLONG
    exp = tmp_path / "exp.toml"
    exp.write_text(VARIANT.format(label=name, seeds="[0]"))
    args = cli.parse_args(["--config", str(exp), "--out", str(tmp_path / "o")])
    assert [raw["run-name"] for _, _, raw in checks.planned_configs(args, tmp_path / "o" / "runs")] == [f"{name}-seed0"]
    exp.write_text(VARIANT.format(label=name, seeds="[0, 10]"))
    err = refused(["--config", str(exp), "--out", str(tmp_path / "o"), "--check"], capsys)
    assert "(seed 10) is invalid" in err and "is 256 bytes" in err


def test_an_out_name_too_long_is_refused_without_resume_advice(tmp_path, capsys):
    out = tmp_path / ("o" * 300)
    err = refused([*SYNTH, "--out", str(out), "--check"], capsys)
    assert "is 300 bytes" in err and "give a shorter --out" in err and "--resume" not in err


def test_a_name_too_long_met_while_writing_advises_no_resume(tmp_path):
    """--resume keeps the labels and the folder, so it would meet the same error."""
    exc = OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(tmp_path / ("v" * 300)))
    line = file_problem(exc, tmp_path)
    assert "File name too long" in line and "shorter" in line and "continue with" not in line
    full = file_problem(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "x")), tmp_path)
    assert f"--resume {tmp_path}" in full  # a full disk: freeing space and resuming works


# ---- an --out the runner cannot write ---------------------------------------------------------------

def unwritable_folder(tmp_path: Path) -> Path:
    """A folder in which this user cannot make one: a read-only one for a normal user; for root,
    who writes through permissions, sysfs (`/sys`), which refuses every new entry."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    if not Path("/sys").is_dir():
        pytest.skip("no sysfs here")
    return Path("/sys")


def test_an_unwritable_out_is_refused_by_check(tmp_path, capsys):
    """As root, `os.access` says yes to /sys, so `--check` passed and the launch failed making
    the folder; the check now tries to write."""
    folder = unwritable_folder(tmp_path)
    probe = folder / "fl-drift-probe-of-the-test"
    try:
        probe.mkdir()
    except OSError:
        pass
    else:
        probe.rmdir()
        pytest.skip(f"{folder} can be written here")
    err = refused([*SYNTH, "--out", str(folder / "results"), "--check"], capsys)
    assert f"{folder} cannot be written by this user" in err
    assert list(folder.glob(".fl-drift-write-check-*")) == []


@pytest.mark.parametrize("inside", ["runs", "tuning", "app"])
def test_a_file_where_the_runner_makes_a_folder_is_refused_by_check(tmp_path, capsys, inside):
    out = tmp_path / "o"
    out.mkdir()
    (out / inside).write_text("not a folder")
    err = refused([*SYNTH, "--out", str(out), "--check"], capsys)
    assert f"{out / inside} is a file, where the runner makes a folder" in err


def test_a_file_in_place_of_a_run_folder_is_refused_by_check(tmp_path, capsys):
    runs = tmp_path / "o" / "runs"
    runs.mkdir(parents=True)
    (runs / "fedavg-seed0").write_text("not a folder")
    err = refused([*SYNTH, "--out", str(tmp_path / "o"), "--check"], capsys)
    assert f"fedavg seed 0: {runs / 'fedavg-seed0'} is a file" in err


def test_a_writable_out_leaves_nothing_behind(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "runs").mkdir()
    assert run_simulation.main([*SYNTH, "--rounds", "1", "--out", str(out), "--check"]) == 0
    assert sorted(p.name for p in out.rglob("*")) == ["runs"]  # the write probes removed


# ---- --set and --grid keys only where a method reads them ----------------------------------------

def planned(argv: list[str], tmp_path: Path) -> list[tuple[str, int, dict]]:
    args = cli.parse_args([*SYNTH, *argv, "--out", str(tmp_path / "o")])
    return checks.planned_configs(args, tmp_path / "o" / "runs")


def test_a_grid_key_one_method_reads_makes_no_copies_of_the_other(tmp_path):
    """`--grid scaffold-correction=direction,post-step --strategy fedavg,scaffold` ran FedAvg
    twice, identical runs labelled by a key it never reads: now three runs per seed."""
    rows = planned(["--grid", "scaffold-correction=direction,post-step", "--strategy", "fedavg,scaffold",
                    "--seeds", "0", "1"], tmp_path)
    assert [(row, seed) for row, seed, _ in rows] == [
        ("fedavg", 0), ("fedavg", 1),
        ("scaffold[scaffold-correction=direction]", 0), ("scaffold[scaffold-correction=direction]", 1),
        ("scaffold[scaffold-correction=post-step]", 0), ("scaffold[scaffold-correction=post-step]", 1)]
    assert "scaffold-correction" not in rows[0][2]
    assert [raw["scaffold-correction"] for _, _, raw in rows[2:]] == ["direction", "direction", "post-step", "post-step"]


def test_a_general_grid_key_still_makes_rows_of_every_method(tmp_path):
    rows = planned(["--grid", "learning-rate=0.1,0.2", "--grid", "scaffold-correction=direction,post-step",
                    "--strategy", "fedavg,scaffold"], tmp_path)
    assert [row for row, _, _ in rows] == [
        "fedavg[learning-rate=0.1]", "fedavg[learning-rate=0.2]",
        "scaffold[learning-rate=0.1,scaffold-correction=direction]",
        "scaffold[learning-rate=0.1,scaffold-correction=post-step]",
        "scaffold[learning-rate=0.2,scaffold-correction=direction]",
        "scaffold[learning-rate=0.2,scaffold-correction=post-step]"]


@pytest.mark.parametrize("flag", ["--set", "--grid"])
def test_a_key_no_listed_method_reads_is_refused(tmp_path, capsys, flag):
    """`--strategy fedavg --set sam-rho=0.1` exited 0 and ran plain FedAvg."""
    value = "sam-rho=0.1" if flag == "--set" else "sam-rho=0.1,0.2"
    err = refused([*SYNTH, "--strategy", "fedavg", flag, value, "--out", str(tmp_path / "o"), "--check"], capsys)
    assert f"{flag} sam-rho=... is invalid: no listed method reads 'sam-rho' (read by fedsam" in err
    rows = planned(["--strategy", "fedavg,fedsam", flag, value], tmp_path)  # one listed method reads it
    assert {raw["sam-rho"] for row, _, raw in rows if row.startswith("fedsam")} <= {0.1, 0.2}


def test_a_set_key_read_only_by_an_untuned_row_is_no_stray_in_the_search(tmp_path):
    """The tuning search runs only the tuned rows, with the table's --set keys."""
    exp = tmp_path / "exp.toml"
    exp.write_text('strategies = ["fedavg", "fedsam"]\nclients = 4\n[run-config]\ndataset = "synthetic"\n'
                   'model = "logreg"\n[tune]\nseeds = [0]\nbudget = 0.5\nmetric = "best"\nuntuned = ["fedsam"]\n'
                   "[tune.grid]\nlearning-rate = [0.1, 0.2]\n")
    from runner.tuning import plan_search

    args = cli.parse_args(["--config", str(exp), "--set", "sam-rho=0.1", "--out", str(tmp_path / "o")])
    search = plan_search(args)
    assert [row for row, _, _ in checks.planned_configs(search.args, tmp_path / "s")] == [
        "fedavg[learning-rate=0.1]", "fedavg[learning-rate=0.2]"]


# ---- an experiment file's keys and tables that no run reads -------------------------------------

FILE = """
strategies = ["fedavg", "fedprox"]
clients = 4
[run-config]
dataset = "synthetic"
model = "logreg"
"""


@pytest.mark.parametrize("body, expected", [
    ("[methods.fedavg]\nproximal-mu = 0.5\n",
     "[methods.fedavg] sets 'proximal-mu', which changes nothing: method 'fedavg' does not read 'proximal-mu'"
     " (read by fedprox); fedavg's own keys: none"),
    ("[methods.fedavg.grid]\nproximal-mu = [0.1, 0.5]\n", "[methods.fedavg.grid] sets 'proximal-mu'"),
    ("[methods.fedprx]\nproximal-mu = 0.5\n",
     "[methods.fedprx] is a table for a row that 'strategies' does not list (did you mean 'fedprox'?)"),
    ("[methods.fedsam]\nsam-rho = 0.1\n", "[methods.fedsam] is a table for a row that 'strategies' does not list"),
])
def test_a_file_key_or_table_no_run_reads_is_refused(tmp_path, capsys, body, expected):
    exp = tmp_path / "exp.toml"
    exp.write_text(FILE + body)
    with pytest.raises(ConfigError) as error:
        read_experiment(exp)
    assert expected in str(error.value) and "\n" not in str(error.value)
    err = refused(["--config", str(exp), "--check", "--out", str(tmp_path / "o")], capsys)
    assert expected in err


def test_a_run_config_key_no_listed_method_reads_is_refused(tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text(FILE + "sam-rho = 0.1\n")
    with pytest.raises(ConfigError, match=r"\[run-config\] sam-rho is invalid: no listed method reads 'sam-rho' \(read by"
                                          r" fedsam"):
        read_experiment(exp)
    exp.write_text(FILE.replace('"fedprox"]', '"fedsam"]') + "sam-rho = 0.1\n")
    assert read_experiment(exp)["run-config"]["sam-rho"] == 0.1  # FedSAM reads it (FedAvg ignores it)


def test_a_variant_key_of_another_method_gets_the_closest_key_of_its_own(tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text(FILE.replace('"fedprox"]', '"sharp"]') + '[methods.sharp]\nstrategy = "fedasam"\nsam-rho = 0.1\n')
    with pytest.raises(ConfigError, match=r"method 'fedasam' does not read 'sam-rho' \(did you mean 'asam-rho'\?\)"):
        read_experiment(exp)
    exp.write_text(FILE.replace('"fedprox"]', '"sharp"]') + '[methods.sharp]\nstrategy = "fedasam"\nasam-rho = 0.1\n')
    assert read_experiment(exp)["methods"]["sharp"]["asam-rho"] == 0.1


def test_a_file_grid_is_a_grid_of_the_methods_that_read_its_key(tmp_path):
    """The runner and make_results agree on the rows (runner.plan.row_axes)."""
    from tests.kit_runs import load_make_results

    exp = tmp_path / "exp.toml"
    exp.write_text(FILE.replace('"fedprox"]', '"fedsam"]') + "[grid]\nsam-rho = [0.05, 0.1]\n")
    args = cli.parse_args(["--config", str(exp), "--out", str(tmp_path / "o")])
    rows = [row for row, _, _ in checks.planned_configs(args, tmp_path / "o" / "runs")]
    assert rows == ["fedavg", "fedsam[sam-rho=0.05]", "fedsam[sam-rho=0.1]"]
    assert [row for row, _, _ in load_make_results().experiment_rows(read_experiment(exp))] == rows
    exp.write_text(FILE + "[grid]\nsam-rho = [0.05, 0.1]\n")
    with pytest.raises(ConfigError, match=r"\[grid\] sam-rho is invalid: no listed method reads 'sam-rho'"):
        read_experiment(exp)


TUNED = """
strategies = ["fedavg", "fedsam"]
clients = 4
[run-config]
dataset = "synthetic"
model = "logreg"
[tune]
seeds = [0]
budget = 0.5
metric = "best"
"""


def test_a_shared_tuning_grid_searches_a_key_only_where_it_is_read(tmp_path):
    from runner.tuning import read_protocol

    exp = tmp_path / "exp.toml"
    exp.write_text(TUNED + "[tune.grid]\nlearning-rate = [0.1, 0.2]\nsam-rho = [0.05, 0.1]\n")
    protocol = read_protocol(read_experiment(exp), ["fedavg", "fedsam"])
    assert protocol.grids == {"fedavg": {"learning-rate": [0.1, 0.2]},
                              "fedsam": {"learning-rate": [0.1, 0.2], "sam-rho": [0.05, 0.1]}}
    exp.write_text(TUNED + "[tune.grid]\nsam-rho = [0.05, 0.1]\n")
    with pytest.raises(ConfigError, match=r"gives row 'fedavg' no grid \(method 'fedavg' reads none of \[tune.grid\]"):
        read_experiment(exp)
    exp.write_text(TUNED + "[tune.grid]\nlearning-rate = [0.1, 0.2]\n[tune.fedavg]\nsam-rho = [0.05, 0.1]\n")
    with pytest.raises(ConfigError, match=r"\[tune.fedavg\] sets 'sam-rho', which changes nothing"):
        read_experiment(exp)


# ---- --check's pictures: one folder left, not one per check ------------------------------------

def check_folders(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("fl-drift-check-*"))


def test_a_check_removes_the_folders_earlier_checks_left(tmp_path, capsys, monkeypatch):
    """Every --check left a fl-drift-check-* folder in the temporary directory; now the next
    check removes it, so one is left: the last check's, whose split: line names its picture."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    argv = [*SYNTH, "--rounds", "1", "--out", str(tmp_path / "o"), "--check"]
    leftover = tmp / "fl-drift-check-old"  # as a check before this change left it: no lock in it
    leftover.mkdir()
    old = 1_000_000_000
    os.utime(leftover, (old, old))
    for _ in range(2):
        assert run_simulation.main(argv) == 0
    printed = capsys.readouterr().out
    (folder,) = check_folders(tmp)  # the leftover and the first check's folder removed
    assert f"split: {folder / 'partitions.png'} (synthetic" in printed and (folder / "partitions.png").is_file()


def test_a_check_leaves_the_folder_a_running_check_draws_in(tmp_path, monkeypatch):
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with checks.check_folder() as drawing:  # a check still drawing its splits
        with checks.check_folder() as other:
            assert drawing.is_dir() and other.is_dir() and drawing != other
        fresh = tmp / "fl-drift-check-new"  # made a moment ago, its lock not yet taken
        fresh.mkdir()
        with checks.check_folder() as third:
            assert drawing.is_dir() and fresh.is_dir()
            assert not other.exists()  # finished: removed by the next check
    assert check_folders(tmp) == sorted([drawing, fresh, third])


def test_the_checks_build_each_settings_strategy_once_and_still_refuse_a_new_setting(monkeypatch):
    """``check_configs`` builds the strategy of each setting once, not once per seed (a sweep's
    check built a ResNet-18 per run), and a setting it has not built yet is still built and
    refused: FedBN on a model without batch norm, after three seeds of FedAvg."""
    from fl_app import registry
    from fl_app.api import check_configs

    built: list[str] = []
    real = registry.build_strategy
    monkeypatch.setattr(registry, "build_strategy", lambda cls, cfg: (built.append(cfg["strategy"]), real(cls, cfg))[1])
    base = {"dataset": "synthetic", "model": "logreg", "data-dir": "unused"}
    runs = [{**base, "strategy": "fedavg", "seed": s, "run-name": f"fedavg-seed{s}"} for s in range(3)]
    runs.append({**base, "strategy": "fedavg", "seed": 0, "learning-rate": 0.5, "run-name": "fedavg-lr"})
    assert len(check_configs(runs, 4)) == 4
    assert built == ["fedavg", "fedavg"]  # the three seeds once, the other learning rate once
    with pytest.raises(ConfigError, match="batch-norm"):
        check_configs(runs + [{"strategy": "fedbn", "dataset": "mnist", "model": "lenet", "data-dir": "unused"}], 4)
