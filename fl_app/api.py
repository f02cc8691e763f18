"""fl_app's public entry for code outside a Flower run (``runner/``, ``scripts/``, ``bench/``): the
one module of fl_app that such code imports, beside the run-config schema (``fl_app.registry``,
``fl_app.config``). Everything else of fl_app (``server/``, ``node/``, ``common/``) and the
``tasks`` below it is reached through here, so the rooms of fl_app can be rearranged without
touching the runner.

It offers:

- ``preflight``: every check of a sweep's run configs before anything is launched or written, in
  one call (``check_configs``: path, method, data folder, federation size; then the clients' data
  sizes and local test splits, every image of the local files decodable, the checkpoints a re-run
  would continue from, and the kept or started runs made with another config or on other data,
  ``changed_runs``). A refusal is one line (``ConfigError``,
  ``DataUnavailableError``, ``PartitionError``, ``CheckpointError``);
- ``check_report``: what ``run_simulation.py --check`` shows of each run and the pictures of its
  splits;
- the run folder: its file names, ``read_run`` (a finished run's records, read once),
  ``write_run_config``, the data fingerprint a run recorded (``recorded_fingerprint``), the
  clients' label counts (``label_counts``), and whether the run diverged (``run_divergence``,
  from ``divergence``: one pure function of its rounds, the server's and every reader's);
- provenance (``code_revision``, ``with_app_digest``), file writes that are whole or absent
  (``atomic_write_text``, ``replacing``), and the model and data facts the runner's estimate
  and listing print.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fl_app.common.divergence import divergence
from fl_app.common.execution_path import Execution, cohort_node_count, launch_execution
from fl_app.common.files import atomic_write_text, replacing
from fl_app.common.run_files import (
    FINGERPRINT_FILE,
    FINGERPRINT_KEY,
    METRICS_FILE,
    SUMMARY_FILE,
    read_metrics,
    read_summary,
)
from fl_app.config import ConfigError
from fl_app.node.client_state import check_state_files
from fl_app.registry import check_method, resolve, spec, validate_config
from fl_app.server.checkpoint import CHECKPOINT, CheckpointError, checkpoint_fingerprint, load_checkpoint
from fl_app.server.preflight import check_data_dir, check_nodes
from fl_app.server.provenance import code_revision, data_fingerprint, software_versions, with_app_digest
from fl_app.server.tracking import PER_CLASS_FILE
from tasks.datasets import DataUnavailableError, PartitionError, input_shape, parquet_rows, resolve_data_dir
from tasks.models import BUILDERS, FLAT_MODELS, MODELS, build_model, get_weights
from tasks.partition_figure import LABEL_COUNTS_FILE, read_label_counts, write_check_splits, write_label_counts
from tasks.partitioning import PartitionSpec, check_data, cut, settings
from tasks.train import accuracy_spread, min_batch_of

__all__ = [
    # handed on from the rooms below
    "BUILDERS", "CHECKPOINT", "FINGERPRINT_FILE", "FINGERPRINT_KEY", "FLAT_MODELS", "LABEL_COUNTS_FILE",
    "METRICS_FILE", "MODELS", "PER_CLASS_FILE", "SUMMARY_FILE", "CheckpointError", "ConfigError",
    "DataUnavailableError", "Execution", "PartitionError", "accuracy_spread", "atomic_write_text", "build_model",
    "code_revision", "cohort_node_count", "data_fingerprint", "input_shape", "software_versions",
    "parquet_rows", "read_metrics", "read_summary",
    "divergence", "replacing", "resolve_data_dir", "with_app_digest",
    # defined here
    "Checked", "RunFacts", "RunRecord", "changed_data", "changed_runs", "check_checkpoints", "check_configs",
    "check_report", "check_splits", "describe_data", "execution_for", "fingerprint_of", "preflight", "read_run",
    "recorded_fingerprint", "run_divergence", "split_words", "with_label_counts", "write_run_config",
]


# ------------------------------------------------------------------ one run config
@dataclass(frozen=True)
class Checked:
    """One run config that passed ``check_configs``: as it is launched (``raw``: data-dir
    resolved, ``num-virtual-clients`` on the cohort path), validated (``valid``), as its method
    runs it (``cfg``), and the path it takes (``execution``)."""

    raw: dict
    valid: dict
    cfg: dict
    execution: Execution


def execution_for(raw: dict, clients: int, gpus: int, cluster: bool = False) -> tuple[dict, Execution]:
    """The launcher's choice of path for the run config ``raw`` of ``clients`` partitions on a
    machine with ``gpus`` usable GPUs (``launch_execution``: ``auto`` takes the cohort path on
    CUDA for a method and settings that support it), and ``raw`` as it is launched: with
    ``num-virtual-clients`` = ``clients`` on the cohort path (the server and ClientApp then take
    it, the launcher starts cohort nodes). A refused cohort raises ConfigError."""
    if "num-virtual-clients" in raw:
        raise ConfigError(f"run-config key 'num-virtual-clients' = {raw['num-virtual-clients']!r} is set by the runner"
                          " (--clients on the cohort path); leave it out and choose the path with execution")
    cfg, method = resolve(raw)
    execution = launch_execution(cfg, method, clients, cuda=gpus > 0, gpus=gpus, cluster=cluster)
    if execution.cohort:
        raw = {**raw, "num-virtual-clients": clients}
    return raw, execution


def check_configs(raws: list[dict], clients: int, *, env_data_dir: str | None = None, gpus: int = 0,
                  cluster: bool = False) -> list[Checked]:
    """Each run config in order, its ``data-dir`` resolved (``resolve_data_dir``: as given, else
    ``env_data_dir`` / ``$FL_DATA_DIR``), its path chosen (``execution_for``), its method's own
    checks and strategy built as the ServerApp will (``check_method``), its data folder
    (``check_data_dir``) and federation size (``check_nodes``) checked; the first refusal raised."""
    checked, built = [], set()  # built: each setting's strategy is built once, not once per seed
    for raw in raws:
        raw = {**raw, "data-dir": resolve_data_dir(str(raw.get("data-dir", "")), env_data_dir)}
        raw, execution = execution_for(raw, clients, gpus, cluster)
        cfg = check_method(raw, built)
        check_data_dir(cfg)
        check_nodes(cfg, clients)
        checked.append(Checked(raw, validate_config(raw), cfg, execution))
    return checked


# ------------------------------------------------------------------ a sweep
def preflight(raws: list[dict], clients: int, runs_dir: Path, *, env_data_dir: str | None = None, gpus: int = 0,
              cluster: bool = False) -> tuple[list[Checked], list[str]]:
    """Every check that can fail before a sweep launches anything: ``check_configs``; every
    client of each distinct partitioning holds at least one batch its model trains on, also
    after its local test split (``client-test-fraction``), and every image of its local files
    decodes (``check_data``); every checkpoint a re-run would continue from is sound
    (``check_checkpoints``). The checked configs, and one line per kept or started run whose
    config or data differ from what is asked now (``changed_runs``: the caller refuses them).
    ``runs_dir``: the folder of the runs (``results-dir``), each in its ``run-name``."""
    checked = check_configs(raws, clients, env_data_dir=env_data_dir, gpus=gpus, cluster=cluster)
    for part, model, held in {(PartitionSpec.from_config(c.valid, clients), c.valid["model"],
                                c.valid["client-test-fraction"]) for c in checked}:
        check_data(part, min_batch_of(model, part.dataset), held)  # each client at least one batch to train on
    launched = [c.raw for c in checked]
    check_checkpoints(launched, runs_dir)
    return checked, changed_runs(launched, runs_dir, env_data_dir, clients)


def check_checkpoints(raws: list[dict], runs_dir: Path) -> None:
    """Every unfinished run's checkpoint that a re-run would continue from is checked now
    (readable, its SHA-256, written for this model): ``CheckpointError`` before any launch; and
    every client-state file it continues from is readable (``check_state_files``: ``StateFileError``)."""
    for raw in raws:
        run_dir = Path(runs_dir) / raw["run-name"]
        if read_summary(run_dir) is None and (run_dir / CHECKPOINT).exists():
            cfg = validate_config(raw)
            shapes = [w.shape for w in get_weights(build_model(cfg["model"], input_shape(cfg["dataset"])))]
            checkpoint = load_checkpoint(run_dir, cfg["model"], shapes)
            check_state_files(run_dir, run_dir / CHECKPOINT, checkpoint.round)


# by design: continuation flag; the folder may move; the target only reads the accuracies afterwards;
# client-threads is where a cohort run ran (the runner sets it from --cpus-per-client at launch, so
# the planned config never holds it), like --cpus-per-client itself, which no config records
IGNORED_ON_RERUN = {"resume", "results-dir", "target-accuracy", "client-threads"}


def as_read_now(recorded: dict) -> dict:
    """A run's recorded config as this code reads it: a key added since the run was made takes
    its default (a new key's default is the behaviour before it existed), so asking for another
    value of it is a change too; keys removed since are kept as recorded. A recorded config
    this code refuses is compared as it stands."""
    keys = spec()
    try:
        return {**recorded, **validate_config({k: v for k, v in recorded.items() if k in keys})}
    except ConfigError:
        return recorded


def changed_runs(raws: list[dict], runs_dir: Path, env_data_dir: str | None = None,
                 clients: int | None = None) -> list[str]:
    """Runs (finished, or started and checkpointed) in ``runs_dir`` for the run configs ``raws``
    whose recorded config differs from what is asked now, or whose recorded data fingerprint
    differs from the data asked for now (``changed_data``: same folder, other files): keeping or
    continuing them would mix two experiments. One line each."""
    problems = []
    for raw in raws:
        run_dir = Path(runs_dir) / raw["run-name"]
        summary = read_summary(run_dir)
        started = run_dir / "run-config.json"
        recorded = summary["config"] if summary else json.loads(started.read_text()) if started.exists() else None
        if recorded is None:
            continue
        wanted = validate_config(raw)
        recorded = {**as_read_now(recorded), "data-dir": resolve_data_dir(recorded.get("data-dir", ""), env_data_dir)}
        diff = [f"{k} {recorded[k]!r} -> {wanted[k]!r}" for k in wanted
                if k in recorded and k not in IGNORED_ON_RERUN and recorded[k] != wanted[k]]
        if diff:
            problems.append(f"{run_dir} was run with a different config ({'; '.join(diff)})")
        elif (data := changed_data(run_dir, wanted, clients)) is not None:
            problems.append(data)
    return problems


def changed_data(run_dir: Path, wanted: dict, clients: int | None) -> str | None:
    """One line when ``run_dir`` recorded a data fingerprint (fl_app/server/provenance.py) that
    the data asked for now does not have, or when it is a started run (a checkpoint, no summary)
    that recorded none: continuing it would train on data that cannot be shown to be the data it
    started on (the server refuses it too, ``provenance.resumed_fingerprint``). None when it
    matches, or for a finished run that recorded none (made before fingerprints were recorded:
    kept, not guessed). The fingerprint is computed only when there is one to compare."""
    recorded = recorded_fingerprint(run_dir)
    if recorded is None and read_summary(run_dir) is None and (run_dir / CHECKPOINT).exists():
        return (f"{run_dir} would continue from a checkpoint that carries no data fingerprint, and its "
                f"{FINGERPRINT_FILE} is missing: the data it started on is unknown")
    if recorded is None:
        return None
    now = data_fingerprint(wanted, clients or (recorded.get("partition") or {}).get("num-partitions"))
    if recorded["digest"] == now["digest"]:
        return None
    return f"{run_dir} was run on data {describe_data(recorded)}, but the data asked for now is {describe_data(now)}"


def _split_text(d: dict) -> str:
    if d.get("source") == "local parquet":
        text = f"{d.get('bytes')} bytes, sha256 {str(d.get('sha256'))[:12]}"
    elif d.get("source") == "hub":
        text = f"hub {d.get('id')}@{d.get('revision') or 'unknown revision'}, {d.get('rows')} rows"
    else:
        text = str(d.get("source"))
    return text + (f", {d['node-local']} nodes with their own data-path" if d.get("node-local") else "")


def describe_data(fp: dict) -> str:
    """One line of a data fingerprint: the digest, then the dataset, its train and test splits
    and the partition."""
    partition = ", ".join(f"{k} {v}" for k, v in (fp.get("partition") or {}).items())
    return (f"{fp['digest']} ({fp.get('dataset')}: train {_split_text(fp.get('train') or {})}; "
            f"test {_split_text(fp.get('test') or {})}; {partition})")


def split_words(config: dict, clients: int) -> str:
    """A run's split in words, from its recorded config: its partitioner and every key it reads,
    feature noise included ('dirichlet partitions (alpha=0.3, min-partition-size=10,
    noise-sigma=0.1)'; the synthetic data: 'generated per device (synthetic-alpha=1.0, ...)');
    a key added after the run was recorded reads as its default (its value then), the
    partitioner's name alone where the config is not a run's."""
    defaults = {name: key.default for name, key in spec().items()}
    try:
        spec_ = PartitionSpec.from_config({**defaults, **config, "data-dir": ""}, clients)
    except (KeyError, TypeError, ValueError):
        return str(config.get("partitioner", "?"))
    return f"generated per device ({settings(spec_)})" if spec_.dataset == "synthetic" else cut(spec_)


# ------------------------------------------------------------------ --check
@dataclass(frozen=True)
class RunFacts:
    """What ``--check`` says of one checked run: its config as its method runs it, the path and
    why, the rounds a launch would still train (0: finished, kept) and its method's cost of a
    local step against one SGD step."""

    cfg: dict
    execution: Execution
    rounds_left: int
    step_cost: float


def check_report(runs: list[tuple[Path, dict]], clients: int, gpus: int = 0) -> list[RunFacts]:
    """``RunFacts`` of each run (its folder, and its run config as launched, checked by
    ``check_configs``), its path chosen again as a local simulation would choose it."""
    facts = []
    for run_dir, raw in runs:
        cfg, method = resolve(raw)
        asked = {k: v for k, v in raw.items() if k != "num-virtual-clients"}  # that key is the launcher's own
        _, execution = execution_for(asked, clients, gpus)  # the path the run takes, and why
        if read_summary(run_dir) is not None:
            left = 0
        else:
            ckpt = load_checkpoint(run_dir)
            left = cfg["num-server-rounds"] - (ckpt.round if ckpt else 0)
        facts.append(RunFacts(cfg, execution, left, method.update.step_cost))
    return facts


def check_splits(raws: list[dict], folder: Path, clients: int) -> list[str]:
    """``--check``'s pictures of the distinct splits of the run configs ``raws`` among
    ``clients`` clients, written in ``folder`` (``write_check_splits``), one line each."""
    return write_check_splits([validate_config(raw) for raw in raws], folder, clients)


# ------------------------------------------------------------------ the run folder
@dataclass(frozen=True)
class RunRecord:
    """A run folder's records, read once (``read_run``; ``fl_app.server.recording.RunRecorder``
    writes them): its summary (None: unfinished or failed), its metrics rows ([] without
    metrics.csv; ``has_metrics`` says whether the file is there), the per-class test accuracies
    of its last evaluated round and its clients' label counts (None where the run has no such
    file)."""

    path: Path
    summary: dict | None
    metrics: list[dict] = field(default_factory=list)
    has_metrics: bool = False
    per_class: np.ndarray | None = None
    label_counts: np.ndarray | None = None

    @property
    def name(self) -> str:
        return self.path.name


def read_run(run_dir: Path) -> RunRecord:
    """``run_dir``'s records (``RunRecord``), each file read once."""
    run_dir = Path(run_dir)
    counts = run_dir / LABEL_COUNTS_FILE
    return RunRecord(run_dir, read_summary(run_dir), read_metrics(run_dir), (run_dir / METRICS_FILE).exists(),
                     last_per_class(run_dir), read_label_counts(counts) if counts.exists() else None)


