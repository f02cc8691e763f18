"""Which lines of a ``flwr run --stream`` output are Flower/Ray boilerplate, and the libraries'
own chatter in the runner's process.

The runner hides these (about 40 a run) and prints the rest: fl-drift's own progress and
warnings, the run id, every WARNING it does not know, every ERROR and traceback line. Hidden
as well, unless ``--verbose``: the libraries' deprecation and future warnings (a pyarrow
``FutureWarning`` under flwr-datasets' shard partitioner, SQLAlchemy's ``SADeprecationWarning``
under MLflow), nothing a user of fl-drift can act on, with the source line Python prints under
them; the few other third-party warnings listed with why in ``fl_app/common/verbosity.py``
(``UNHELPFUL_WARNINGS``: Ray's accelerator tip, flwr-datasets' Dirichlet redraws); MLflow's
and alembic's INFO lines when a tracking store is created; and in the runner's own process
(``quiet_libraries``) the same warnings and Hugging Face's progress bars.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

from fl_app.common.verbosity import UNHELPFUL_WARNINGS, ignore_unhelpful_warnings

ANSI = re.compile(r"\x1b\[[0-9;]*m")

NOISE = (
    "Flower configuration not found", "Created default configuration", "Using SuperLink:",
    "Starting logstream", "Starting Flower Simulation", "Since flwr 1.32", "simulated SuperNodes)",
    "To change federation size", "flwr federation simulation-config", "Successfully installed ",
    "Starting Flower ServerApp", "[INIT]", "Using initial global parameters",
    "Starting evaluation of initial global parameters", "initial parameters (loss, other metrics)",
    "In future versions of Ray", "warnings.warn(", "[ROUND ", "configure_fit: strategy sampled",
    "aggregate_fit: received", "No fit_metrics_aggregation_fn", "No evaluate_metrics_aggregation_fn",
    "fit progress:", "configure_evaluate: no clients selected", "[SUMMARY]", "History (loss,",
    "History (metrics,", "Manually terminating ClientAppActor",
    # the source lines Python prints under the library warnings below (LIBRARY_WARNING)
    "return options_class(*args, **kwargs)", "sqlalchemy.orm.configure_mappers()",
)
# A Python warning's first line from a library (its file in site-packages): a deprecation or a
# future change, e.g. ".../site-packages/pyarrow/compute.py:231: FutureWarning: ...".
LIBRARY_WARNING = re.compile(r"[/\\](site|dist)-packages[/\\]\S+\.py:\d+: \w*(Deprecation|Future)\w*Warning\b")
# A third-party warning that says nothing to the user (fl_app/common/verbosity.py, where the apps
# ignore them; listed there with why), as Python prints it: ".../site-packages/ray/_private/
# worker.py:2051: FutureWarning: Tip: In future versions of Ray, ..."
UNHELPFUL_WARNING = re.compile(r"[/\\](site|dist)-packages[/\\]\S+\.py:\d+: \w*Warning: ("
                               + "|".join(message for _, _, message in UNHELPFUL_WARNINGS) + ")")
# MLflow's and alembic's own log lines ("2026/11/25 16:36:47 INFO mlflow.store.db.utils: Creating
# initial MLflow database tables...", "INFO  [alembic.runtime.migration] Context impl SQLiteImpl.")
LIBRARY_INFO = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d INFO (mlflow|alembic)\b|^INFO\s+\[alembic\.")
# The libraries whose deprecation and future warnings the runner's own process hides.
LIBRARIES = ("pyarrow", "datasets", "flwr_datasets", "huggingface_hub", "pandas", "mlflow", "sqlalchemy", "alembic",
             "ray", "flwr")
# Flower's History printout, one value per line: "round 2: 0.29" (losses), then the metrics
# dict pretty-printed: "{'accuracy': [(0, 0.1),", "'min_class_accuracy': [(0, 0.0),",
# "(1, 0.045)," and the closing "(3, 0.31)]}".
HISTORY = re.compile(
    r"^\s*(round \d+: [-0-9.e+naif]+"
    r"|\{?'[^']+': \[\(\d+,.*"
    r"|\(\d+, [-0-9.e+naif]+\)[\]},]*)$"
)


def plain(line: str) -> str:
    """The line without colour codes."""
    return ANSI.sub("", line)


def for_output(line: str, stream=None) -> str:
    """The line as the runner prints it on ``stream`` (stdout by default): with Flower's colour
    codes on a terminal, without them when the output goes to a file or a pipe."""
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return line if isatty is not None and isatty() else plain(line)


def is_noise(line: str) -> bool:
    text = plain(line)
    if "ERROR" in text or "Traceback" in text or "fl-drift:" in text:
        return False
    message = text.split(":", 1)[1].strip() if re.match(r"^\s*(INFO|DEBUG)\s*:", text) else text.strip()
    if not message:
        return True
    if re.match(r"^Run finished \d+ round", message):
        return True
    if LIBRARY_WARNING.search(text) or UNHELPFUL_WARNING.search(text) or LIBRARY_INFO.match(text.strip()):
        return True
    return any(n in text for n in NOISE) or bool(HISTORY.match(message))


# How a run that stopped itself ends its output: the ServerApp raises ``RunAborted`` (too few
# usable updates, e.g. every reply non-finite; fl_app/server/participation.py), Flower prints
# the exception with its traceback and then its exit-code lines. The runner says why the run
# stopped in one line from its summary.json ("stopped after 2 rounds: ..."), so these are hidden.
STOP_EXCEPTION = "fl_app.server.participation.RunAborted:"
TRACEBACK_OPENERS = ("Simulation raised an exception", "ServerApp thread raised an exception",
                     "Traceback (most recent call last):")
AFTER_STOP = ("Exit Code: 700", "An unhandled exception occurred when running the simulation",
              "ref-exit-codes/700")


class HeldTraceback:
    """The lines of a streamed run output to show, with a traceback held back until its last
    line names the exception: the traceback of the run's own stop (``STOP_EXCEPTION``) and
    Flower's exit-code lines after it are dropped (they are in the run's log, and its stop is
    said in one line); any other traceback is shown whole, as before."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.stopped = False

    def feed(self, line: str) -> list[str]:
        """The lines to show now, given the next line of the output."""
        text = plain(line).strip()
        if self.stopped and any(a in text for a in AFTER_STOP):
            return []
        if not self.held and not any(text.endswith(o) or text.startswith(o) for o in TRACEBACK_OPENERS):
            return [line]
        self.held.append(line)
        if plain(line)[:1].isspace() or not text or any(o in text for o in TRACEBACK_OPENERS):
            return []  # a frame of the traceback, or its opening lines
        block, self.held = self.held, []
        self.stopped = text.startswith(STOP_EXCEPTION)
        return [] if self.stopped else block


