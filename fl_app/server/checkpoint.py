"""Checkpoints: the server's global weights, strategy state, round and sampling state, and the
data fingerprint of the data the rounds so far trained on (``fl_app/server/provenance.py``).

One file, ``<run-dir>/checkpoint.npz``, written atomically (temp file + rename), so an
interrupted write never leaves a half checkpoint. The fingerprint is stored as an array, so the
checkpoint's SHA-256 covers it: a resume compares it with the data it is about to read
(``provenance.resumed_fingerprint``), whatever became of ``data-fingerprint.json``.
Strategies with server state (control variates, dual variables, ...) expose
``get_state() -> dict[str, list[np.ndarray]]`` and ``set_state(state)``; stateless ones need
nothing.

Client state (``context.state``: control variates, past gradients, previous models,
BatchNorm layers kept local) lives on the clients, so each client mirrors it to
``<run-dir>/client-state/<client>/round-<r>.npz`` after every fit while checkpointing is on,
and reloads the newest file not newer than the checkpoint on resume
(``fl_app.node.client_state.ClientStateMirror``).
A cohort node keeps one journal instead, ``<run-dir>/client-rows/node-<i>/round-<r>.npz`` (the
rows its clients kept in round r), and restores its rows from it up to the checkpoint's round
(``fl_app.node.client_state.RowsJournal``).
On a deployment that path is on the node's own disk. With ``client-state = "disk"`` a
simulated client keeps its state only there between its rounds (``fl_app.node.node_client``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fl_app.common.files import atomic_savez
from protocol.keys import ConfigError

CHECKPOINT = "checkpoint.npz"
FINGERPRINT_ENTRY = "data_fingerprint"  # the array holding the fingerprint's JSON (absent from an older checkpoint)
COUNTED_ENTRY = "counted_rounds"  # the JSON of each client's last counted round (absent when the run did not screen)


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used for this run: unreadable, truncated, altered, or
    written for another model. One line naming the file and the fix."""


@dataclass
class Checkpoint:
    round: int
    weights: list[np.ndarray]
    strategy_state: dict[str, list[np.ndarray]] = field(default_factory=dict)
    sampler_draws: int = 0
    elapsed_seconds: float = 0.0
    model: str = ""
    data_fingerprint: dict | None = None  # None: not known when written (or an older checkpoint, written without one)
    counted_rounds: dict[str, int] | None = None  # each client's last counted round (fl_app.server.counted)


def _digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over every array's name, dtype, shape and bytes (in name order)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save_checkpoint(run_dir: Path, ckpt: Checkpoint) -> Path:
    """Write the checkpoint with the model name, the weights' shapes and a SHA-256 of every
    array, so ``load_checkpoint`` can tell a checkpoint of another model, or an altered or
    truncated file, from a good one. The data fingerprint, when known, is one of the hashed
    arrays."""
    arrays = {f"w{i}": np.asarray(a) for i, a in enumerate(ckpt.weights)}
    if ckpt.data_fingerprint is not None:
        arrays[FINGERPRINT_ENTRY] = _json_array(ckpt.data_fingerprint)
    if ckpt.counted_rounds is not None:
        arrays[COUNTED_ENTRY] = _json_array(ckpt.counted_rounds)
    layout = {}
    for name, values in ckpt.strategy_state.items():
        layout[name] = len(values)
        arrays.update({f"s:{name}:{i}": np.asarray(a) for i, a in enumerate(values)})
    meta = {"round": ckpt.round, "num_weights": len(ckpt.weights), "strategy_state": layout,
            "sampler_draws": ckpt.sampler_draws, "elapsed_seconds": ckpt.elapsed_seconds,
            "model": ckpt.model, "shapes": [list(np.shape(a)) for a in ckpt.weights], "sha256": _digest(arrays)}
    arrays["meta"] = _json_array(meta)
    return atomic_savez(Path(run_dir) / CHECKPOINT, arrays)


