"""The runner's rows: methods, labelled variants of a method, and hyperparameter grids.

A row of a comparison is a *label*. A label is a method name (``fedavg``), or a variant that
an experiment file declares as ``[methods."<label>"]`` with ``strategy = "<method>"`` and its
own keys (so one method can appear twice with different settings), and, with a grid, the
label followed by its grid point: ``fedavg[learning-rate=0.05]``.

Where a key is set in several places, the later one wins: the experiment file's
``[run-config]``, its ``[methods.<label>]`` keys, its grid values (``[grid]``, then
``[methods.<label>.grid]``), the command line (``--dataset``, ``--rounds``, ... and ``--set``),
the command line's ``--grid``. A key given both by ``--set`` and ``--grid`` is refused; a
``--set`` key drops that key's grid from the file.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from fl_app.config import ConfigError, did_you_mean
from fl_app.registry import parse_override

# Run-config keys the runner sets for each run itself, and the flag that sets each: given by
# --set or --grid they would be replaced silently (``--grid seed=0,1`` made two rows of one seed).
RUNNER_KEYS = {"strategy": "list the methods with --strategy a,b", "seed": "list the seeds with --seeds",
               "run-name": "runs are named <label>-seed<seed>", "results-dir": "choose the folder with --out"}


def check_command_line_keys(keys, flag: str) -> None:
    """Refuse a ``RUNNER_KEYS`` key given by ``flag`` (``--set``: strategy excepted, it is read
    as the method list)."""
    for key in keys:
        if key in RUNNER_KEYS and not (flag == "--set" and key == "strategy"):
            raise ConfigError(f"{flag} {key}=... is invalid: the runner sets {key!r} for each run itself;"
                              f" {RUNNER_KEYS[key]}")


def first_repeated(values: list[Any]) -> Any:
    """The first value that ``values`` lists twice (compared as parsed: 0.01 and 1e-2 are one
    value), else None."""
    seen: list[Any] = []
    for value in values:
        if value in seen:
            return value
        seen.append(value)
    return None


def check_distinct(values: list[Any], where: str, what: str = "value") -> None:
    """Refuse a list of seeds or grid values that lists one twice: a seed is one run and a grid
    value one row, so a repeat would count one run twice (``2 seeds, 0.7000 +- 0.0000``)."""
    repeated = first_repeated(values)
    if repeated is not None:
        raise ConfigError(f"{where} is invalid: it lists {what} {_text(repeated)} twice (a {what} is one"
                          f" {'run' if what == 'seed' else 'row'}; a repeat would count it twice); give each once")


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["learning-rate=0.01,0.05"]`` -> ``{"learning-rate": [0.01, 0.05]}`` (typed per key); a
    value given twice is refused (``check_distinct``)."""
    axes: dict[str, list[Any]] = {}
    for text in items:
        if "=" not in text:
            raise ConfigError(f"--grid {text!r} is not of the form KEY=V1,V2,...")
        name, values = text.split("=", 1)
        parsed = [parse_override(f"{name}={v}") for v in values.split(",") if v.strip()]
        if not parsed:
            raise ConfigError(f"--grid {text!r} lists no values")
        axes[parsed[0][0]] = [v for _, v in parsed]
        check_distinct(axes[parsed[0][0]], f"--grid {text}")
    check_command_line_keys(axes, "--grid")
    return axes


def check_axes(axes: Any, where: str) -> dict[str, list[Any]]:
    """A grid table from an experiment file: each key maps to a non-empty list of distinct values."""
    if not isinstance(axes, dict) or not all(isinstance(v, list) and v for v in axes.values()):
        raise ConfigError(f"{where} must map run-config keys to non-empty lists of values, got {axes!r}")
    for key, values in axes.items():
        check_distinct(values, f"{where} {key} = {values!r}")
    return axes


def grid_points(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of the axes, in the order given ([{}] without axes)."""
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def label(name: str, point: dict[str, Any]) -> str:
    """``fedavg[learning-rate=0.05,local-epochs=2]`` (the bare name without a grid point)."""
    if not point:
        return name
    return f"{name}[{','.join(f'{k}={_text(v)}' for k, v in point.items())}]"


def run_name(row_label: str, seed: int) -> str:
    """A folder name for one (label, seed): ``fedavg-seed0``, ``fedavg_learning-rate=0.05-seed0``."""
    return f"{folder_stem(row_label)}-seed{seed}"


def folder_stem(row_label: str) -> str:
    """The part of a run folder's name that ``row_label`` gives: every run of characters other
    than letters, digits and ``._=+-`` becomes one ``_``."""
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", row_label).strip("_")


def check_run_names(rows: list[str]) -> None:
    """Refuse two labels that ``run_name`` cleans to one folder name (``"a/b"`` and ``"a_b"``
    both give ``a_b-seed0``): the second run would "resume" the first one's folder and report
    its result under its own label, or overwrite its record. Named both, before anything runs."""
    seen: dict[str, str] = {}
    for row in dict.fromkeys(rows):
        folder = folder_stem(row)
        if folder in seen:
            raise ConfigError(f"labels {seen[folder]!r} and {row!r} are invalid together: both are stored in the run"
                              f" folders {folder}-seed<seed> (characters other than letters, digits and ._=+- become"
                              " _); rename one of them")
        seen[folder] = row


def resolve_rows(names: list[str], per_method: dict, methods: tuple[str, ...]) -> list[tuple[str, str, dict, dict]]:
    """Per listed name: (label, strategy, its [methods.<label>] keys, its own grid axes).

    A name is a method, or a label whose ``[methods.<label>]`` table sets ``strategy``."""
    rows = []
    if len(set(names)) != len(names):
        raise ConfigError(f"strategies {names} list a label twice; give each variant its own label")
    for name in names:
        entry = dict(per_method.get(name, {}))
        strategy = entry.pop("strategy", name)
        grid = check_axes(entry.pop("grid", {}), f"[methods.{name}.grid]")
        if strategy not in methods:
            where = f"[methods.{name}] strategy" if name in per_method and strategy != name else "strategy"
            raise ConfigError(
                f"{where} {strategy!r} is invalid: not a method{did_you_mean(strategy, methods)}; valid methods:"
                f" {', '.join(methods)} (a variant label needs [methods.\"{name}\"] strategy = \"<method>\")"
            )
        rows.append((name, strategy, entry, grid))
    return rows
