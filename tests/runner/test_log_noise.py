"""The runner's output: Flower's History printout hidden line by line, colour codes only on a
terminal (runner/quiet.py)."""

from __future__ import annotations

import io

from runner.quiet import for_output, is_noise

INFO = "\x1b[92mINFO \x1b[0m:      "
# The tail of a real `flwr run --stream` output (MNIST, 3 rounds), as the runner received it.
HISTORY_TAIL = [
    "\t 'min_class_accuracy': [(0, 0.0),",
    "\t                        (1, 0.045174537987679675),",
    "\t                        (2, 0.21765913757700206),",
    "\t                        (3, 0.319755600814664)]}",
    "\t{'accuracy': [(0, 0.1135), (1, 0.69),",
    "\t\tround 2: 0.293863037109375",
    "\t              (3, nan)]}",
]


def test_every_line_of_the_history_printout_is_noise():
    for line in HISTORY_TAIL:
        assert is_noise(INFO + line), line


def test_progress_and_errors_are_not_noise():
    assert not is_noise(INFO + "round 1/3: test accuracy 0.6900, test loss 1.7216, clients 5, failures 0, 219.6s")
    assert not is_noise(INFO + "initial model: test accuracy 0.1135, loss 2.3026")
    assert not is_noise("\x1b[91mERROR \x1b[0m:     (0, 1.5)")  # an ERROR line is always shown


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_codes_only_on_a_terminal():
    line = INFO + "round 1/3: test accuracy 0.6900"
    assert for_output(line, io.StringIO()) == "INFO :      round 1/3: test accuracy 0.6900"
    assert for_output(line, _Terminal()) == line
    assert "\x1b" not in for_output(line, object())  # a stream that cannot tell: plain
