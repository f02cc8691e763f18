"""The run's record: one metrics.csv row per round and summary.json (``RunRecorder``), and the
checks every reply passes before screening (``check_reply``, ``in_node_order``).

Per round ``fl_app/server/server.py`` writes one row to ``<results-dir>/<run-name>/metrics.csv``: round,
test_accuracy, test_loss, train_loss, num_clients, num_failures, num_rejected,
round_seconds, fit_phase_seconds (sampling to the last reply), aggregate_seconds (the last
reply to the new global model: checks, screening, drift columns, the method's aggregation) and
evaluate_seconds (the server's evaluation, and the clients' with a local test split; about 0
in a round that does not evaluate), then the method's metrics (client metrics as
``<name>_mean/_min/_max``, e.g. ``fit_seconds_mean``: the clients' compute, split by
``prepare_seconds`` and ``train_seconds``, ``fl_app.node.node_client.round_timings``; server
metrics as reported), and what the round cost in traffic, measured from the messages
themselves: ``bytes_down_per_client`` and ``bytes_up_per_client``, the arrays' ``nbytes`` summed
over each FitIns sent (after ``drop-rate``'s drops) and each FitRes received (rejected ones
too: they were sent), mean over those clients (``message_nbytes``; a method that sends extra
arrays, control variates say, shows them). At the last round it writes ``summary.json``
(with the initial model's ``initial_accuracy`` and ``initial_loss``, round 0 of the plots; absent
after a resume; and the
``data_fingerprint`` of ``fl_app/server/provenance.py``, also kept from round 1 in
``data-fingerprint.json``).
Every method also gets the drift columns of ``fl_app/server/drift.py`` (from the accepted replies,
before aggregation) and ``min_class_accuracy``; ``fl_app/server/tracking.py`` writes the per-class
accuracy file and sends the run to the trackers of ``tracking`` (TensorBoard, MLflow, W&B).

A result whose arrays contain NaN/Inf, or whose count or shapes differ from what was sent, is
rejected before screening and before the method's strategy sees it (``num_rejected``).
"""

from __future__ import annotations

import io
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
from flwr.common import FitRes, Parameters, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy

from fl_app.common.divergence import divergence
from fl_app.common.faults import PARTITION_METRIC
from fl_app.common.files import atomic_write_text
from fl_app.common.run_files import BASE_COLUMNS, FINGERPRINT_KEY, SUMMARY_FILE, write_metrics
from fl_app.server.checkpoint import Checkpoint
from fl_app.server.provenance import DataChanged, record_fingerprint, resumed_fingerprint, run_facts
from protocol.layout import reply_problem
from strategies.arrays import total_clients
from tasks.datasets import input_shape
from tasks.train import accuracy_spread

log = logging.getLogger("flwr.fl_drift")

# Client metrics that are bookkeeping, not method metrics.
_SKIP_CLIENT_METRICS = {"train_loss", "num_steps", PARTITION_METRIC}


def array_views(parameters: Parameters) -> list[np.ndarray]:
    """A reply's arrays as read-only views of its bytes, for checking them: Flower's
    ``parameters_to_ndarrays`` (``np.load``) copies (3-17 ms per 6.6 MB model), and the strategy
    decodes each reply again to aggregate it. Anything but plain npy falls back to Flower's."""
    if parameters.tensor_type != "numpy.ndarray":
        return parameters_to_ndarrays(parameters)
    out = []
    for blob in parameters.tensors:
        stream = io.BytesIO(blob)
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            return parameters_to_ndarrays(parameters)
        if dtype.hasobject:
            return parameters_to_ndarrays(parameters)
        flat = np.frombuffer(blob, dtype=dtype, count=math.prod(shape), offset=stream.tell())
        out.append(flat.reshape(shape, order="F" if fortran else "C"))
    return out


def message_nbytes(messages: list[Parameters]) -> float | None:
    """Mean over the messages of the sum of their arrays' ``nbytes`` (the payload, without npy
    headers or Flower's framing); None without messages. One Parameters object sent to several
    clients counts once per client: it travels once to each."""
    if not messages:
        return None
    return sum(sum(int(a.nbytes) for a in array_views(m)) for m in messages) / len(messages)


