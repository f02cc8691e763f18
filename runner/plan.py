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

A key is given only where a method reads it (``fl_app.registry.keys_read``: the general keys,
which every run reads, and the method's own): a ``[methods.<label>]`` key, or one of its grid,
that the row's method does not read is refused, and so is a ``--set`` (or ``[run-config]``) key
that no listed method reads. A grid shared by every row (``--grid``, ``[grid]``) is a grid of
the rows whose method reads its key and leaves the others as they are (``row_axes``): with
``--grid scaffold-correction=direction,post-step --strategy fedavg,scaffold`` FedAvg runs once,
not twice under two labels with one config; a shared grid key that no listed method reads is
refused.

Every run folder's name (``run_name``) fits the file systems' limit on one name
(``NAME_MAX`` bytes; ``check_run_names``), or the launch would stop on "File name too long".
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from fl_app.config import ConfigError, did_you_mean
from fl_app.registry import config_keys, get_method, keys_read, parse_override, readers

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


# The longest name of one folder or file: 255 bytes on ext4, XFS, btrfs, ZFS, tmpfs and APFS (NTFS:
# 255 UTF-16 units), whatever the length of the whole path.
NAME_MAX = 255


def shown(text: str, width: int = 60) -> str:
    """``text`` cut to ``width`` characters for a one-line message (``...`` where it was cut)."""
    return text if len(text) <= width else text[: width - 3] + "..."


def check_name_length(name: str, what: str, fix: str) -> None:
    """Refuse a folder name longer than ``NAME_MAX`` bytes (its UTF-8 encoding): creating it
    fails with "File name too long" on every common file system. ``what``: what gave the name;
    ``fix``: how to shorten it, for the one line."""
    size = len(name.encode())
    if size > NAME_MAX:
        raise ConfigError(f"{what} is invalid: its folder name {shown(name)!r} is {size} bytes, over the {NAME_MAX}"
                          f" a folder name may have on common file systems (\"File name too long\"); {fix}")


def check_run_names(rows: list[str], seeds: list[int] | tuple[int, ...] = (0,)) -> None:
    """Refuse two labels that ``run_name`` cleans to one folder name (``"a/b"`` and ``"a_b"``
    both give ``a_b-seed0``): the second run would "resume" the first one's folder and report
    its result under its own label, or overwrite its record. Named both, before anything runs.
    And refuse a label whose run folder (``run_name`` with the longest of ``seeds``) is longer
    than a file system allows (``check_name_length``): the launch would fail on it, and so
    would every ``--resume``."""
    seen: dict[str, str] = {}
    longest = max(seeds, key=lambda seed: len(str(seed)), default=0)
    for row in dict.fromkeys(rows):
        folder = folder_stem(row)
        if folder in seen:
            raise ConfigError(f"labels {seen[folder]!r} and {row!r} are invalid together: both are stored in the run"
                              f" folders {folder}-seed<seed> (characters other than letters, digits and ._=+- become"
                              " _); rename one of them")
        seen[folder] = row
        check_name_length(run_name(row, longest), f"label {shown(row)!r} (seed {longest})",
                          "give the row a shorter label (a variant's [methods.\"<label>\"] name, or shorter grid"
                          " values)")


# ---- keys only where a method reads them ---------------------------------------------------------

def unread(key: str, strategy: str) -> str:
    """Why ``key`` changes nothing in a run of ``strategy``, for a one-line refusal: the
    closest key the method has (did-you-mean), the methods that do read it, the method's own
    keys."""
    own = sorted(config_keys(get_method(strategy)))
    by = readers(key)
    return (f"method {strategy!r} does not read {key!r}{did_you_mean(key, own)}"
            f" ({'read by ' + ', '.join(by) if by else 'no method reads it'}); {strategy}'s own keys:"
            f" {', '.join(own) if own else 'none (it reads only the general keys: run_simulation.py --list keys)'}")


def check_keys_read(keys, strategy: str, where: str) -> None:
    """Refuse a key of ``keys`` (a ``[methods.<label>]`` table or its grid, a ``[tune.<row>]``
    table) that the row's method ``strategy`` does not read: it would run as if not given."""
    reads = keys_read(strategy)
    for key in keys:
        if key not in reads:
            raise ConfigError(f"{where} sets {key!r}, which changes nothing: {unread(key, strategy)}")


def check_read_by_some(keys, strategies: list[str], where: str) -> None:
    """Refuse a key of ``keys`` (given for every row: ``--set``, ``--grid``, ``[run-config]``,
    ``[grid]``) that none of the rows' methods ``strategies`` reads: it would change no run.
    ``where`` is formatted with ``key``."""
    methods = list(dict.fromkeys(strategies))
    for key in keys:
        if not any(key in keys_read(method) for method in methods):
            by = readers(key)
            raise ConfigError(f"{where.format(key=key)} is invalid: no listed method reads {key!r}"
                              f" ({'read by ' + ', '.join(by) if by else 'no method reads it'}; listed:"
                              f" {', '.join(methods)}); list a method that reads it, or drop the key")


def row_axes(strategy: str, *grids: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The grid of one row of method ``strategy``: ``grids`` merged in order (a later one's
    values win), less the keys the method does not read. A key it does not read would give it
    one row per value, all the same run under different labels; it runs once instead."""
    reads = keys_read(strategy)
    merged: dict[str, list[Any]] = {}
    for axes in grids:
        merged.update(axes)
    return {key: values for key, values in merged.items() if key in reads}


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
