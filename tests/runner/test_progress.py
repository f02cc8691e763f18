"""runner/progress.py through the sweep's progress printer: elapsed time and ETAs of a run and
of the sweep on its round lines and [i/n] lines, and the estimate against the actual time at the
end (a fake clock: no simulation)."""

import argparse

from runner.progress import Progress
from runner.sweep import progress_printer


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def round_line(k, n):
    return f"INFO :      round {k}/{n}: test accuracy 0.5, test loss 1.0, clients 3, failures 0, 10.0s"


def test_round_lines_show_the_runs_and_the_sweeps_elapsed_time_and_time_left(capsys):
    clock = Clock()
    progress = Progress({1: 100.0, 2: 100.0}, low=150.0, high=260.0, clock=clock)
    args = argparse.Namespace(verbose=False, quiet=False)
    printer = progress_printer(args, [], "    ", progress, 1)
    assert progress.start(1) == "sweep 0 s, ~3.3 min left"  # both runs' estimates
    clock.now += 40  # start-up
    printer(round_line(1, 4))  # the server's line gives the round's 10 s: 3 rounds left
    clock.now += 10
    printer(round_line(2, 4).replace("10.0s", "20.0s"))  # 15 s a round, 2 left
    printer("INFO :      asked 10 nodes for their partition in 26.5s")  # not a round line: unchanged
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("[run 40 s, ~30 s left; sweep 40 s, ~2.2 min left]")
    assert out[1].endswith("[run 50 s, ~30 s left; sweep 50 s, ~2.2 min left]")
    assert out[2].endswith("in 26.5s")
    clock.now += 20
    progress.finish(1)  # 70 s against 100 estimated: the rest of the sweep is scaled by 0.7
    assert progress.start(2) == "sweep 70 s, ~70 s left"
    clock.now += 80
    progress.finish(2)
    assert progress.summary() == ("time: 2 runs took 2.5 min; estimated 3.3 min (range 2.5 min to 4.3 min) before"
                                  " they started: 0.75x the estimate, inside its range")


def test_quiet_and_parallel_runs_and_no_estimate(capsys):
    clock = Clock()
    progress = Progress({1: 60.0, 2: 60.0, 3: 60.0, 4: 60.0}, workers=2, clock=clock)
    progress.start(1)
    progress.start(2)
    clock.now += 30
    quiet = progress_printer(argparse.Namespace(verbose=False, quiet=True), [], "  [2/4] ", progress, 2)
    quiet("INFO :      initial model: test accuracy 0.1, loss 2.3")  # --quiet leaves it out
    quiet(round_line(1, 3))
    # left: run 1 30 s (its estimate), run 2 2 x 10 s, runs 3 and 4 60 s each; two at a time: 85 s
    assert capsys.readouterr().out.strip() == f"[2/4] {round_line(1, 3)}  [run 30 s, ~20 s left; sweep 30 s, ~85 s left]"
    blind = Progress({}, clock=clock)
    blind.start(1)
    clock.now += 5
    assert blind.line(1, "round 1/2: test accuracy 0.5").endswith("[run 5 s; sweep 5 s]")  # no seconds given
    clock.now += 5
    assert blind.line(1, "round 2/3: test accuracy 0.5").endswith("[run 10 s, ~5 s left; sweep 10 s]")
    assert blind.summary() == "time: 1 runs took 10 s (no estimate was made)"
    # a round line of a run the progress was not told of is printed as it is
    assert progress.line(7, round_line(1, 2)) == round_line(1, 2)