def summarise_client_metrics(results: list[tuple[int, dict]]) -> dict[str, float]:
    """train_loss as the n_k-weighted mean; every other numeric metric as mean/min/max."""
    out: dict[str, float] = {}
    total = sum(n for n, _ in results)
    if total > 0:
        out["train_loss"] = sum(n * float(m.get("train_loss", 0.0)) for n, m in results) / total
    names = sorted({k for _, m in results for k in m} - _SKIP_CLIENT_METRICS)
    for name in names:
        values = [float(m[name]) for _, m in results if isinstance(m.get(name), (int, float))]
        if values:
            out[f"{name}_mean"] = float(np.mean(values))
            out[f"{name}_min"] = float(np.min(values))
            out[f"{name}_max"] = float(np.max(values))
    return out


def client_accuracy_stats(accuracies: list[float]) -> dict[str, float]:
    """The clients' scores of the global model on their local test splits as metrics.csv
    columns: mean, std and worst 10% as ``tasks.train.accuracy_spread`` defines them."""
    mean, std, worst, n = accuracy_spread(accuracies)
    return {"client_accuracy_mean": mean, "client_accuracy_std": std, "client_accuracy_worst10": worst,
            "client_eval_clients": n}


def evaluated_round(server_round: int, every: int, last_round: int) -> bool:
    """Server evaluation runs at round 0 (the initial model), every ``every`` rounds, and
    always at the last round, so a run's final accuracy is always measured."""
    return server_round == 0 or server_round % every == 0 or server_round >= last_round


def check_reply(res: FitRes, sent_shapes: list[tuple] | None, more: bool = False) -> str:
    """Why a reply cannot be used ('' when it can): ``protocol.layout.reply_problem`` on its
    arrays (another count or shapes than were sent, or non-finite values; ``more``: groups follow
    that answer nothing sent)."""
    return reply_problem(array_views(res.parameters), sent_shapes, more=more)


def in_node_order(results: list[tuple[ClientProxy, FitRes]], client_manager) -> list[tuple[ClientProxy, FitRes]]:
    """Results in partition order, not the order they arrived in: float sums depend on
    the order, and a method that amplifies small differences (one went, at lr 0.05, from
    0.64 to 0.10 test accuracy between two runs of the same seed) must still give
    the same run for the same seed."""
    ordered = getattr(client_manager, "ordered", None)
    if ordered is None:
        return list(results)
    rank = {cid: i for i, cid in enumerate(ordered([client.cid for client, _ in results]))}
    return sorted(results, key=lambda r: rank[r[0].cid])


