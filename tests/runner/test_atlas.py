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


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("atlas")
    exps, results = tmp / "experiments", tmp / "results"
    exps.mkdir()
    for name, text in (("toy", DIRICHLET), ("toyshard", SHARDS), ("ghost", GHOST)):
        (exps / f"{name}.toml").write_text(text)
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
    assert cells["fedsol"][0].endswith(f"{atlas.TIE}1") and cells["fedavg"][0].endswith(f"{atlas.TIE}1")
    assert atlas.WIN not in cells["fedprox"][0] and atlas.TIE not in cells["fedprox"][0]  # no claim names it
    assert "- **fedsol** (2 files; first in 2): wins 0 / ties 2 / loses 0" in page


def test_wins_and_losses_read_each_verdict_from_the_methods_side():
    v = [atlas.Verdict("a", "b", HOLDS, "a > b"), atlas.Verdict("c", "a", REFUTED, "c > a"),
         atlas.Verdict("a", "d", UNDECIDED, "a > d"), atlas.Verdict("b", "c", REFUTED, "b > c")]
    f = atlas.AtlasFile("x", {"partitioner": "iid"}, "final", "complete",
                        {n: atlas.Entry(n, n, n, m, 0.0, 2) for n, m in zip("abcd", (0.5, 0.4, 0.3, 0.5))}, v)
    assert atlas.marks(f, "a") == {atlas.WIN: 2, atlas.TIE: 1}
    assert atlas.marks(f, "b") == {atlas.LOSS: 2}
    assert atlas.marks(f, "c") == {atlas.LOSS: 1, atlas.WIN: 1}
    assert atlas.ranks(f) == {"a": 1, "d": 1, "b": 3, "c": 4}  # ties share a rank
    line = atlas.method_lines([f], ["a"])[0]
    assert line == "- **a** (1 file; first in 1): wins 2 / ties 1 / loses 0: wins on x (b, c); ties on x"


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
            assert row(sec, method)[2 if best else 1].split(" ")[0] == acc, (method, file)
            checked += 1
    assert checked >= 50
    for name in ("niid-bench-mnist-c1", "niid-bench-cifar10-iid"):  # GPU-sized, no kept runs
        assert f"| [{name}](results.md#{name}) |" in page.split(f"## Files {atlas.NOT_RUN}", 1)[1]
