"""The run folder's record files and their schema, in one module that the server (the writer,
``fl_app/server/recording.py``, ``provenance.py``) and every reader (the resumed ServerApp,
``runner/results/``, scripts/) import:

- ``metrics.csv`` (``METRICS_FILE``): one row per round, the ``BASE_COLUMNS`` first, then the
  method's, the drift and the cost columns in the order they first appear; an empty cell is a
  value not measured that round (``write_metrics``, ``read_metrics``);
- ``summary.json`` (``SUMMARY_FILE``): the run's summary, its data fingerprint under
  ``FINGERPRINT_KEY`` (``read_summary``);
- ``data-fingerprint.json`` (``FINGERPRINT_FILE``): the data fingerprint, written when the run
  starts.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from fl_app.common.files import replacing

METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
FINGERPRINT_FILE = "data-fingerprint.json"  # in the run folder, written when the run starts
FINGERPRINT_KEY = "data_fingerprint"  # summary.json's key of the same fingerprint

BASE_COLUMNS = [
    "round", "test_accuracy", "test_loss", "train_loss",
    "num_clients", "num_failures", "num_rejected", "num_dropped", "round_seconds",
]


def write_metrics(run_dir: Path, columns: list[str], rows: list[dict]) -> None:
    """``rows`` as the whole metrics.csv of ``run_dir`` (``replacing``: a reader sees the
    previous rows or all of them, a failed write leaves no temp file); a cell a row lacks is left empty."""
    with replacing(Path(run_dir) / METRICS_FILE, newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.csv rows with numeric values parsed (empty cells -> None)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            rows.append({k: _num(v) for k, v in row.items()})
    return rows


def read_summary(run_dir: Path) -> dict | None:
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.exists() else None


def _num(text: str):
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value
