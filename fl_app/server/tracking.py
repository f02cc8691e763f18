"""Per-round side outputs of a run besides metrics.csv: the per-class test accuracy and the
experiment trackers named by the run-config key ``tracking``.

- ``per_class_accuracy.csv``: ``round, class_0, ..., class_<C-1>``, one row per round, the
  global model's accuracy on each class of the test split (empty for a class absent there).
- ``tracking``: ``"tensorboard"`` (the default), ``"mlflow"``, ``"wandb"``, a comma list of
  them, or ``"none"``. Each tracker gets the run config (at the start), every numeric column
  of each round's metrics.csv row (name = column, step = round) plus
  ``per_class_accuracy/class_<c>``, the initial model's as step 0 (``test_accuracy``,
  ``test_loss``, ``min_class_accuracy``, the per-class ones: round 0 of the run's plots), and the
  numeric entries of summary.json when the run ends.

  - ``tensorboard``: event files in ``<run-dir>/tensorboard`` via
    ``torch.utils.tensorboard.SummaryWriter`` (extra ``tracking``); skipped without a word when
    the package is missing, as it is the default. The older key ``tensorboard = false`` still
    turns it off. The run config goes in as text (``run_config``), the summary as scalars
    ``summary/<name>`` at the last round.
  - ``mlflow`` (extra ``mlflow``): one MLflow run named after the run folder, in experiment
    ``fl-drift``, params = the run config, metrics per round, summary as ``summary.<name>``
    metrics. Store: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<results-dir>/mlflow.db``
    (MLflow 3 refuses its plain ``./mlruns`` file store unless ``MLFLOW_ALLOW_FILE_STORE=true``).
  - ``wandb`` (extra ``wandb``): one W&B run in project ``fl-drift`` (``WANDB_PROJECT``
    overrides), folder ``<run-dir>/wandb``; ``WANDB_MODE=offline`` needs no network or account
    (``wandb sync`` uploads it later).

  A tracker that is named but not installed (mlflow, wandb) stops the run at start with one
  line naming the extra to install.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import time
from pathlib import Path

import numpy as np

from fl_app.common.files import replacing
from fl_app.common.trackers import parse_tracking
from protocol.keys import ConfigError

log = logging.getLogger("flwr.fl_drift")

PER_CLASS_FILE = "per_class_accuracy.csv"
TENSORBOARD_DIR = "tensorboard"
EXPERIMENT = "fl-drift"  # MLflow experiment and W&B project


def trackers(cfg: dict) -> tuple[str, ...]:
    """The trackers a run config asks for: ``tracking``, less tensorboard when the older key
    ``tensorboard`` is false."""
    names = parse_tracking(cfg.get("tracking", "tensorboard"))
    if not cfg.get("tensorboard", True):
        names = tuple(n for n in names if n != "tensorboard")
    return names


def numeric(values: dict) -> dict[str, float]:
    """The finite numbers of ``values`` (bools and text left out), as floats."""
    return {k: float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def _missing(name: str) -> ConfigError:
    return ConfigError(f"run-config key 'tracking' names {name!r} but the {name} package is not installed;"
                       f" install the extra: pip install -e \".[{name}]\"")


def summary_writer(log_dir: Path):
    """A ``SummaryWriter`` for ``log_dir``, or None when tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # the optional dependency is absent: no event files
        return None
    return SummaryWriter(log_dir=str(log_dir))


def write_per_class(run_dir: Path, server_round: int, accuracies) -> None:
    """Add (or replace, after a resume) ``server_round``'s row of per_class_accuracy.csv."""
    path = Path(run_dir) / PER_CLASS_FILE
    rows: list[list[str]] = []
    if path.exists():
        with path.open(newline="") as f:
            rows = [r for r in list(csv.reader(f))[1:] if r and int(r[0]) < server_round]
    cells = ["" if not math.isfinite(a) else repr(float(a)) for a in accuracies]
    rows.append([str(server_round), *cells])
    width = max(len(r) for r in rows) - 1
    with replacing(path, newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["round", *(f"class_{c}" for c in range(width))])
        writer.writerows(rows)