# fl-drift's per-round line: "round 3/10: test accuracy 0.81, test loss 0.6, clients 5, failures 0, 2.1s"
PROGRESS = re.compile(r"\bround \d+/\d+: ")


def is_progress(line: str) -> bool:
    """What ``--quiet`` prints of a run's output: the per-round lines and fl-drift's errors
    (not its start-up lines: the execution path, the initial model's accuracy)."""
    text = plain(line)
    return bool(PROGRESS.search(text)) or ("fl-drift:" in text and "ERROR" in text)


def quiet_libraries(verbose: bool) -> None:
    """The runner's own process, unless ``verbose``: the deprecation and future warnings of
    ``LIBRARIES`` are ignored (``--check`` partitions the data in this process, and a shard split
    meets pyarrow's ``FutureWarning``), and ``HF_DATASETS_DISABLE_PROGRESS_BARS`` is set unless the
    user set it (the "Generating train split" bars, here and in the processes the runner starts,
    which inherit the environment). ``HF_HUB_VERBOSITY`` likewise, unless the user set it: "error"
    hides the hub's retry lines (12 per loader while it is unreachable), "warning" under
    ``verbose`` shows them here and in the runs (whose apps hide them when it is unset:
    ``fl_app/common/verbosity.py``). fl-drift's own warnings are never hidden."""
    os.environ.setdefault("HF_HUB_VERBOSITY", "warning" if verbose else "error")
    level = logging.getLevelName(os.environ["HF_HUB_VERBOSITY"].upper())
    if isinstance(level, int):  # a hub already imported; one imported later reads the variable
        logging.getLogger("huggingface_hub").setLevel(level)
    if verbose:
        return
    ignore_unhelpful_warnings()  # Ray's accelerator tip, flwr-datasets' Dirichlet redraws (why: their list)
    for library in LIBRARIES:
        for category in (DeprecationWarning, FutureWarning):
            warnings.filterwarnings("ignore", category=category, module=rf"{library}(\.|$)")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "datasets" in sys.modules and os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1":
        sys.modules["datasets"].disable_progress_bars()  # imported already: it read the variable then
