"""``RecordingStrategy``: wraps any method's strategy and writes the run's results.

Per round it writes one row to ``<results-dir>/<run-name>/metrics.csv``: round,
test_accuracy, test_loss, train_loss, num_clients, num_failures, num_rejected,
round_seconds, fit_phase_seconds (sampling to the last reply), then the method's metrics
(client metrics as ``<name>_mean/_min/_max``, e.g. ``fit_seconds_mean``: the clients' compute;
server metrics as reported), and what the round cost in traffic, measured from the messages
themselves: ``bytes_down_per_client`` and ``bytes_up_per_client``, the arrays' ``nbytes`` summed
over each FitIns sent (after ``drop-rate``'s drops) and each FitRes received (rejected ones
too: they were sent), mean over those clients (``message_nbytes``; a method that sends extra
arrays, SCAFFOLD's control variates, shows them). At the last round it writes ``summary.json``
(with the initial model's ``initial_accuracy`` and ``initial_loss``, round 0 of the plots; absent
after a resume; and the
``data_fingerprint`` of ``fl_app/server/provenance.py``, also kept from round 1 in
``data-fingerprint.json``).
Every method also gets the drift columns of ``fl_app/server/drift.py`` (from the accepted replies,
before aggregation) and ``min_class_accuracy``; ``fl_app/server/tracking.py`` writes the per-class
accuracy file and sends the run to the trackers of ``tracking`` (TensorBoard, MLflow, W&B).

It is also the one place the run's reliability rules are applied, whatever the method; each
rule lives in its own module and is called from here once:
- a result whose arrays contain NaN/Inf, or whose count or shapes differ from what was sent,
  is rejected before the wrapped strategy sees it (``num_rejected``); an aggregate that is
  not finite is discarded and the previous global model kept;
- failed clients (raised, timed out) are counted (``num_failures``); ``fl_app/server/participation.py``
  drops clients (``drop-rate``, ``num_dropped``) and stops the run with ``RunAborted`` when
  fewer than ``min-fit-fraction`` of the sampled clients succeed;
- ``screening`` (``fl_app/server/screening.py``) clips, rejects or robustly replaces the accepted
  updates before the wrapped strategy sees them (``num_clipped``, ``screen_bound``);
- every ``checkpoint-every`` rounds it writes a checkpoint (``fl_app/server/checkpoint.py``); a
  resumed run continues at the checkpoint's round (``offset``);
- ``inject-faults = "crash-after:<round>"`` crashes the server after that round
  (``fl_app/server/crash.py``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from fl_app.server.checkpoint import Checkpoint, checkpoint_due, save_checkpoint
from fl_app.server.crash import crash_if_injected
from fl_app.server.drift import round_drift
from fl_app.server.participation import Participation, RunAborted
from fl_app.server.placement import record_ray_nodes
from fl_app.server.provenance import DataChanged, record_fingerprint, run_facts
from fl_app.server.screening import Screening
from fl_app.server.tracking import RunTracker
from tasks.train import accuracy_spread

log = logging.getLogger("flwr.fl_drift")

BASE_COLUMNS = [
    "round", "test_accuracy", "test_loss", "train_loss",
    "num_clients", "num_failures", "num_rejected", "num_dropped", "round_seconds",
]

# Client metrics that are bookkeeping, not method metrics.
_SKIP_CLIENT_METRICS = {"train_loss", "num_steps"}


def _finite(arrays: list[np.ndarray]) -> bool:
    return all(np.isfinite(a).all() for a in arrays if np.issubdtype(a.dtype, np.number))


def _views(parameters: Parameters) -> list[np.ndarray]:
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
    return sum(sum(int(a.nbytes) for a in _views(m)) for m in messages) / len(messages)


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


class RecordingStrategy(Strategy):
    """Delegates every call to ``inner``; records metrics and filters bad updates."""

    def __init__(self, inner: Strategy, cfg: dict, run_dir: Path, num_rounds: int,
                 resume_from: Checkpoint | None = None, previous_rows: list[dict] | None = None):
        super().__init__()
        self.inner = inner
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.num_rounds = num_rounds  # total rounds of the run, resumed or not
        self.sent_shapes: list[tuple] | None = None
        self.sent_weights: list[np.ndarray] | None = None
        self.rows: list[dict] = []
        self.columns = list(BASE_COLUMNS)
        self.row: dict = {}  # the metrics row of the round in progress
        self.round_started = 0.0
        self.run_started = time.monotonic()
        self.client_manager: ClientManager | None = None
        self.offset = 0  # rounds done before this process started (resume)
        self.elapsed_before = 0.0
        self.last_checkpoint = 0
        self.screening = Screening(cfg, getattr(inner, "screen_skip", ()))
        self.participation = Participation(cfg)
        self.initial: dict[str, float] = {}  # the initial model's test accuracy and loss (round 0)
        self.pending: tuple | None = None  # a round whose row waits for the clients' evaluation
        self.fingerprint: dict | None = None  # the data's fingerprint (``_fingerprint``)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tracker = RunTracker(self.run_dir, cfg)
        if resume_from is not None:
            self.offset = self.last_checkpoint = resume_from.round
            self.elapsed_before = resume_from.elapsed_seconds
            if hasattr(inner, "set_state"):
                inner.set_state(resume_from.strategy_state)
            for row in previous_rows or []:
                if row["round"] <= resume_from.round:
                    self._write_row(dict(row))

    def __repr__(self) -> str:
        return f"RecordingStrategy({self.inner!r})"

    # ----------------------------------------------------------------- delegation
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.inner.initialize_parameters(client_manager)

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
        server_round += self.offset
        self.client_manager = client_manager
        self.round_started = time.monotonic()
        self.sent_weights = _views(parameters)  # w_t, for the drift columns (fl_app/server/drift.py)
        self.row = {"round": server_round, "num_clients": 0, "num_failures": 0,
                    "num_rejected": 0, "num_dropped": 0}
        instructions = self.inner.configure_fit(server_round, parameters, client_manager)
        self._fingerprint()  # the nodes have reported their partitions by now (sampling asks them)
        self.screening.begin_round(parameters)  # w_t: the global model the clients receive
        instructions, self.row["num_dropped"] = self.participation.select(server_round, instructions)
        self.row["bytes_down_per_client"] = message_nbytes([ins.parameters for _, ins in instructions])
        if instructions:
            self.sent_shapes = [a.shape for a in parameters_to_ndarrays(instructions[0][1].parameters)]
        extra = {"run-dir": str(self.run_dir.resolve()), "checkpoint-round": self.last_checkpoint,
                 "checkpoint-every": self.cfg["checkpoint-every"]}
        return [(c, FitIns(ins.parameters, {**ins.config, **extra})) for c, ins in instructions]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures):
        """The round's replies, in four steps: accept (checks and screening), record the
        clients' metrics, stop the run on too few successes, aggregate (drift columns, the
        method's aggregation, a finite-aggregate check)."""
        server_round += self.offset
        # from sampling to the last reply: the clients' fit_seconds and the transport in between
        self.row["fit_phase_seconds"] = time.monotonic() - self.round_started
        self.row["bytes_up_per_client"] = message_nbytes([res.parameters for _, res in results])
        accepted = self._accepted(server_round, results, failures)
        self.row.update(summarise_client_metrics([(r.num_examples, r.metrics) for _, r in accepted]))
        self.row.update(record_ray_nodes(self.run_dir, server_round, accepted))
        self._stop_on_shortfall(server_round, len(accepted), len(results), len(failures))
        if not accepted:
            return None, {}
        return self._aggregate(server_round, accepted, failures)

    def _accepted(self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures) -> list:
        """The replies that pass the checks (``_problem``) and the screening, in node order;
        counts clients, failures and rejections in the round's row and logs each."""
        accepted = []
        for client, res in self._in_node_order(results):
            problem = self._problem(res)
            if problem:
                log.warning("round %d: rejected the update of node %s: %s", server_round, client.cid, problem)
            else:
                accepted.append((client, res))
        accepted = self.screening.apply(server_round, accepted, self.row)
        self.row.update(
            num_clients=len(accepted),
            num_failures=len(failures),
            num_rejected=len(results) - len(accepted),
        )
        for failure in failures:
            log.warning("round %d: a client failed: %r", server_round, failure)
        return accepted

    def _stop_on_shortfall(self, server_round: int, accepted: int, replied: int, failed: int) -> None:
        """Raise ``RunAborted`` when too few sampled clients succeeded (fl_app/server/participation.py)."""
        reason = self.participation.shortfall(server_round, accepted, replied, failed)
        if reason:
            # The rounds so far are a result (a method that diverges is an outcome to report),
            # so the summary is written and says why and where the run stopped.
            self.write_summary(stopped=reason)
            raise RunAborted(f"{reason}. Stopping the run; the summary and the last checkpoint are kept.")

    def _aggregate(self, server_round: int, accepted: list, failures):
        """Drift columns from the accepted replies, then the method's aggregation; a non-finite
        aggregate is discarded (the previous global model stays)."""
        replies = [(r.num_examples, _views(r.parameters)) for _, r in accepted]
        self.row.update(round_drift(self.cfg, self.sent_weights, replies))  # drift columns
        parameters, metrics = self.inner.aggregate_fit(server_round, accepted, failures)
        if parameters is not None and not _finite(parameters_to_ndarrays(parameters)):
            log.error("round %d: the aggregate is not finite; keeping the previous global model", server_round)
            return None, {}
        self.row.update({k: v for k, v in (metrics or {}).items() if isinstance(v, (int, float))})
        return parameters, metrics

    def _in_node_order(self, results: list[tuple[ClientProxy, FitRes]]) -> list[tuple[ClientProxy, FitRes]]:
        """Results in partition order, not the order they arrived in: float sums depend on
        the order, and a method that amplifies small differences (FedPGVC at lr 0.05 went
        from 0.64 to 0.10 test accuracy between two runs of the same seed) must still give
        the same run for the same seed."""
        ordered = getattr(self.client_manager, "ordered", None)
        if ordered is None:
            return list(results)
        rank = {cid: i for i, cid in enumerate(ordered([client.cid for client, _ in results]))}
        return sorted(results, key=lambda r: rank[r[0].cid])

    def _problem(self, res: FitRes) -> str:
        arrays = _views(res.parameters)
        if self.sent_shapes is not None and len(arrays) != len(self.sent_shapes):
            return f"{len(arrays)} arrays, expected {len(self.sent_shapes)}"
        if self.sent_shapes is not None:
            for i, (a, shape) in enumerate(zip(arrays, self.sent_shapes)):
                if a.shape != shape:
                    return f"array {i} has shape {a.shape}, expected {shape}"
        if not _finite(arrays):
            return "non-finite values (NaN or Inf)"
        return ""

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
        """Client-side evaluation (``client-test-fraction`` > 0) in the rounds the server
        evaluates; Flower calls this after ``evaluate``, whose row then waits for the clients'
        scores (``pending``). No instructions (no client-side evaluation): the row is closed."""
        if self.pending is None:
            return []
        instructions = self.inner.configure_evaluate(server_round + self.offset, parameters, client_manager)
        if not instructions:
            self.end_round(*self.pending)
        return instructions

    def aggregate_evaluate(self, server_round: int, results, failures):
        out = self.inner.aggregate_evaluate(server_round + self.offset, results, failures)
        if self.pending is not None:
            accuracies = [float(r.metrics["accuracy"]) for _, r in results
                          if isinstance(r.metrics.get("accuracy"), (int, float))]
            self.row.update(client_accuracy_stats(accuracies))
            for failure in failures:
                log.warning("round %d: a client failed to evaluate: %r", self.pending[0], failure)
            self.end_round(*self.pending)
        return out

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        """The server's evaluation of round ``server_round``; after round 0 also the end of the
        round (``end_round``): Flower's legacy loop calls ``evaluate`` once after every round's
        fit and has no other end-of-round hook."""
        if server_round == 0 and self.offset:  # resumed: the checkpoint's model, already recorded
            if self.offset >= self.num_rounds:
                self.finish()
            return None
        server_round += self.offset
        skipped = not evaluated_round(server_round, self.cfg["evaluate-every"], self.num_rounds)
        result = None if skipped else self.inner.evaluate(server_round, parameters)
        if result is None and not skipped:
            return None
        per_class = None
        if result is not None:
            loss, metrics = result
            metrics = dict(metrics)
            per_class = metrics.pop("per_class_accuracy", None)  # to per_class_accuracy.csv, not Flower's history
            result = loss, metrics
        if server_round == 0:
            loss, metrics = result
            self.initial = {"initial_accuracy": float(metrics.get("accuracy", float("nan"))),
                            "initial_loss": float(loss)}  # round 0 of the plots (fl_app/results/report.py)
            log.info("initial model: test accuracy %.4f, loss %.4f", self.initial["initial_accuracy"], loss)
            return result
        self._record_test(result)
        if result is not None and self.cfg["client-test-fraction"] > 0:
            self.pending = (server_round, parameters, result, per_class)  # the row waits for the clients
            return result
        self.end_round(server_round, parameters, result, per_class)
        return result

    def end_round(self, server_round: int, parameters: Parameters, result, per_class) -> None:
        """The end of a round, in order: write its row (even when evaluation was skipped: the
        accuracy and loss cells stay empty; with client-side evaluation once the clients' scores
        are in, see ``aggregate_evaluate``), log it, checkpoint when due, finish the run after
        its last round, then crash if a crash is injected after this round."""
        self.pending = None
        self._record_round(per_class)
        self._log_round(server_round, result is not None)
        if checkpoint_due(self.cfg["checkpoint-every"], server_round, self.num_rounds):
            self.checkpoint(server_round, parameters)
        if server_round >= self.num_rounds:
            self.finish()
        crash_if_injected(self.cfg, server_round)

    def _record_test(self, result) -> None:
        """The server's test metrics of the round into its row (none when evaluation was skipped)."""
        if result is not None:
            loss, metrics = result
            self.row.update(test_loss=float(loss), test_accuracy=float(metrics.get("accuracy", float("nan"))))
            if "min_class_accuracy" in metrics:
                self.row["min_class_accuracy"] = float(metrics["min_class_accuracy"])

    def _record_round(self, per_class) -> None:
        """The round's duration into its row; the row to metrics.csv and the tracker (per-class
        accuracy file, TensorBoard)."""
        self.row["round_seconds"] = time.monotonic() - self.round_started
        self._write_row(self.row)
        self.tracker.log_round(self.row, per_class)

    def _log_round(self, server_round: int, evaluated: bool) -> None:
        if evaluated:
            tested = f"test accuracy {self.row['test_accuracy']:.4f}, test loss {self.row['test_loss']:.4f}"
        else:
            tested = f"test accuracy not evaluated (evaluate-every {self.cfg['evaluate-every']})"
        log.info(
            "round %d/%d: %s, clients %d, failures %d, %.1fs", server_round, self.num_rounds, tested,
            self.row.get("num_clients", 0), self.row.get("num_failures", 0), self.row["round_seconds"],
        )

    def checkpoint(self, server_round: int, parameters: Parameters) -> None:
        state = self.inner.get_state() if hasattr(self.inner, "get_state") else {}
        draws = getattr(self.client_manager, "draws", 0)
        save_checkpoint(self.run_dir, Checkpoint(
            server_round, parameters_to_ndarrays(parameters), state, draws, self.elapsed(), self.cfg["model"]))
        self.last_checkpoint = server_round

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.run_started

    def finish(self) -> None:
        """Summary file; client-state mirrors are only needed to resume, so remove them."""
        self.write_summary()
        self.tracker.close()
        shutil.rmtree(self.run_dir / "client-state", ignore_errors=True)

    # -------------------------------------------------------------------- files
    def _write_row(self, row: dict) -> None:
        row = {k: row.get(k, "") for k in BASE_COLUMNS} | {
            k: v for k, v in row.items() if k not in BASE_COLUMNS
        }
        self.rows.append(row)
        new_columns = [k for k in row if k not in self.columns]
        self.columns += new_columns
        path = self.run_dir / "metrics.csv"
        tmp = path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns, restval="")
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(tmp, path)

    def _num_clients(self) -> int | None:
        """Partitions of the federation (nodes when they bring their own data)."""
        cm = self.client_manager
        if cm is None:
            return None
        return getattr(cm, "num_partitions", None) or len(getattr(cm, "clients", {})) or None

    def _fingerprint(self) -> dict | None:
        """The data fingerprint (``fl_app/server/provenance.py``), computed once per process at the
        first round it runs and kept in the run folder; ``DataChanged`` when a resumed run finds
        other data than it started on. None, with a warning, when the data cannot be read now."""
        if self.fingerprint is None:
            node_local = len(getattr(self.client_manager, "data_path_of", None) or {})
            try:
                self.fingerprint = record_fingerprint(self.run_dir, self.cfg, self._num_clients(), node_local)
            except DataChanged as exc:
                log.error("fl-drift: %s", exc)
                raise
            except (OSError, RuntimeError, ValueError) as exc:  # a file gone, the hub unreachable
                log.warning("the data fingerprint could not be computed (%s): not recorded", exc)
                self.fingerprint = {}  # tried: not again every round
        return self.fingerprint or None

    def write_summary(self, stopped: str | None = None) -> None:
        """summary.json; ``stopped`` says why a run ended before its last round (else None).

        ``rounds_without_update`` lists the rounds in which no client update was used (every
        sampled client failed or was rejected, which ``min-fit-fraction = 0`` lets a run
        survive): the global model did not change in them. ``untrained`` is true when that
        holds for every round, so the accuracies are the initial model's and not a result
        (``fl_app/results/report.py`` leaves such runs out of the comparison's means)."""
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
            "rounds_without_update": empty,
            "untrained": bool(self.rows) and len(empty) == len(self.rows),
            **run_facts(self.cfg, self._num_clients()),
            "data_fingerprint": self._fingerprint(),
        }
        tmp = self.run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, self.run_dir / "summary.json")