def run_divergence(record: RunRecord) -> dict | None:
    """Why the run of ``record`` diverged, or None (``fl_app/common/divergence.py``): computed from
    its metrics.csv rows and its dataset's classes with this code's bounds, so a kept run made
    before summary.json said so is judged like a new one; the summary's own ``diverged`` where
    the rows are gone or its dataset is unknown here."""
    summary = record.summary or {}
    dataset = (summary.get("config") or {}).get("dataset")
    if record.metrics and dataset:
        try:
            classes = input_shape(dataset).classes
        except KeyError:
            classes = None
        if classes:
            return divergence(record.metrics, classes)
    return summary.get("diverged") or None


def last_per_class(run_dir: Path) -> np.ndarray | None:
    """The per-class test accuracies of the run's last evaluated round, or None."""
    path = Path(run_dir) / PER_CLASS_FILE
    if not path.exists():
        return None
    with path.open() as f:
        rows = [r for r in csv.reader(f)][1:]
    rows = [r for r in rows if len(r) > 1 and all(v != "" for v in r[1:])]
    return np.array([float(v) for v in rows[-1][1:]]) if rows else None


def write_run_config(run_dir: Path, raw: dict) -> Path:
    """``run-config.json`` in ``run_dir``: the run config as the run is launched, validated
    (whole or not at all), which a re-run compares with what it is asked (``changed_runs``)."""
    return atomic_write_text(Path(run_dir) / "run-config.json", json.dumps(validate_config(raw), indent=1))


