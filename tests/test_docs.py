"""The documentation stands on its own: the code and the docs cite docs/methods.md, never files
a user of the project does not have, and tell no session history; docs/methods.md covers every
registered method and its keys; the metric names README gives are the ones the code writes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from fl_app.registry import METHODS
from fl_app.tooling.experiment import ENTRIES as EXPERIMENT_ENTRIES

ROOT = Path(__file__).resolve().parent.parent
METHODS_DOC = ROOT / "docs" / "methods.md"
CODE_PACKAGES = ("fl_app", "clients", "strategies", "tasks")
# References to material outside the repository: the sibling folder, the pinned-formula file
# and the numbered paper texts that live there (docs/methods.md, lower case, is ours).
OUTSIDE = re.compile(r"\.\./shared|METHODS\.md|(?i:papers? 00\d)")
# Narrated history ("in the fourth session", "changed this session"): docs state what holds.
HISTORY = re.compile(
    r"(?i)\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|this|that|previous|last|next) session\b"
)
README = ROOT / "README.md"
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
    assert not hits, "narrated history (date it, or move it to docs/performance.md):\n" + "\n".join(hits)


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
        for side in (method.strategy, method.client)
        for key in getattr(side, "CONFIG_KEYS", {})
        if f"`{key}`" not in text
    )
    assert not missing, "keys not documented in docs/methods.md: " + ", ".join(missing)


# --- the metric names README and docs/methods.md give are the ones the code writes ---------

CLIENT_SUFFIXES = ("_mean", "_min", "_max")  # a client metric x is recorded as x_mean/_min/_max
NAME = re.compile(r"[a-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*")


def is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def written_names() -> set[str]:
    """Names the code can write as metrics or metrics.csv columns: string keys of dict literals,
    of subscript assignments (``metrics["x"] = ...``) and of ``.update(x=...)`` keywords, and the
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


def readme_metrics_csv_names() -> list[str]:
    """The column names README's `metrics.csv` bullet (section Results) gives: every item of a
    backticked comma list, and every other backticked lower-case name with an underscore."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^- `metrics\.csv`:(.*?)(?=^- |^\s*$)", text, re.MULTILINE | re.DOTALL)
    assert match, "README has no '- `metrics.csv`:' bullet"
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


def test_readme_metric_names_exist():
    written = written_names()
    assert {"cv_norm", "feddyn_h_norm", "round", "test_accuracy"} <= written  # the scan finds both kinds
    per_method = methods_doc_metric_names()
    assert {"cv_norm", "smoo_s_norm", "prox_loss", "dp_epsilon"} <= set(per_method)  # the scan finds them
    names = per_method + readme_metrics_csv_names()
    assert len(names) > 20, names
    bad = [n for n in names if not NAME.fullmatch(n)]
    assert not bad, f"README metric names that are not names: {bad}"
    missing = unknown(names, written)
    assert not missing, f"README names metrics the code does not write: {', '.join(missing)}"


# --- every run-config key the docs name exists ------------------------------------------------

SET_KEY = re.compile(r"--(?:set|grid)[ =]['\"]?([a-z][a-z0-9-]*)=")
RUN_CONFIG = re.compile(r"--run-config[ =]\"([^\"]+)\"")
ASSIGNED = re.compile(r"`([a-z][a-z0-9-]*) ?= ?[^`]+`")  # `key = value` in running text
# Names the docs assign that are not run-config keys, each with where it belongs: experiment
# file entries (fl_app/tooling/experiment.py), a SuperNode's node config, Flower's federation settings.
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
    from fl_app.config import spec

    keys = set(spec())
    unknown = sorted(f"{path.relative_to(ROOT)}: {name}" for path in [README, *sorted((ROOT / "docs").glob("*.md"))]
                     for name in named_keys(path.read_text(encoding="utf-8")) if name not in keys)
    assert not unknown, "the docs name run-config keys that do not exist: " + ", ".join(unknown)


# An internal tracker's numbers and words mean nothing to a reader of the repository.
TRACKER = re.compile(r"(?i)\bissue #\d+|\bthe issue's\b|\bmarked blocked\b")


def test_docs_refer_to_no_internal_tracker():
    hits = outside_references(DOCS, TRACKER)
    assert not hits, "references to an internal tracker:\n" + "\n".join(hits)