def _json_array(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), dtype=np.uint8)


def _from_json_array(array: np.ndarray):
    return json.loads(array.tobytes().decode())


def load_checkpoint(run_dir: Path, model: str = "", shapes: list[tuple[int, ...]] | None = None) -> Checkpoint | None:
    """The run's checkpoint (None if there is none), checked before use: it must be readable,
    match its recorded SHA-256, and, when ``model`` / ``shapes`` are given, have been written
    for that model with weights of those shapes. Otherwise ``CheckpointError`` (one line)."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return None
    aside = f"rename {path} (e.g. to {CHECKPOINT}.bad) to start this run from round 1"
    try:
        with np.load(path) as data:
            arrays = {key: data[key] for key in data.files}
        meta = _from_json_array(arrays.pop("meta"))
        weights = [arrays[f"w{i}"] for i in range(meta["num_weights"])]
        state = {name: [arrays[f"s:{name}:{i}"] for i in range(n)] for name, n in meta["strategy_state"].items()}
        fingerprint = _from_json_array(arrays[FINGERPRINT_ENTRY]) if FINGERPRINT_ENTRY in arrays else None
        counted = _from_json_array(arrays[COUNTED_ENTRY]) if COUNTED_ENTRY in arrays else None
    except Exception as exc:  # zipfile.BadZipFile, EOFError, OSError, KeyError, ValueError, ...
        raise CheckpointError(f"checkpoint {path} is unreadable (truncated or corrupt: {type(exc).__name__}:"
                              f" {exc}); {aside}") from exc
    if "sha256" in meta and _digest(arrays) != meta["sha256"]:
        raise CheckpointError(f"checkpoint {path} does not match its recorded SHA-256 (altered or corrupt); {aside}")
    found = [tuple(w.shape) for w in weights]
    wrong_model = model and meta.get("model") and meta["model"] != model
    if wrong_model or (shapes is not None and found != [tuple(s) for s in shapes]):
        raise CheckpointError(
            f"checkpoint {path} was written for model {meta.get('model') or '?'!r} ({len(found)} arrays, first"
            f" {list(found[:1])}), this run builds model {model!r} ({len(shapes or [])} arrays, first"
            f" {[tuple(s) for s in (shapes or [])[:1]]}); resume with the config the run was started with,"
            f" or give this run another run-name / --out")
    return Checkpoint(meta["round"], weights, state, meta["sampler_draws"], meta["elapsed_seconds"],
                      meta.get("model", ""), fingerprint if isinstance(fingerprint, dict) else None,
                      {str(k): int(v) for k, v in counted.items()} if isinstance(counted, dict) else None)


def checkpoint_fingerprint(run_dir: Path) -> dict | None:
    """The data fingerprint inside the run's checkpoint, read without loading its arrays; None
    without a checkpoint, without a fingerprint in it, or when it cannot be read. Unchecked:
    ``load_checkpoint`` checks the whole file against its SHA-256 (the runner does that first,
    ``fl_app.api.check_checkpoints``, before a sweep launches; the resumed server loads it that way)."""
    try:
        with np.load(Path(run_dir) / CHECKPOINT) as data:
            found = _from_json_array(data[FINGERPRINT_ENTRY]) if FINGERPRINT_ENTRY in data.files else None
    except Exception:  # no file, or unreadable: load_checkpoint names the problem where it matters
        return None
    return found if isinstance(found, dict) else None


def drop_checkpoint(run_dir: Path) -> None:
    """Remove the run's checkpoint (``keep-checkpoint = false``, once the run has finished: it is
    only needed to resume or extend the run, and a CNN's is several MB)."""
    (Path(run_dir) / CHECKPOINT).unlink(missing_ok=True)


def checkpoint_due(every: int, server_round: int, num_rounds: int) -> bool:
    """Checkpoints are written every ``every`` rounds (0: never) and at the last round."""
    return bool(every) and (server_round % every == 0 or server_round >= num_rounds)