def fingerprint_of(summary: dict | None) -> dict | None:
    """A run's recorded data fingerprint, or None when it has none (or only a broken one)."""
    fp = summary.get(FINGERPRINT_KEY) if isinstance(summary, dict) else None
    return fp if isinstance(fp, dict) and isinstance(fp.get("digest"), str) else None


def recorded_fingerprint(run_dir: Path) -> dict | None:
    """The fingerprint a run recorded: its summary's when it finished, else its checkpoint's
    (the data its rounds so far trained on, hashed with the checkpoint), else the one it wrote
    when it started (``FINGERPRINT_FILE``); None when it recorded none."""
    found = fingerprint_of(_json(Path(run_dir) / SUMMARY_FILE))
    found = found or fingerprint_of({FINGERPRINT_KEY: checkpoint_fingerprint(run_dir)})
    return found or fingerprint_of({FINGERPRINT_KEY: _json(Path(run_dir) / FINGERPRINT_FILE)})


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=64)
def _counts_for(part: PartitionSpec) -> np.ndarray:
    from tasks.partitioning import partition_label_counts

    return partition_label_counts(part)


def with_label_counts(run: RunRecord) -> RunRecord:
    """``run`` with its clients' training label counts (clients x classes): those it recorded
    (``LABEL_COUNTS_FILE``), else cut again from the data (the run's summary config and client
    count; same partitioner and seed as the run) and written there, so later readers need no
    data. Left None when neither is possible (no summary or client count, no data here)."""
    if run.label_counts is not None:
        return run
    try:
        part = PartitionSpec.from_config(run.summary["config"], int(run.summary["num_clients"]))
        counts = _counts_for(part)
    except (OSError, KeyError, TypeError, ValueError, DataUnavailableError):
        return run  # no summary or client count, no data here, a synthetic run: the column stays empty
    write_label_counts(run.path / LABEL_COUNTS_FILE, counts)
    return dataclasses.replace(run, label_counts=counts)
