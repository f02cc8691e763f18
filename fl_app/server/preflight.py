"""Checks that fail a run before anything is launched or written, with one clear message.

Used by ``run_simulation.py`` (before it starts a SuperLink) and by the ServerApp (before it
creates the run folder). ``loud`` turns a configuration error raised inside the ServerApp into
one ``ERROR`` line that starts with ``fl-drift:`` at the moment it happens, ahead of the
traceback that Flower prints when the run ends.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from fl_app.common.faults import parse_faults
from fl_app.common.verbosity import REPORTED
from fl_app.server.data_source import explained, this_superlink
from fl_app.server.screening import check_replies
from protocol.keys import ConfigError
from tasks.server_side import checked_data_dir

log = logging.getLogger("flwr.fl_drift")


def check_data_dir(cfg: dict) -> None:
    """An explicit ``data-dir`` must be an existing folder (``check_data_folder``) holding both
    splits of the dataset (``tasks.server_side.checked_data_dir``: ``DataUnavailableError``
    naming the missing file). The ServerApp makes the two checks apart: the folder with its
    config checks, the files in its one call to the model and data side (``server_side``)."""
    check_data_folder(cfg)
    checked_data_dir(cfg)


def check_data_folder(cfg: dict) -> None:
    """An explicit ``data-dir`` must be an existing folder: a missing one is a typo, not a
    reason to try the Hugging Face hub (which retries for half a minute)."""
    configured = cfg.get("data-dir", "")
    if not configured or cfg.get("dataset") == "synthetic":
        return
    path = Path(configured).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"run-config key 'data-dir' = {configured!r} is invalid: no such folder ({path.resolve()});"
            f" it must hold {cfg['dataset']}/train.parquet and {cfg['dataset']}/test.parquet"
            f" (leave data-dir empty to use $FL_DATA_DIR or the Hugging Face hub id {hub_id(cfg['dataset'])})"
        )


def hub_id(dataset: str) -> str:
    from tasks.catalogue import DATASETS

    return DATASETS[dataset].hub_id if dataset in DATASETS else "?"


def check_nodes(cfg: dict, num_nodes: int) -> None:
    """The federation must be able to reach ``min-available-clients``, and its rounds must
    sample as many clients as the screening rule needs (``check_replies``)."""
    wanted = cfg["min-available-clients"]
    if wanted > num_nodes:
        raise ConfigError(
            f"run-config key 'min-available-clients' = {wanted} is invalid: the federation has only"
            f" {num_nodes} SuperNode(s); the server would wait for {wanted} nodes"
            f" (raise the number of SuperNodes/--clients to {wanted} or lower min-available-clients)"
        )
    check_replies(cfg, num_nodes)
    check_fault_partitions(cfg, num_nodes)


def check_fault_partitions(cfg: dict, num_partitions: int) -> None:
    """Every partition ``inject-faults`` names must exist: an attack on partition 99 of 4 would
    be a clean run (no node has that partition), and a study would report a defence that lost
    nothing. One line naming the item and the valid range."""
    missing = sorted(k for k in parse_faults(cfg["inject-faults"]) if isinstance(k, int) and k >= num_partitions)
    if missing:
        raise ConfigError(
            f"run-config key 'inject-faults' = {cfg['inject-faults']!r} is invalid: partition {missing[-1]} does not"
            f" exist; the federation has {num_partitions} partition(s), so a fault or attack names one of 0 to"
            f" {num_partitions - 1}")


@contextlib.contextmanager
def loud(*errors: type[BaseException]):
    """Log ``errors`` raised in the block as one ERROR line (once, also through nested
    ``loud`` blocks), then re-raise them marked ``REPORTED``, so that Flower's traceback of
    them is printed only at its debug level (``fl_app/common/verbosity.py``). A data source
    that failed is re-raised as the error that names the real cause (``data_source.explained``:
    a local SuperLink started earlier with another environment, or the hub unreachable), so
    the line and the run's status in ``flwr ls`` say the same."""
    try:
        yield
    except errors as exc:
        if getattr(exc, REPORTED, False):  # an inner ``loud`` said it already
            raise
        reported = explained(exc, this_superlink())
        log.error("fl-drift: %s: %s", type(reported).__name__, reported)
        setattr(reported, REPORTED, True)
        if reported is exc:
            raise
        raise reported from exc