class RunRecorder:
    """Writes metrics.csv and summary.json of one run (``fl_app.api.RunRecord`` reads them
    back). ``row`` is the round in progress: the server's steps fill it and ``write_row``
    appends it; a resumed run starts from the rows of the rounds its checkpoint covers
    (``resume``). The run folder is made by the first file written into it (``folder``), not
    before: a run that fails before it has anything to record leaves no empty folder in the
    results."""

    def __init__(self, cfg: dict, run_dir: Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.rows: list[dict] = []
        self.columns = list(BASE_COLUMNS)
        self.row: dict = {}
        self.run_started = time.monotonic()
        self.elapsed_before = 0.0
        self.initial: dict[str, float] = {}  # the initial model's test accuracy and loss (round 0)
        self.fingerprint: dict | None = None  # the data's fingerprint (``record_fingerprint``)
        self.facts: dict = {}  # what the server adds to summary.json (the execution path and why)
        self.resumed = False  # continues a checkpoint (``resume``), else starts its files anew
        self.started_on: dict | None = None  # the resumed checkpoint's data fingerprint

    def resume(self, checkpoint: Checkpoint, previous_rows: list[dict]) -> None:
        """Continue the run of ``checkpoint``: its elapsed time, the rows it covers and the data
        fingerprint it carries (checked against the data at the first round)."""
        self.resumed = True
        self.started_on = checkpoint.data_fingerprint
        self.elapsed_before = checkpoint.elapsed_seconds
        for row in previous_rows:
            if row["round"] <= checkpoint.round:
                self.write_row(dict(row))

    def folder(self) -> Path:
        """The run folder, made now if it is not there yet."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        return self.run_dir

    def begin_round(self, server_round: int) -> dict:
        self.row = {"round": server_round, "num_clients": 0, "num_failures": 0, "num_rejected": 0, "num_dropped": 0}
        return self.row

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.run_started

    def write_row(self, row: dict) -> None:
        row = {k: row.get(k, "") for k in BASE_COLUMNS} | {
            k: v for k, v in row.items() if k not in BASE_COLUMNS
        }
        self.rows.append(row)
        new_columns = [k for k in row if k not in self.columns]
        self.columns += new_columns
        write_metrics(self.folder(), self.columns, self.rows)

    def data_fingerprint(self, client_manager) -> dict | None:
        """The data fingerprint (``fl_app/server/provenance.py``), computed once per process at the
        first round it runs and kept in the run folder (and in every checkpoint); ``DataChanged``
        when a resumed run finds other data than its checkpoint's, or cannot tell
        (``resumed_fingerprint``). None, with a warning, when the data cannot be read now."""
        if self.fingerprint is None:
            node_local = len(getattr(client_manager, "data_path_of", None) or {})
            n = total_clients(client_manager)
            try:
                self.fingerprint = (resumed_fingerprint(self.folder(), self.cfg, n, node_local, self.started_on)
                                    if self.resumed else record_fingerprint(self.folder(), self.cfg, n, node_local))
            except DataChanged as exc:
                log.error("fl-drift: %s", exc)
                raise
            except (OSError, RuntimeError, ValueError) as exc:  # a file gone, the hub unreachable
                log.warning("the data fingerprint could not be computed (%s): not recorded", exc)
                self.fingerprint = {}  # tried: not again every round
        return self.fingerprint or None

    def write_summary(self, client_manager, stopped: str | None = None) -> None:
        """summary.json; ``stopped`` says why a run ended before its last round (else None).

        ``rounds_without_update`` lists the rounds in which no client update was used (every
        sampled client failed or was rejected, which ``min-fit-fraction = 0`` lets a run
        survive): the global model did not change in them. ``untrained`` is true when that
        holds for every round, so the accuracies are the initial model's and not a result
        (``runner/results/report.py`` leaves such runs out of the comparison's means).

        ``status`` is "completed", "stopped" (``stopped`` says why) or "diverged": its rounds show
        a blow-up (``fl_app/common/divergence.py``: the training loss, a method's state norm or
        the accuracy back at chance after clearly exceeding it), whose reason (signal, round,
        values, one-line ``text``) is ``diverged`` (None otherwise); a run the server stopped
        for lack of usable (finite) updates is "diverged" when its rounds say so, ``stopped``
        keeping the stop's reason."""
        diverged = divergence(self.rows, run_classes(self.cfg))
        empty = [r["round"] for r in self.rows if r.get("num_clients") == 0]
        accs = [r["test_accuracy"] for r in self.rows if isinstance(r.get("test_accuracy"), float)]
        finite = [a for a in accs if math.isfinite(a)]
        summary = {
            "config": self.cfg,
            "rounds": len(self.rows),
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(finite) if finite else None,
            "final_loss": next((r["test_loss"] for r in reversed(self.rows) if isinstance(r.get("test_loss"), float)),
                               None),
            "total_seconds": self.elapsed(),
            **self.initial,
            "stopped": stopped,
            "status": "diverged" if diverged else "stopped" if stopped else "completed",
            "diverged": diverged,
            "rounds_without_update": empty,
            "untrained": bool(self.rows) and len(empty) == len(self.rows),
            **run_facts(self.cfg, total_clients(client_manager)),
            FINGERPRINT_KEY: self.data_fingerprint(client_manager),
            **self.facts,
        }
        atomic_write_text(self.folder() / SUMMARY_FILE, json.dumps(summary, indent=2))


def run_classes(cfg: dict) -> int:
    """The number of classes of the run's dataset (what chance accuracy is 1 over)."""
    return input_shape(cfg["dataset"]).classes


