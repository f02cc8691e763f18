"""Reading an experiment file (TOML, see experiments/): the one place its entries and their
types are checked, for the runner (``run_simulation.py --config``) and for
``scripts/make_results.py``.

Every problem is a one-line ``ConfigError`` naming the file, the entry and the expected type,
before anything is launched: a TOML syntax error, an unknown entry, ``clients = "10"`` (a
string, not an integer), ``strategies = "fedavg,fedprox"`` (a string, which would otherwise be
read letter by letter), a ``[run-config]`` that is not a table, a key the runner sets for
each run itself (``strategy = "fedavg"`` in ``[run-config]`` would replace the file's
``strategies``; ``PER_RUN_KEYS``), ... The values of the
run-config keys themselves are checked by ``fl_app.registry.validate_config``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from fl_app.config import KEYS_LISTED, ConfigError, did_you_mean


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _table(v: Any) -> bool:
    return isinstance(v, dict)


# entry -> (check, the expected type in words)
ENTRIES: dict[str, tuple[Any, str]] = {
    "name": (_text, "a string"),
    "paper": (_text, "a string"),
    "description": (_text, "a string"),
    "reduction": (_text, "a string"),
    "findings": (_text, "a string"),
    "strategies": (lambda v: isinstance(v, list) and bool(v) and all(_text(s) for s in v),
                   'a non-empty list of method names or labels, e.g. ["fedavg", "fedprox"]'),
    "seeds": (lambda v: isinstance(v, list) and bool(v) and all(_int(s) for s in v),
              "a non-empty list of integers, e.g. [0, 1]"),
    "clients": (lambda v: _int(v) and v >= 1, "an integer >= 1, e.g. 10"),
    "run-config": (_table, "a table of run-config keys ([run-config])"),
    "methods": (lambda v: _table(v) and all(_table(t) for t in v.values()),
                'tables of run-config keys, one per label ([methods."<label>"])'),
    "grid": (_table, "a table of run-config keys to lists of values ([grid])"),
    "paper-results": (lambda v: _table(v) and all(_number(x) for x in v.values()),
                      "a table of label = accuracy (numbers)"),
    "target-accuracy": (lambda v: _number(v) and 0 < v < 1, "a number between 0 and 1"),
    "claims": (lambda v: isinstance(v, list) and all(_text(c) for c in v),
               'a list of the paper\'s orderings, e.g. ["fedgam > fedavg (Table 3)"]'),
    # the tuning protocol and how rows not tuned by it were set (runner/tuning.py)
    "tune": (_table, "a table: seeds, budget, metric, validation-fraction, untuned, [tune.grid], [tune.<row>]"),
    "chosen-by": (lambda v: _table(v) and all(_text(x) for x in v.values()),
                  'a table of row label (or "all") = how its settings were chosen, e.g. all = "fixed from the paper"'),
}


def read_experiment(path: Path | str) -> dict:
    """The experiment file's entries, checked; ``ConfigError`` (one line) on any problem."""
    path = Path(path)
    try:
        exp = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"experiment file {path}: cannot be read ({exc.strerror or exc})") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"experiment file {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(exp) - set(ENTRIES))
    if unknown:
        named = ", ".join(f"{k!r}{did_you_mean(k, ENTRIES)}" for k in unknown)
        raise ConfigError(f"experiment file {path}: unknown entr{'ies' if len(unknown) > 1 else 'y'} {named}; valid"
                          f" entries: {', '.join(sorted(ENTRIES))}")
    for key, value in exp.items():
        check, expected = ENTRIES[key]
        if not check(value):
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            raise ConfigError(f"experiment file {path}: entry {key!r} = {shown} has the wrong type"
                              f" ({type(value).__name__}); expected {expected}")
    check_per_run_keys(exp, path)
    check_run_config_keys(exp, path)
    check_keys_reach_a_run(exp, path)
    from runner.plan import check_distinct
    from runner.tuning import read_protocol

    check_distinct(exp.get("seeds", []), f"experiment file {path}: entry 'seeds' = {exp.get('seeds')!r}", "seed")

    read_protocol(exp, list(exp.get("strategies", [])), path)
    rows = set(exp.get("strategies", [])) | {"all"}
    stray = sorted(set(exp.get("chosen-by", {})) - rows)
    if stray:
        raise ConfigError(f"experiment file {path}: [chosen-by] names {stray}, not rows of the file; valid: "
                          f"{', '.join(sorted(rows))}")
    return exp


