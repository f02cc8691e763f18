"""Reading the data fingerprints of finished runs (``data_fingerprint`` in summary.json, written
by ``fl_app/server/provenance.py``): what a table may put together and how it says so.

A table never puts two fingerprints together: ``mixed_data`` names the two data sets (and the
runs on each) in one line for the caller to refuse with (``scripts/make_results.py``), or
``split_by_data`` splits a row into one row per data set (the runner's comparison.md/csv). A run
without a fingerprint (made before runs recorded one) is never guessed to match or differ: its
data is unknown, a data set of its own beside runs whose data is known; runs that all lack one
are labelled so (``data_line``).
"""

from __future__ import annotations

from collections.abc import Iterable

from fl_app.api import describe_data as describe
from fl_app.api import fingerprint_of
from runner.results.records import Run, as_records

NOT_RECORDED = "data fingerprint not recorded"
# Why such a run's fingerprint is not computed now from the data at hand and the split settings it
# recorded: the fingerprint's train and test entries are the sizes and SHA-256 of the files the run
# read, and a run without one kept nothing of them (no hash; its data folder's path is blanked in
# the store, and its client_label_counts.csv, where it has one, was cut when it was collected, from
# the collecting machine's data, not by the run). The split settings alone would give the partition
# entry; the files' entries would be today's files, a guess presented as a record.
NOT_RECOMPUTABLE = ("not recomputed from the data at hand: the fingerprint hashes the files a run read, and these "
                    "runs kept no trace of theirs")


def by_digest(runs: Iterable[tuple[str, dict | None]]) -> tuple[dict[str, tuple[dict, list[str]]], list[str]]:
    """({digest: (its fingerprint, run names)} in order of first appearance, the runs without one)."""
    groups: dict[str, tuple[dict, list[str]]] = {}
    missing = []
    for name, fp in runs:
        if fp is None:
            missing.append(name)
        else:
            groups.setdefault(fp["digest"], (fp, []))[1].append(name)
    return groups, missing


def mixed_data(runs: Iterable[tuple[str, dict | None]]) -> str | None:
    """None when the runs share one data set: one digest, or no fingerprint at all; else one line
    naming the first two data sets (fingerprint and what it stands for) and their runs. Runs
    without a fingerprint beside runs with one count as a data set of their own, "data unknown":
    they might be on any data, so they never share a mean or a table with runs whose data is known."""
    groups, missing = by_digest(runs)
    parts = [_runs_on(names, f"on data {describe(fp)}") for fp, names in groups.values()]
    if groups and missing:
        parts.append(_runs_on(missing, f"without a data fingerprint ({UNKNOWN}: made before runs recorded one)"))
    if len(parts) < 2:
        return None
    more = f" (and {len(parts) - 2} more data sets)" if len(parts) > 2 else ""
    return f"{parts[0]}, but {parts[1]}{more}"


UNKNOWN = "data unknown"


def _runs_on(names: list[str], data: str) -> str:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{shown} {data}"


def split_by_data(runs: dict[str, list[Run]]) -> tuple[dict[str, list[Run]], dict[str, str]]:
    """The rows of a comparison with no mean over two data sets: a row whose runs share one data
    set (``mixed_data`` None) as it is; a row whose runs do not, split in place into one row per
    data set, '<row> [data <digest>]' and '<row> [data unknown]' (runs without a fingerprint
    beside runs with one). Also {new row: the one line naming the runs of the row it was split
    from}, for the table to show why."""
    out: dict[str, list[Run]] = {}
    why: dict[str, str] = {}
    for row, dirs in runs.items():
        named = [(r.name, fingerprint_of(r.summary)) for r in as_records(dirs)]
        mixed = mixed_data(named)
        if mixed is None:
            out[row] = dirs
            continue
        for d, (_, fp) in zip(dirs, named):
            part = f"{row} [data {fp['digest'] if fp else 'unknown'}]"
            out.setdefault(part, []).append(d)
            why[part] = f"{row} split by data: {mixed}"
    return out, why


def data_line(runs: Iterable[tuple[str, dict | None]]) -> list[str]:
    """The report's label of a table's data: its fingerprint with the runs that recorded it,
    and how many runs recorded none; [] without runs."""
    groups, missing = by_digest(runs)
    parts = [f"fingerprint `{describe(fp)}` ({len(names)} runs; `fl_app/server/provenance.py`)"
             for fp, names in groups.values()]
    if missing:
        parts.append(f"{NOT_RECORDED} ({len(missing)} runs, made before runs recorded one: known only by the "
                     f"settings above; {NOT_RECOMPUTABLE})")
    if not parts:
        return []
    return [f"Data the kept runs trained and tested on: {'; '.join(parts)}.", ""]
