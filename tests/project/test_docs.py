"""The documentation stands on its own: the code and the docs cite docs/methods.md, never files
a user of the project does not have, and tell no session history; docs/methods.md covers every
registered method and its keys; the metric names docs/running.md gives are the ones the code
writes. README.md is the front door (at most 200 lines, every command block in it run by
tests/project/test_readme.py), every relative link of README and the pages resolves, and the
documentation site (mkdocs.yml) lists every page and builds with ``mkdocs build --strict``."""

from __future__ import annotations

import ast
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fl_app.registry import METHODS, config_keys
from runner.experiment import ENTRIES as EXPERIMENT_ENTRIES

ROOT = Path(__file__).resolve().parents[2]
METHODS_DOC = ROOT / "docs" / "methods.md"
CODE_PACKAGES = ("runner", "fl_app", "clients", "strategies", "protocol", "tasks")
# References to material outside the repository: the sibling folder, the pinned-formula file
# and the numbered paper texts that live there (docs/methods.md, lower case, is ours).
OUTSIDE = re.compile(r"\.\./shared|METHODS\.md|(?i:papers? 00\d)")
# Narrated history ("in the fourth session", "changed this session"): docs state what holds.
HISTORY = re.compile(
    r"(?i)\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|this|that|previous|last|next) session\b"
)
README = ROOT / "README.md"
RUNNING = ROOT / "docs" / "running.md"  # what a run writes: the `metrics.csv` bullet
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "experiments").glob("*.toml"))]


def outside_references(paths, pattern: re.Pattern = OUTSIDE) -> list[str]:
    hits = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return hits


def test_outside_pattern_matches_what_it_must():
    for text in ("see ../shared/METHODS.md", "FedSOL (paper 003)", "RI-FedAvg (papers 000/001)",
                 "METHODS.md convention", "Paper 002, Eq. 16"):
        assert OUTSIDE.search(text), text
    for text in ("FedSOL (Lee et al., CVPR 2024)", "docs/methods.md", "shared code", "paper 1"):
        assert not OUTSIDE.search(text), text