# Run-config keys the runner sets for each run itself: in [run-config] or a grid they would be
# replaced silently (a [run-config] strategy once turned a file's three methods into one run).
PER_RUN_KEYS = {
    "strategy": "list the methods in 'strategies' (a variant's method goes in [methods.\"<label>\"] strategy)",
    "seed": "list the seeds in 'seeds'",
    "run-name": "each run is named <label>-seed<seed> by the runner",
    "results-dir": "the runner writes into <out>/runs (run_simulation.py --out)",
}


def key_tables(exp: dict) -> list[tuple[str, dict]]:
    """The file's tables of run-config keys, each with where it is: [run-config], [grid], each
    [methods.<label>] (less its strategy and grid) and its grid. ([tune.grid] and [tune.<row>]
    are read_protocol's, runner/tuning.py.)"""
    tables = [("[run-config]", exp.get("run-config", {})), ("[grid]", exp.get("grid", {}))]
    for label, entry in exp.get("methods", {}).items():
        tables.append((f"[methods.{label}]", {k: v for k, v in entry.items() if k not in ("strategy", "grid")}))
        tables.append((f"[methods.{label}.grid]", entry.get("grid", {})))
    return [(where, table) for where, table in tables if isinstance(table, dict)]


def check_run_config_keys(exp: dict, path: Path) -> None:
    """Refuse a misspelled run-config key in one of the file's tables (``key_tables``), naming
    the table and the closest valid key, not the list of all of them (``KEYS_LISTED``)."""
    from fl_app.registry import spec

    keys = spec()
    for where, table in key_tables(exp):
        unknown = sorted(set(table) - set(keys))
        if unknown:
            named = ", ".join(f"{k!r}{did_you_mean(k, keys)}" for k in unknown)
            raise ConfigError(f"experiment file {path}: {where} names unknown run-config"
                              f" key{'s' if len(unknown) > 1 else ''} {named}; {KEYS_LISTED}")


def check_keys_reach_a_run(exp: dict, path: Path) -> None:
    """Refuse what the file sets but no run would read (``runner.plan``): a ``[methods.<label>]``
    table for a label ``strategies`` does not list, a key of a ``[methods.<label>]`` table or of
    its grid that the label's method does not read (``proximal-mu`` for FedAvg), a
    ``[run-config]`` or ``[grid]`` key that no listed method reads. A label that names no
    method is refused with the rows (``runner.plan.resolve_rows``), so its keys are not judged here."""
    from fl_app.registry import method_names
    from runner.plan import check_keys_read, check_read_by_some

    where = f"experiment file {path}:"
    listed = list(exp.get("strategies", []))
    methods = exp.get("methods", {})
    if "strategies" in exp:
        for name in methods:
            if name not in listed:
                raise ConfigError(f"{where} [methods.{name}] is a table for a row that 'strategies' does not list"
                                  f"{did_you_mean(name, listed)}; listed: {', '.join(listed)}; list it, or remove"
                                  " the table")
    strategy = {name: methods.get(name, {}).get("strategy", name) for name in {*listed, *methods}}
    for name, entry in methods.items():
        if strategy[name] in method_names():
            keys = [k for k in entry if k not in ("strategy", "grid")]
            check_keys_read(keys, strategy[name], f"{where} [methods.{name}]")
            grid = entry.get("grid", {})
            check_keys_read(grid if isinstance(grid, dict) else {}, strategy[name], f"{where} [methods.{name}.grid]")
    rows = [strategy[name] for name in listed]
    if rows and all(method in method_names() for method in rows):
        check_read_by_some(exp.get("run-config", {}), rows, f"{where} [run-config] {{key}}")
        check_read_by_some(exp.get("grid", {}), rows, f"{where} [grid] {{key}}")


def check_per_run_keys(exp: dict, path: Path) -> None:
    """Refuse a key of ``PER_RUN_KEYS`` in ``[run-config]``, ``[grid]``, a
    ``[methods.<label>]`` table (``strategy`` excepted: it names a variant's method) or its grid."""
    tables = [("[run-config]", exp.get("run-config", {}), PER_RUN_KEYS),
              ("[grid]", exp.get("grid", {}), PER_RUN_KEYS)]
    for label, entry in exp.get("methods", {}).items():
        tables.append((f"[methods.{label}]", entry, {k: v for k, v in PER_RUN_KEYS.items() if k != "strategy"}))
        tables.append((f"[methods.{label}.grid]", entry.get("grid", {}), PER_RUN_KEYS))
    for where, table, refused in tables:
        for key in refused:
            if isinstance(table, dict) and key in table:
                raise ConfigError(f"experiment file {path}: {where} sets {key!r} = {table[key]!r}, a key the runner"
                                  f" sets for each run itself; {refused[key]}")
