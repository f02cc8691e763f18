"""The runs a report reads, each run folder read once (``fl_app.api.read_run``): every function of
``runner.results`` takes a row's runs as folders or as records already read, and reads the
folders it is given here, so a report that reads its rows first (``read_rows``, the runner's
report step) reads no file twice."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from fl_app.api import RunRecord, read_run, with_label_counts

Run = Path | RunRecord  # a run folder, or its records read already


def as_records(runs: Iterable[Run]) -> list[RunRecord]:
    """The records of ``runs``, reading only the folders among them."""
    return [as_record(r) for r in runs]


def read_rows(rows: dict[str, list[Run]]) -> dict[str, list[RunRecord]]:
    """{row: its runs' records}, each folder read once."""
    return {row: as_records(runs) for row, runs in rows.items()}


def as_record(run: Run, label_counts: bool = False) -> RunRecord:
    """One run's records (its folder read, unless read already); with ``label_counts``, its
    clients' label counts cut again from the data where the run recorded none
    (``fl_app.api.with_label_counts``)."""
    record = run if isinstance(run, RunRecord) else read_run(run)
    return with_label_counts(record) if label_counts else record
