"""The results atlas (docs/atlas.md, docs/results/atlas.png; runner/results/atlas.py), written by
scripts/make_results.py beside docs/results.md: generated from the kept runs, its cells are the
sections' numbers, a file without runs is "not run yet", wins/ties/losses read from the verdicts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner.results import atlas
from runner.results.stats import HOLDS, REFUTED, UNDECIDED
from tests.kit_runs import GHOST, TOY, load_make_results, row, section, write_run

mr = load_make_results()

ROOT = Path(__file__).resolve().parents[2]
ATLAS_PAGE = ROOT / "docs" / "atlas.md"
CELL = re.compile(r"\[(\d+)/(\d+) · ([0-9.]+)\]\(results\.md#([\w-]+)\)")

SHARDS = TOY.replace('name = "toy"', 'name = "toyshard"').replace(
    "num-server-rounds = 3", 'num-server-rounds = 3\npartitioner = "shard"\nshards-per-client = 2\nmodel = "lenet"')
DIRICHLET = TOY.replace("num-server-rounds = 3", 'num-server-rounds = 3\npartitioner = "dirichlet"\nalpha = 0.1')
# toy's paper setting (experiments/paper/toy.toml beside it): 300 rounds at the same fraction-fit 0.5 and 1
# local epoch, so toy's 3 rounds are 3 x 0.5 x 1 = 1.5 passes against 150: 0.01 of the paper's budget
TOY_PAPER = 'seeds = [0, 1, 2]\n[run-config]\nnum-server-rounds = 300\n'


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("atlas")
    exps, results = tmp / "experiments", tmp / "results"
    exps.mkdir()
    for name, text in (("toy", DIRICHLET), ("toyshard", SHARDS), ("ghost", GHOST)):
        (exps / f"{name}.toml").write_text(text)
    (exps / "paper").mkdir()
    (exps / "paper" / "toy.toml").write_text(TOY_PAPER)  # toyshard has none: its budget is unknown
    for exp in ("toy", "toyshard"):
        runs = results / exp / "runs"
        write_run(runs, "fedavg", 0, [0.2, 0.5, 0.6])
        write_run(runs, "fedavg", 1, [0.55, 0.4, 0.4])
        write_run(runs, "fedsol", 0, [0.3, 0.6, 0.7])
        write_run(runs, "fedsol", 1, [0.3, 0.48, 0.45])
        write_run(runs, "fedprox", 0, [0.1, 0.2, 0.3])
        write_run(runs, "fedprox", 1, [0.1, 0.2, 0.35])
    out = tmp / "docs" / "results.md"
    text = mr.make_results(exps, results, out)
    return text, (tmp / "docs" / "atlas.md").read_text(), tmp / "docs"


def table_rows(page: str) -> dict[str, list[str]]:
    """Method -> its cells, from the atlas's table (the lines under '## The table')."""
    part = page.split("## The table\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in part.splitlines():
        if line.startswith("| **"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out[cells[0].strip("*")] = cells[1:]
    return out


def table_files(page: str) -> list[str]:
    part = page.split("## The table\n", 1)[1]
    head = next(line for line in part.splitlines() if line.startswith("| method |"))
    return re.findall(r"\]\(results\.md#([\w-]+)\)", head)


def test_a_cells_rank_and_accuracy_are_the_sections(made):
    results, page, _ = made
    files = table_files(page)
    assert files == ["toy", "toyshard"]  # Dirichlet before shards; ghost has no runs: no column
    for method, cells in table_rows(page).items():
        for file, text in zip(files, cells):
            rank, n, acc, link = CELL.match(text).groups()
            assert link == file
            final = {m: float(row(section(results, file), m)[1].split(" ")[0]) for m in ("fedavg", "fedsol", "fedprox")}
            assert acc == row(section(results, file), method)[1].split(" ")[0]  # the section's mean, as printed
            assert int(n) == len(final) and int(rank) == 1 + sum(v > final[method] for v in final.values())


def test_the_marks_are_the_sections_verdicts_from_each_side(made):
    results, page, _ = made
    # toy's claims: fedsol > fedavg, fedsol > fedntd (no runs: left out) -- the section's verdicts
    verdict = {line.split("|")[1].strip(): line.split("|")[6].strip().strip("*")
               for line in section(results, "toy").splitlines() if line.startswith("| fedsol >")}
    assert verdict["fedsol > fedavg"] == UNDECIDED and verdict["fedsol > fedntd"] == mr.NOT_RUN
    cells = table_rows(page)
    small = f"{atlas.TIE}1 ({atlas.SMALL})"  # toy runs 0.01 of its paper's budget: its marks say so
    assert cells["fedsol"][0].endswith(small) and cells["fedavg"][0].endswith(small)
    assert atlas.WIN not in cells["fedprox"][0] and atlas.TIE not in cells["fedprox"][0]  # no claim names it
    assert "- **fedsol** (2 files; first in 2): wins 0 / ties 2 / loses 0" in page


def test_wins_and_losses_read_each_verdict_from_the_methods_side():
    v = [atlas.Verdict("a", "b", HOLDS, "a > b"), atlas.Verdict("c", "a", REFUTED, "c > a"),
         atlas.Verdict("a", "d", UNDECIDED, "a > d"), atlas.Verdict("b", "c", REFUTED, "b > c")]
    f = atlas.AtlasFile("x", {"partitioner": "iid"}, "final", "complete",
                        {n: atlas.Entry(n, n, n, m, 0.0, 2) for n, m in zip("abcd", (0.5, 0.4, 0.3, 0.5))}, v,
                        budget=1.0)
    assert atlas.marks(f, "a") == {atlas.WIN: 2, atlas.TIE: 1}
    assert atlas.marks(f, "b") == {atlas.LOSS: 2}
    assert atlas.marks(f, "c") == {atlas.LOSS: 1, atlas.WIN: 1}
    assert atlas.ranks(f) == {"a": 1, "d": 1, "b": 3, "c": 4}  # ties share a rank
    line = atlas.method_lines([f], ["a"])[0]
    assert line == "- **a** (1 file; first in 1): wins 2 / ties 1 / loses 0: wins on x [1×] (b, c); ties on x [1×]"


def test_a_file_without_kept_runs_shows_as_not_run(made):
    _, page, _ = made
    assert "ghost" not in table_files(page)
    idle = page.split(f"## Files {atlas.NOT_RUN}\n", 1)[1]
    line = next(line for line in idle.splitlines() if line.startswith("| [ghost]"))
    assert line == "| [ghost](results.md#ghost) | Dirichlet label skew | Dir(0.3) | mnist | cnn | fedavg, fedgam |"
    assert not re.search(r"\d\.\d{4}", line)  # no number for it


def test_skew_groups_read_the_run_config():
    assert atlas.skew({"partitioner": "inner-dirichlet", "alpha": 0.3})[:2] == ("dirichlet", "Dir(0.3) sizes fixed")
    assert atlas.skew({"partitioner": "pathological", "classes-per-client": 2})[:2] == ("classes", "#C=2")
    assert atlas.skew({"partitioner": "shard", "shards-per-client": 2})[:2] == ("shards", "2 shards")
    assert atlas.skew({"partitioner": "quantity", "alpha": 0.5})[0] == "quantity"
    assert atlas.skew({"partitioner": "iid", "noise-sigma": 0.1})[:2] == ("noise", "noise σ=0.1")


def test_the_picture_exists_and_the_page_shows_it(made):
    _, page, docs = made
    assert (docs / "results" / "atlas.png").stat().st_size > 10_000
    assert "![results atlas heat map](results/atlas.png)" in page
    assert (ROOT / "docs" / "results" / "atlas.png").is_file() and "(results/atlas.png)" in ATLAS_PAGE.read_text()


def test_every_atlas_cell_matches_its_section_in_the_committed_pages():
    """Each cell of docs/atlas.md names a section of docs/results.md and, for a file without a grid,
    the section's row of that method prints the same mean (the paper's metric: final, or best)."""
    results = (ROOT / "docs" / "results.md").read_text()
    page = ATLAS_PAGE.read_text()
    checked = 0
    for method, cells in table_rows(page).items():
        for text in cells:
            m = CELL.match(text)
            if not m or " at " in text:
                continue
            rank, n, acc, file = m.groups()
            sec = section(results, file)
            best = "(best)" in page.split(f"](results.md#{file})", 1)[1].split("<br>", 1)[0]
            first = method.split(" = ")[0]  # rows identical by design: the section's row of the first name
            assert row(sec, first)[2 if best else 1].split(" ")[0] == acc, (method, file)
            checked += 1
    assert checked >= 50
    for name in ("niid-bench-mnist-c1", "niid-bench-cifar10-iid"):  # GPU-sized, no kept runs
        assert f"| [{name}](results.md#{name}) |" in page.split(f"## Files {atlas.NOT_RUN}", 1)[1]


def headers(page: str) -> dict[str, str]:
    """File -> its column's header cell in the atlas's table."""
    part = page.split("## The table\n", 1)[1]
    head = next(line for line in part.splitlines() if line.startswith("| method |"))
    cells = [c.strip() for c in head.strip().strip("|").split("|")][1:]
    return {re.search(r"\]\(results\.md#([\w-]+)\)", c).group(1): c for c in cells}


def test_each_column_says_its_budget_fraction_and_seeds(made):
    """toy: 3 rounds x 0.5 x 1 epoch against its paper setting's 300 x 0.5 x 1 (by hand 1.5 / 150 =
    0.01), below SMALL_BUDGET; toyshard has no paper setting: its budget is unknown, said so."""
    results, page, _ = made
    head = headers(page)
    assert head["toy"].endswith("<br>**budget 0.01× (small)** · 2 seeds")
    assert head["toyshard"].endswith(f"<br>**{atlas.UNKNOWN_BUDGET} (no paper setting)** · 2 seeds")
    assert "**0.01 of the paper's**" in section(results, "toy")  # the section's budget line, the same number
    cells = table_rows(page)
    assert cells["fedsol"][1].endswith(f"{atlas.TIE}1 ({atlas.UNKNOWN_BUDGET})")
    line = next(line for line in page.splitlines() if line.startswith("- **fedsol**"))
    assert "ties 2 / loses 0 (0 / 2 / 0 of them at a small budget or budget unknown)" in line
    assert "ties on toy [0.01×], toyshard [no paper setting]" in line


def _file(budget: float | None) -> atlas.AtlasFile:
    entries = {n: atlas.Entry(n, n, n, m, 0.0, 3) for n, m in (("a", 0.6), ("b", 0.5))}
    return atlas.AtlasFile("x", {"partitioner": "iid"}, "final", "complete", entries,
                           [atlas.Verdict("a", "b", HOLDS, "a > b")], budget=budget)


def test_verdicts_below_the_small_budget_are_marked_as_such():
    """The mark is the threshold's: 0.0999 of the paper's budget is marked, 0.1 and 1 are not."""
    assert atlas.cell(_file(0.0999), "a", "l").endswith(f"{atlas.WIN}1 ({atlas.SMALL})")
    for fraction in (atlas.SMALL_BUDGET, 1.0):
        assert atlas.cell(_file(fraction), "a", "l").endswith(f"{atlas.WIN}1")
        assert "budget 0.1× (small)" not in atlas.header(_file(fraction), "r")
    assert "**budget 0.0999× (small)** · 3 seeds" in atlas.header(_file(0.0999), "r")
    assert "<br>budget 1× · 3 seeds" in atlas.header(_file(1.0), "r")
    assert atlas.cell(_file(0.05), "c", "l") == "–"  # no row, no mark


def test_the_skew_summary_names_the_leader_where_decided_and_the_files_where_nothing_resolved():
    decided, tie = _file(0.05), _file(0.5)
    tie = atlas.AtlasFile("y", tie.config, "final", "complete", tie.entries, [atlas.Verdict("a", "b", UNDECIDED, "")],
                          budget=0.5)
    line = atlas.skew_summary([decided, tie])[0]
    assert line.startswith("- **IID** (2 files, budget 0.05× to 0.5×; 1 at a small budget, below 0.1×): ")
    assert "a led in x (0.05×, small budget; +1)" in line
    assert "nothing resolved (every counted claim undecided) in y (0.5×)" in line


FOLD = """
name = "fold"
paper = "Fold (Doe et al. 2024), Table 1"
strategies = ["fedavg", "scaffold", "scaffold-participants", "fedgam-cv-alpha0"]
seeds = [0, 1]
clients = 10
claims = ["fedgam-cv-alpha0 > fedavg (Table 1)"]

[run-config]
num-server-rounds = 3
fraction-fit = 0.5

[methods.scaffold-participants]  # SCAFFOLD with FedGAM-CV's divisor |S_t|
strategy = "scaffold"
cv-divisor = "participants"

[methods.fedgam-cv-alpha0]  # FedGAM-CV without its GAM term: the row above, by design
strategy = "fedgam-cv"
gam-cv-alpha = 0.0

[chosen-by]
all = "fixed"
"""


def test_rows_identical_by_design_are_one_row_with_both_names(tmp_path):
    """FedGAM-CV at gam-cv-alpha 0 is SCAFFOLD with the divisor |S_t|: one row of the atlas,
    named with both, its claim read for it; SCAFFOLD itself (divisor N at C = 0.5) stays apart.
    The numbers are made to differ, so the fold is the settings', not the numbers'."""
    exps, results = tmp_path / "experiments", tmp_path / "results"
    exps.mkdir()
    (exps / "fold.toml").write_text(FOLD)
    runs = results / "fold" / "runs"
    for i, (name, strategy) in enumerate((("fedavg", "fedavg"), ("scaffold", "scaffold"),
                                          ("scaffold-participants", "scaffold"), ("fedgam-cv-alpha0", "fedgam-cv"))):
        for seed in (0, 1):
            write_run(runs, strategy, seed, [0.2, 0.4 + 0.01 * seed + 0.05 * i], folder=f"{name}-seed{seed}")
    results_page = mr.make_results(exps, results, tmp_path / "docs" / "results.md")
    page = (tmp_path / "docs" / "atlas.md").read_text()
    cells = table_rows(page)
    assert set(cells) == {"fedavg", "scaffold", "scaffold-participants = fedgam-cv-alpha0"}
    folded = cells["scaffold-participants = fedgam-cv-alpha0"][0]
    assert folded.startswith("[1/3 · 0.5050](results.md#fold)") and f"{atlas.WIN}1" in folded  # the first name's row
    assert row(section(results_page, "fold"), "fedgam-cv-alpha0")  # the section still shows both rows
    assert "- **scaffold-participants = fedgam-cv-alpha0** (1 file; first in 1): wins 1" in page


def test_identical_by_design_reads_the_settings():
    from fl_app.registry import validate_config
    from runner.results import design

    def cfg(strategy, **keys):
        return [validate_config({"strategy": strategy, "fraction-fit": 0.5, **keys})]

    base = {"scaffold": cfg("scaffold"), "participants": cfg("scaffold", **{"cv-divisor": "participants"}),
            "alpha0": cfg("fedgam-cv", **{"gam-cv-alpha": 0.0})}
    assert design.identical_rows(base) == [("participants", "alpha0")]
    # the reference GAM ignores alpha: at 0 it is not SCAFFOLD; nor is FedGAM-CV at alpha 0.4
    assert design.identical_rows({**base, "alpha0": cfg("fedgam-cv", **{"gam-cv-alpha": 0.0,
                                                                          "gam-variant": "reference"})}) == []
    assert design.identical_rows({**base, "alpha0": cfg("fedgam-cv")}) == []
    # a key of another method does not separate two rows; a general key does
    assert design.identical_rows({"a": cfg("fedavg"), "b": cfg("fedavg", **{"proximal-mu": 0.5})}) == [("a", "b")]
    assert design.identical_rows({"a": cfg("fedavg"), "b": cfg("fedavg", **{"learning-rate": 0.5})}) == []
    # full participation: |S_t| = N, so the three are one
    full = {k: [validate_config({**c[0], "fraction-fit": 1.0})] for k, c in base.items()}
    assert design.identical_rows(full) == [("scaffold", "participants", "alpha0")]


def test_the_committed_atlas_says_each_columns_budget_and_folds_rows_identical_by_design():
    """docs/atlas.md: every column's header names its budget fraction and seeds; in no column are
    two rows identical by design (the experiment files' settings with their tuning records'
    choices), each such group one row named with all its names."""
    from runner.experiment import read_experiment
    from runner.results.design import identical_rows
    from runner.tuning import apply_choice, read_tuning

    page = ATLAS_PAGE.read_text()
    head, cells = headers(page), table_rows(page)
    files = list(head)
    assert files and all(re.search(r"<br>\**(budget [0-9.]+×|budget unknown)[^<]* · \d+(-\d+)? seeds?$", head[f])
                         for f in files), head
    folds = 0
    for f in files:
        exp = read_experiment(ROOT / "experiments" / f"{f}.toml")
        tuned = apply_choice(exp, read_tuning(ROOT / "docs" / "results" / "runs" / f))
        for group in identical_rows(mr.row_configs(tuned)):
            column = files.index(f)
            assert all(cells.get(n, ["–"] * len(files))[column] == "–" for n in group), (f, group)
            assert CELL.match(cells[" = ".join(group)][column]), (f, group)
            folds += 1
    assert folds >= 4  # scaffold-participants = fedgam-cv-alpha0 twice; fedpgvc = fedpgvc-lr0.001 (tuned) twice