class TensorBoardTracker:
    """Event files in ``<run-dir>/tensorboard``; opened at the first round (its import is slow)."""

    def __init__(self, run_dir: Path, cfg: dict):
        self.dir, self.cfg = Path(run_dir) / TENSORBOARD_DIR, cfg
        self.writer = None
        self.absent = False
        self.last_step = 0

    def log(self, step: int, values: dict[str, float]) -> None:
        if self.writer is None and not self.absent:
            self.writer = summary_writer(self.dir)
            self.absent = self.writer is None
            if self.writer is not None:
                self.writer.add_text("run_config", json.dumps(self.cfg, indent=1, default=str), 0)
        if self.writer is None:
            return
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()
        self.last_step = step

    def close(self, summary: dict[str, float]) -> None:
        if self.writer is not None:
            for name, value in summary.items():
                self.writer.add_scalar(f"summary/{name}", value, self.last_step)
            self.writer.close()
            self.writer = None


class MLflowTracker:
    """One MLflow run: params = the run config, metrics per round, summary metrics at the end."""

    def __init__(self, run_dir: Path, cfg: dict):
        try:
            from mlflow import MlflowClient
            from mlflow.entities import Param
        except ImportError:
            raise _missing("mlflow") from None
        uri = os.environ.get("MLFLOW_TRACKING_URI") or mlflow_default_uri(run_dir)
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(EXPERIMENT)
        self.run_id = self.client.create_run(experiment_id, run_name=Path(run_dir).name).info.run_id
        params = [Param(k, str(v)) for k, v in cfg.items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        log.info("mlflow: run %s in %s", self.run_id, uri)

    def _metrics(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(prefix + k, v, stamp, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log(self, step: int, values: dict[str, float]) -> None:
        self._metrics(step, values)

    def close(self, summary: dict[str, float]) -> None:
        self._metrics(0, summary, prefix="summary.")
        self.client.set_terminated(self.run_id)


def mlflow_default_uri(run_dir: Path) -> str:
    """``sqlite:///<results-dir>/mlflow.db``: one store for every run of a results folder (made
    now if it is not there: the run opens its MLflow run before its own folder exists)."""
    Path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(Path(run_dir).parent / 'mlflow.db').resolve()}"


class WandbTracker:
    """One W&B run in ``<run-dir>/wandb``: config, per-round log, summary, finish."""

    def __init__(self, run_dir: Path, cfg: dict):
        try:
            import wandb
        except ImportError:
            raise _missing("wandb") from None
        Path(run_dir).mkdir(parents=True, exist_ok=True)  # the W&B run writes its files there from the start
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", EXPERIMENT), name=Path(run_dir).name,
                              dir=str(run_dir), config=cfg, reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True))

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self, summary: dict[str, float]) -> None:
        import wandb

        self.run.summary.update(summary)
        self.run.finish()
        # finish() can return before W&B's service has written the run's record file (seen
        # offline: 7 of 1620 bytes); teardown waits for it, so the run is complete on disk.
        wandb.teardown()


BACKENDS = {"tensorboard": TensorBoardTracker, "mlflow": MLflowTracker, "wandb": WandbTracker}


class RunTracker:
    """Writes a run's per-class accuracy file and sends its config, rounds and summary to the
    trackers the run config names (``tracking``). MLflow and W&B runs open here, so a missing
    package or an unreachable store stops the run before training."""

    def __init__(self, run_dir: Path, cfg: dict):
        self.run_dir = Path(run_dir)
        self.backends = [BACKENDS[name](self.run_dir, cfg) for name in trackers(cfg)]

    def log_round(self, row: dict, per_class=None) -> None:
        server_round = int(row["round"])
        if per_class is not None and len(per_class):
            write_per_class(self.run_dir, server_round, per_class)
        self._send(server_round, row, per_class)

    def log_initial(self, values: dict, per_class=None) -> None:
        """Round 0, the initial model's evaluation (``test_accuracy``, ``test_loss``, ...), at
        step 0 of every tracker, so their curves start where the run's plots do (metrics.csv
        and per_class_accuracy.csv hold the trained rounds; summary.json the initial ones)."""
        self._send(0, values, per_class)

    def _send(self, step: int, row: dict, per_class) -> None:
        values = numeric({k: v for k, v in row.items() if k != "round"})
        classes = np.asarray(per_class if per_class is not None else [], dtype=float)
        values.update(numeric({f"per_class_accuracy/class_{c}": v for c, v in enumerate(classes)}))
        for backend in self.backends:
            backend.log(step, values)

    def close(self) -> None:
        """Send the numeric entries of summary.json (written before this is called) and close."""
        path = self.run_dir / "summary.json"
        summary = numeric(json.loads(path.read_text())) if path.exists() else {}
        for backend in self.backends:
            backend.close(summary)
        self.backends = []