def code_files() -> list[Path]:
    files = sorted(p for pkg in CODE_PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    assert files
    return files


def test_code_names_nothing_outside_the_repository():
    hits = outside_references(code_files())
    assert not hits, "code cites material outside the repository:\n" + "\n".join(hits)


def test_docs_name_nothing_outside_the_repository():
    hits = outside_references(DOCS)
    assert not hits, "docs cite material outside the repository:\n" + "\n".join(hits)


def test_history_pattern_matches_what_it_must():
    for text in ("before the fourth session's work", "Changed this session", "(fifth session)"):
        assert HISTORY.search(text), text
    for text in ("start_new_session=True", "a new session, so a group kill", "sessions, so stopping"):
        assert not HISTORY.search(text), text


def test_code_and_docs_tell_no_session_history():
    hits = outside_references(code_files() + DOCS, HISTORY)
    assert not hits, "narrated history (state what holds; the history belongs to git):\n" + "\n".join(hits)


def test_methods_doc_names_nothing_outside_the_repository():
    hits = outside_references([METHODS_DOC])
    assert not hits, "\n".join(hits)


def test_methods_doc_has_a_section_for_every_registered_method():
    text = METHODS_DOC.read_text(encoding="utf-8")
    documented = set(re.findall(r"^### ([a-z0-9-]+)\s*$", text, flags=re.MULTILINE))
    missing = sorted(set(METHODS) - documented)
    assert not missing, f"docs/methods.md has no '### <name>' section for: {', '.join(missing)}"


def test_methods_doc_names_every_method_key():
    text = METHODS_DOC.read_text(encoding="utf-8")
    missing = sorted(
        f"{name}: {key}"
        for name, method in METHODS.items()
        for key in config_keys(method)  # its strategy's CONFIG_KEYS and its update's keys
        if f"`{key}`" not in text
    )
    assert not missing, "keys not documented in docs/methods.md: " + ", ".join(missing)


# --- the metric names docs/running.md and docs/methods.md give are the ones the code writes ---

CLIENT_SUFFIXES = ("_mean", "_min", "_max")  # a client metric x is recorded as x_mean/_min/_max
NAME = re.compile(r"[a-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*")


def is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def written_names() -> set[str]:
    """Names the code can write as metrics or metrics.csv columns: string keys of dict literals,
    of subscript assignments (``metrics["x"] = ...``) and of ``.update(x=...)`` keywords, the
    string ``metric=`` keywords of a call (a server part's declared metric), and the
    strings of module-level UPPER_CASE constants (column lists), in every code package.
    Docstrings, comments and messages do not count."""
    names: set[str] = set()
    for path in code_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                names |= {k.value for k in node.keys if is_str(k)}
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                for target in getattr(node, "targets", None) or [node.target]:
                    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                        names.add(str(target.slice.value))
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "update":
                names |= {k.arg for k in node.keywords if k.arg}
            elif isinstance(node, ast.Call):  # a server part's declared metric (strategies.parts.Drift)
                names |= {k.value.value for k in node.keywords if k.arg == "metric" and is_str(k.value)}
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if targets and all(isinstance(t, ast.Name) and t.id.isupper() for t in targets):
                names |= {c.value for c in ast.walk(node.value) if is_str(c)}
    return names


def methods_doc_metric_names() -> list[str]:
    """The metric names docs/methods.md gives (each method's own ``metrics.csv`` columns): every
    backticked name with an underscore on a line that says "metric"."""
    names = []
    for line in METHODS_DOC.read_text(encoding="utf-8").splitlines():
        if "metric" in line.lower():
            names += [n for n in re.findall(r"`([^`]+)`", line) if "_" in n and NAME.fullmatch(n)]
    return names


def metrics_csv_names() -> list[str]:
    """The column names docs/running.md's `metrics.csv` bullet (section "What a run writes")
    gives: every item of a backticked comma list, and every other backticked lower-case name
    with an underscore."""
    text = RUNNING.read_text(encoding="utf-8")
    match = re.search(r"^- `metrics\.csv`:(.*?)(?=^- |^\s*$)", text, re.MULTILINE | re.DOTALL)
    assert match, "docs/running.md has no '- `metrics.csv`:' bullet"
    names = []
    for span in re.findall(r"`([^`]+)`", match.group(1)):
        items = [s.strip() for s in span.split(",")]
        if len(items) > 1:
            names += items
        elif "_" in span and NAME.fullmatch(span):
            names.append(span)
    return names


def unknown(names, written: set[str]) -> list[str]:
    def known(name: str) -> bool:
        bases = [name[: -len(s)] for s in CLIENT_SUFFIXES if name.endswith(s)]
        return name in written or any(base in written for base in bases)
    return sorted({n for n in names if not known(n)})


def test_documented_metric_names_exist():
    written = written_names()
    assert {"cv_norm", "feddyn_h_norm", "round", "test_accuracy"} <= written  # the scan finds both kinds
    per_method = methods_doc_metric_names()
    assert {"cv_norm", "smoo_s_norm", "prox_loss", "dp_epsilon"} <= set(per_method)  # the scan finds them
    names = per_method + metrics_csv_names()
    assert len(names) > 20, names
    bad = [n for n in names if not NAME.fullmatch(n)]
    assert not bad, f"documented metric names that are not names: {bad}"
    missing = unknown(names, written)
    assert not missing, f"the docs name metrics the code does not write: {', '.join(missing)}"


# --- every run-config key the docs name exists ------------------------------------------------

SET_KEY = re.compile(r"--(?:set|grid)[ =]['\"]?([a-z][a-z0-9-]*)=")
RUN_CONFIG = re.compile(r"--run-config[ =]\"([^\"]+)\"")
ASSIGNED = re.compile(r"`([a-z][a-z0-9-]*) ?= ?[^`]+`")  # `key = value` in running text
# Names the docs assign that are not run-config keys, each with where it belongs: experiment
# file entries (runner/experiment.py), a SuperNode's node config, Flower's federation settings.
NOT_RUN_CONFIG = set(EXPERIMENT_ENTRIES) | {"partition-id", "num-partitions", "data-path",
                                            "client-resources-num-cpus", "client-resources-num-gpus"}
PLACEHOLDER = "key"  # `--set key=value` in the prose that explains --set


def named_keys(text: str) -> set[str]:
    names = set(SET_KEY.findall(text)) | set(ASSIGNED.findall(text))
    for spec in RUN_CONFIG.findall(text):
        names |= set(re.findall(r"(?:^|\s)([a-z][a-z0-9-]*)=", spec))
    return names - NOT_RUN_CONFIG - {PLACEHOLDER}


def test_key_patterns_find_what_they_must():
    text = ('run `--set proximal-mu=0.1`, `--grid alpha=0.1,1` and `flwr run . --run-config "strategy=\'scaffold\''
            ' momentum=0.9"`; `tensorboard = false` turns it off; `fedbn` refuses `resnet18`')
    assert named_keys(text) == {"proximal-mu", "alpha", "strategy", "momentum", "tensorboard"}


def test_every_run_config_key_the_docs_name_exists():
    from fl_app.registry import spec

    keys = set(spec())
    unknown = sorted(f"{path.relative_to(ROOT)}: {name}" for path in [README, *sorted((ROOT / "docs").glob("*.md"))]
                     for name in named_keys(path.read_text(encoding="utf-8")) if name not in keys)
    assert not unknown, "the docs name run-config keys that do not exist: " + ", ".join(unknown)


# An experiment file holds its settings and the paper's claims; the project's history (issue
# numbers, commit ids) belongs to git, and a kept run's own summary.json names its code revision.
HISTORY_REFS = re.compile(r"\b[Ii]ssues? \d+|#\d{2}|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
EXPERIMENT_FILES = sorted((ROOT / "experiments").rglob("*.toml"))


def test_history_refs_pattern_matches_what_it_must():
    for text in ("Third pass (issue 31)", "issues 42 and 43", "see #42", "code ddee61c, 58 minutes", "fixed in 0701d2d"):
        assert HISTORY_REFS.search(text), text
    for text in ("100 clients", "lr 0.001", "seed 1000000", "cafebabe", "fedgam-cv-alpha0", "1e-5"):
        assert not HISTORY_REFS.search(text), text


def test_experiment_files_name_no_issue_or_commit():
    assert len(EXPERIMENT_FILES) > 12  # the reduced files and experiments/paper/
    hits = outside_references(EXPERIMENT_FILES, HISTORY_REFS)
    assert not hits, "experiment files name issues or commits (the history belongs to git):\n" + "\n".join(hits)


PERFORMANCE = ROOT / "docs" / "performance.md"


def test_the_performance_page_is_a_reference_not_a_diary():
    """docs/performance.md says what the speed is now, in at most 300 lines, naming no issue or
    commit: how the figures got there is git's history."""
    lines = PERFORMANCE.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"docs/performance.md has {len(lines)} lines; history belongs to git"
    hits = outside_references([PERFORMANCE], HISTORY_REFS)
    assert not hits, "docs/performance.md names issues or commits:\n" + "\n".join(hits)


def python_prose(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of the Python file ``path``, as (line number, line): the prose
    a reader takes for the code's explanation (string literals the code uses are left out)."""
    import io
    import tokenize

    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    prose = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                prose += [(n, lines[n - 1]) for n in range(first.lineno, first.end_lineno + 1)]
    return prose


def test_python_files_explain_without_naming_issues_or_commits():
    """A comment or docstring states the fact or the reason, not the history: no issue number and
    no commit id in any Python file of the project (the history belongs to git)."""
    files = sorted(p for p in ROOT.rglob("*.py") if not {".git", ".venv", "venv"} & set(p.relative_to(ROOT).parts))
    assert len(files) > 100
    hits = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in files
            for number, line in python_prose(path) if HISTORY_REFS.search(line) or TRACKER.search(line)]
    assert not hits, "Python files name issues or commits:\n" + "\n".join(hits)


# An internal tracker's numbers and words mean nothing to a reader of the repository.
TRACKER = re.compile(r"(?i)\bissue #\d+|\bthe issue's\b|\bmarked blocked\b")


def test_docs_refer_to_no_internal_tracker():
    hits = outside_references(DOCS, TRACKER)
    assert not hits, "references to an internal tracker:\n" + "\n".join(hits)


# --- README is the front door; the pages form a site whose links resolve -----------------------

PAGES = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```", re.MULTILINE)


def test_readme_is_short_and_every_block_in_it_is_run_by_a_test():
    from tests.kit_runs import TESTED_BLOCKS

    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, f"README.md has {len(text.splitlines())} lines; move detail to docs/"
    blocks = re.findall(r"(?:<!-- test: ([a-z-]+)\b[^>]*-->\n)?```[a-z]*\n.*?```", text, re.DOTALL)
    assert len(blocks) == len(FENCE.findall(text)) // 2, "an unterminated code block in README.md"
    assert sorted(blocks) == sorted(TESTED_BLOCKS), (
        f"README.md's code blocks {blocks} (empty = not marked) must be exactly those tests/project/test_readme.py "
        f"runs, each marked <!-- test: NAME -->: {TESTED_BLOCKS}")


def test_readme_names_the_optional_nginx_and_promises_no_test_count():
    """The live mTLS tests skip without nginx: their skip line and README's set-up name the
    install command. README gives no test count (it drifts)."""
    text = README.read_text(encoding="utf-8")
    assert "apt-get install nginx-light" in text
    assert "tests/deployment/test_deployment_mtls.py" in text
    assert (ROOT / "tests" / "deployment" / "test_deployment_mtls.py").read_text().count("(apt-get install nginx-light)") >= 2
    assert not re.search(r"\b\d[\d,]* (passed|tests)\b", text), "README promises a test count"


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading: lower case, markup and
    punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\s-]", "", text.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    text = FENCED.sub("", path.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#{1,6} (.+?)\s*$", text, re.MULTILINE)}


FENCED = re.compile(r"^\s*```.*?^\s*```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_slug_matches_mkdocs():
    assert slug("## `flwr run`: its pitfalls".lstrip("# ")) == "flwr-run-its-pitfalls"
    assert slug("Failures, bad updates and resuming") == "failures-bad-updates-and-resuming"
    assert slug("8. Scale: stateful clients at 100-1,000 clients") == "8-scale-stateful-clients-at-100-1000-clients"


def test_relative_links_of_readme_and_pages_resolve():
    """Every link that is not a URL, in README.md and every page under docs/, names a file that
    exists and, with ``#anchor``, a heading of that page (or of its own)."""
    broken = []
    for path in [README, *PAGES]:
        for target in LINK.findall(FENCED.sub("", path.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_site_lists_every_page_and_the_readme_links_every_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs" and config["strict"] is True

    def entries(nav) -> list[str]:
        out = []
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            out += entries(value) if isinstance(value, list) else [value]
        return out

    listed = entries(config["nav"])
    assert listed[0] == "index.md"  # README.md, added by scripts/mkdocs_hooks.py
    assert sorted(listed[1:]) == sorted(p.name for p in PAGES)
    readme = README.read_text(encoding="utf-8")
    assert [p.name for p in PAGES if f"](docs/{p.name})" not in readme] == []


def test_readme_becomes_the_home_page_with_its_links_relative_to_docs():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from mkdocs_hooks import readme_as_index
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    text = "[m](docs/methods.md#fedavg) ![p](docs/results/a.png) `docs/results/runs/` [f](https://x/docs/y)"
    assert readme_as_index(text) == "[m](methods.md#fedavg) ![p](results/a.png) `docs/results/runs/` [f](https://x/docs/y)"


def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict`` (as CI runs it): a broken link or anchor, a page missing from
    the nav or a README link the site cannot follow fails."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed (pip install -e '.[docs]')")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    site = tmp_path / "site"
    assert "fedgam-mnist-dir03-accuracy.png" in (site / "index.html").read_text()
    assert (site / "results" / "fedgam-mnist-dir03-accuracy.png").exists()
    assert not (site / "results" / "runs").exists()  # the kept runs are data, not pages
    reference = (site / "reference" / "index.html").read_text()  # generated from the docstrings
    for name in REFERENCED:
        assert f'id="{name}"' in reference, f"docs/reference.md shows no {name}"
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", reference)).split())
    from strategies.base import DriftFedAvg
    from tasks.functional.update import LocalUpdate

    for obj in (LocalUpdate, DriftFedAvg):  # their docstrings' first words, as the page shows them
        assert " ".join(obj.__doc__.split()[:5]) in text, obj


# The extension points docs/reference.md documents (mkdocstrings renders each under its path).
REFERENCED = ("tasks.functional.update.LocalUpdate", "tasks.functional.core.Hyper", "fl_app.node.drift_client.DriftClient",
              "strategies.base.FromConfig", "strategies.base.DriftFedAvg", "strategies.base.MEAN_OF_WEIGHTS",
              "tasks.partitioning", "tasks.partition_spec.PartitionSpec", "tasks.catalogue.DatasetInfo",
              "protocol.keys.Key", "fl_app.registry.spec", "fl_app.registry.validate_config")

