"""What a run prints by default, and what only at Flower's debug level.

By default a failure that fl-drift reports is one ``fl-drift:`` ERROR line
(``fl_app.server.preflight.loud``, which marks the exception ``REPORTED``). Left out then:
Flower's own record of the same exception (its "Simulation raised an exception" line and the
traceback under it, about 80 lines), and the Hugging Face hub's retry lines (12 per loader
while the hub is unreachable, printed by each process that tries it). At Flower's debug level
(``FLWR_LOG_LEVEL=DEBUG`` in the environment of the SuperLink or SuperNode, or
``--federation-config "verbose=true"`` for a simulation) both are printed, and a
``HF_HUB_VERBOSITY`` that the user set is always kept.
"""

from __future__ import annotations

import logging
import os
import warnings

REPORTED = "fl_drift_logged"  # the attribute that marks an exception reported in one line
FLOWER_LOGGER = "flwr"  # Flower's logger (flwr.supercore.logger); fl-drift logs to its child flwr.fl_drift


def flower_debug() -> bool:
    """Whether Flower prints its DEBUG lines: one of its logger's handlers is set to DEBUG."""
    return any(0 < handler.level <= logging.DEBUG for handler in logging.getLogger(FLOWER_LOGGER).handlers)


class HideReported(logging.Filter):
    """Drops a record of Flower's logger whose exception fl-drift has reported already (marked
    ``REPORTED``), unless Flower is at its debug level: the run's log keeps the one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not getattr(exc, REPORTED, False) or flower_debug()


# Third-party warnings that tell an fl-drift user nothing they can act on, ignored where they are
# raised (category, the raising module, the message's start; ``ignore_unhelpful_warnings``) and
# hidden in a run's streamed output (runner/quiet.py); fl-drift's own warnings are never among them.
UNHELPFUL_WARNINGS = (
    # Ray's "Tip: In future versions of Ray, Ray will no longer override accelerator visible devices
    # env var if num_gpus=0 ..." at every ray.init(), i.e. once per simulated run: a note on Ray's
    # own future default for actors without a GPU (fl-drift sets each actor's resources itself);
    # its only advice is an environment variable that would change which GPUs such actors see.
    (FutureWarning, r"ray\._private\.worker", r"Tip: In future versions of Ray"),
    # flwr-datasets' DirichletPartitioner, once per redraw: "The specified min_partition_size (10)
    # was not satisfied ... The probability sampling ... will be repeated. Note: This is not a
    # desired behavior". The split it returns meets min-partition-size, and when its 10 draws all
    # fail, fl-drift's own error says so in one line (tasks/partitioning.py, PartitionError).
    (UserWarning, r"flwr_datasets\.partitioner\.dirichlet_partitioner", r"The specified min_partition_size"),
)


def ignore_unhelpful_warnings() -> None:
    """This process ignores ``UNHELPFUL_WARNINGS`` (each matched by category, module and message,
    so that the libraries' other warnings still show)."""
    for category, module, message in UNHELPFUL_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


def quiet_by_default() -> None:
    """For this process (a ServerApp or ClientApp): Flower's repeat of a reported failure is
    hidden (``HideReported``, added once), unless Flower is at its debug level the third-party
    warnings of ``UNHELPFUL_WARNINGS`` are ignored, and unless Flower is at its debug level or the user
    set ``HF_HUB_VERBOSITY``, the hub's retry warnings are too (its logger at ERROR, and the
    variable set for a ``huggingface_hub`` imported later here or in a child process)."""
    flower = logging.getLogger(FLOWER_LOGGER)
    if not any(isinstance(f, HideReported) for f in flower.filters):
        flower.addFilter(HideReported())
    if not flower_debug():
        ignore_unhelpful_warnings()
    if flower_debug() or "HF_HUB_VERBOSITY" in os.environ:
        return
    os.environ["HF_HUB_VERBOSITY"] = "error"
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
