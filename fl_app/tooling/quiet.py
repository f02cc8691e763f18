"""Which lines of a ``flwr run --stream`` output are Flower/Ray boilerplate.

The runner hides these (about 40 a run) and prints the rest: fl-drift's own progress and
warnings, the run id, every WARNING it does not know, every ERROR and traceback line.
"""

from __future__ import annotations

import re
import sys

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
)
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
    return any(n in text for n in NOISE) or bool(HISTORY.match(message))
