"""The README's ``flwr run`` block without data fails in one line that names the real cause.

- the line's choice (``fl_app/server/data_source.py``): the hub unreachable and no data folder
  on a SuperLink this run started; a SuperLink an earlier run started (whose environment has
  no ``FL_DATA_DIR``); no local SuperLink at all;
- the local SuperLink found among a process's ancestors, and a run on it noted for the next;
- Flower's traceback of a reported error and the hub's retry lines printed only at Flower's
  debug level (``fl_app/common/verbosity.py``), and by the runner only under ``--verbose``;
- (slow) the README's block run twice as the newcomer did: first without data, then with
  ``FL_DATA_DIR`` exported, each giving its own line and neither a traceback nor a retry line.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fl_app.common import verbosity
from fl_app.server import data_source, preflight
from fl_app.server.data_source import LocalSuperLink, explained, local_superlink
from tasks.datasets import DataUnavailableError, HubUnavailableError

HUB_ERROR = HubUnavailableError("mnist", "ylecun/mnist", "ConnectionError: Couldn't reach 'ylecun/mnist' on the Hub")


# ------------------------------------------------------------------ the line's choice
def test_a_superlink_started_by_an_earlier_run_is_named_with_how_to_stop_it():
    line = str(explained(HUB_ERROR, LocalSuperLink(pid=4242, age=95.0, earlier=True)))
    assert line.startswith("no data for 'mnist': FL_DATA_DIR is not set in the environment of the local SuperLink")
    assert "an earlier `flwr run` started 95 s before this run" in line
    assert "a FL_DATA_DIR exported since is not seen" in line
    assert "stop it (`kill 4242`, README's kill line)" in line
    assert "The Hugging Face hub failed too for 'ylecun/mnist' (ConnectionError" in line
    assert "\n" not in line


def test_a_superlink_this_run_started_names_the_hub_and_the_missing_folder():
    line = str(explained(HUB_ERROR, LocalSuperLink(pid=4242, age=3.0, earlier=False)))
    assert line.startswith("no data for 'mnist': no data folder is set (env FL_DATA_DIR or run-config 'data-dir')"
                           " and the Hugging Face hub failed for 'ylecun/mnist' (ConnectionError")
    assert "Export FL_DATA_DIR=<a folder holding mnist/train.parquet and mnist/test.parquet>" in line
    assert "`kill 4242`, README's kill line: it keeps the environment it was started with" in line
    assert "earlier" not in line


def test_without_a_local_superlink_or_for_other_errors_the_error_is_its_own():
    assert explained(HUB_ERROR, None) is HUB_ERROR
    other = DataUnavailableError("data folder '/x' has no /x/mnist/train.parquet")
    assert explained(other, LocalSuperLink(pid=1, age=99.0, earlier=True)) is other


def test_loud_reports_the_explained_line_once_and_flower_ls_sees_it(monkeypatch, caplog):
    """The line logged and the error re-raised (whose message ``flwr ls`` shows as the run's
    status-details) are the same, marked reported for Flower's traceback filter."""
    monkeypatch.setattr(preflight, "this_superlink", lambda: LocalSuperLink(pid=4242, age=95.0, earlier=True))
    error = HubUnavailableError("mnist", "ylecun/mnist", "ConnectionError: offline")
    with caplog.at_level(logging.ERROR, logger="flwr.fl_drift"), pytest.raises(DataUnavailableError) as raised:
        with preflight.loud(DataUnavailableError), preflight.loud(DataUnavailableError):
            raise error
    lines = [r.getMessage() for r in caplog.records if r.name == "flwr.fl_drift"]
    assert lines == [f"fl-drift: DataUnavailableError: {raised.value}"]
    assert "FL_DATA_DIR is not set in the environment of the local SuperLink" in str(raised.value)
    assert raised.value.__cause__ is error and getattr(raised.value, verbosity.REPORTED)


# ------------------------------------------------------------------ the local SuperLink
def _runs_under_a_superlink(tmp_path: Path, folder: str, seconds_before: float, runs: int) -> list[str]:
    """``runs`` runs on one process started as ``flower-superlink --database <tmp>/<folder>/state.db``:
    as many children, the first ``seconds_before`` after it, each printing what its
    ``local_superlink()`` finds."""
    superlink = tmp_path / "bin" / "flower-superlink"
    superlink.parent.mkdir(exist_ok=True)
    (tmp_path / folder).mkdir(exist_ok=True)
    superlink.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        time.sleep({seconds_before})
        child = "from fl_app.server.data_source import local_superlink; print(local_superlink())"
        for run in range({runs}):
            subprocess.run([sys.executable, "-c", child], check=True)
    """))
    proc = subprocess.run([sys.executable, str(superlink), "--database", str(tmp_path / folder / "state.db")],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_the_local_superlink_is_found_and_a_second_run_on_it_is_told_apart(tmp_path):
    """The first run on a local SuperLink is not 'earlier', the second one on it is (noted in
    its folder; a new SuperLink, with another PID or start time, is told apart by
    ``test_noted_before_is_true_for_the_same_superlink_only``); a SuperLink whose files are not
    in a ``local-superlink`` folder (a deployment's, the runner's) is not a local one."""
    first, second = _runs_under_a_superlink(tmp_path, "local-superlink", 1.0, runs=2)
    match = re.fullmatch(r"LocalSuperLink\(pid=(\d+), age=([0-9.]+), earlier=False\)", first)
    assert match, first
    assert 0.9 <= float(match.group(2)) < 30, first
    assert re.fullmatch(rf"LocalSuperLink\(pid={match.group(1)}, age=[0-9.]+, earlier=True\)", second), second
    assert (tmp_path / "local-superlink" / data_source.RUNS_FILE).read_text().startswith(f"{match.group(1)} ")
    assert _runs_under_a_superlink(tmp_path, "private-home", 0, runs=1) == ["None"]
    assert local_superlink() is None  # pytest runs under no SuperLink


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_noted_before_is_true_for_the_same_superlink_only(tmp_path):
    runs = tmp_path / data_source.RUNS_FILE
    assert not data_source.noted_before(runs, "100 5.00")
    assert data_source.noted_before(runs, "100 5.00")
    assert not data_source.noted_before(runs, "100 6.00")  # the PID reused by a new SuperLink


# ------------------------------------------------------------------ what is printed
def _flower_record(exc: BaseException) -> logging.LogRecord:
    return logging.LogRecord("flwr", logging.ERROR, __file__, 1, "Simulation raised an exception", None,
                             (type(exc), exc, None))


def test_flowers_traceback_of_a_reported_error_only_at_its_debug_level():
    hide = verbosity.HideReported()
    reported, unreported = RuntimeError("said"), RuntimeError("not said")
    setattr(reported, verbosity.REPORTED, True)
    assert not hide.filter(_flower_record(reported))
    assert hide.filter(_flower_record(unreported))
    debug = logging.StreamHandler()
    debug.setLevel(logging.DEBUG)  # as FLWR_LOG_LEVEL=DEBUG or federation-config verbose=true set Flower's handler
    logging.getLogger("flwr").addHandler(debug)
    try:
        assert verbosity.flower_debug()
        assert hide.filter(_flower_record(reported))
    finally:
        logging.getLogger("flwr").removeHandler(debug)


def test_the_hubs_retries_are_hidden_unless_flower_debugs_or_the_user_chose(monkeypatch):
    hub = logging.getLogger("huggingface_hub")
    monkeypatch.setattr(hub, "level", logging.NOTSET)
    monkeypatch.delenv("HF_HUB_VERBOSITY", raising=False)
    verbosity.quiet_by_default()
    assert os.environ["HF_HUB_VERBOSITY"] == "error" and hub.level == logging.ERROR
    assert sum(isinstance(f, verbosity.HideReported) for f in logging.getLogger("flwr").filters) == 1
    verbosity.quiet_by_default()  # added once
    assert sum(isinstance(f, verbosity.HideReported) for f in logging.getLogger("flwr").filters) == 1
    monkeypatch.setenv("HF_HUB_VERBOSITY", "info")
    hub.setLevel(logging.NOTSET)
    verbosity.quiet_by_default()
    assert os.environ["HF_HUB_VERBOSITY"] == "info" and hub.level == logging.NOTSET
    monkeypatch.delenv("HF_HUB_VERBOSITY")
    monkeypatch.setattr(verbosity, "flower_debug", lambda: True)
    verbosity.quiet_by_default()
    assert "HF_HUB_VERBOSITY" not in os.environ and hub.level == logging.NOTSET


def test_the_runner_hides_the_hubs_retries_unless_verbose(monkeypatch):
    from runner.quiet import quiet_libraries

    hub = logging.getLogger("huggingface_hub")
    monkeypatch.setattr(hub, "level", logging.NOTSET)
    monkeypatch.delenv("HF_HUB_VERBOSITY", raising=False)
    quiet_libraries(verbose=False)
    assert os.environ["HF_HUB_VERBOSITY"] == "error" and hub.level == logging.ERROR
    monkeypatch.delenv("HF_HUB_VERBOSITY")
    quiet_libraries(verbose=True)  # the runs it starts show them too (their apps keep a set variable)
    assert os.environ["HF_HUB_VERBOSITY"] == "warning" and hub.level == logging.WARNING


# ------------------------------------------------------------------ the README's block, twice
@pytest.mark.slow
def test_the_readme_block_twice_without_then_with_data(tmp_path):
    """The newcomer's steps: the README's ``flwr run`` block (up to its kill line) without data
    and with the hub unreachable (a closed port: no download wherever the test runs), then
    again after ``export FL_DATA_DIR``, then the kill line. The first run's one line names the
    missing folder and the hub; the second's the SuperLink the first started, still without
    ``FL_DATA_DIR``; neither prints a traceback or a hub retry."""
    from tests.kit import find_data_dir
    from tests.kit_runs import base_env, copy_checkout, processes_with_env, shrink, stop_pids

    data = find_data_dir()
    if not (data / "mnist" / "train.parquet").exists():
        pytest.skip(f"MNIST parquet not found at {data} (set FL_DATA_DIR)")
    block = shrink("run-flwr")
    cut = block.index("# the SuperLink keeps running")  # the comment above README's kill line
    run, kill = block[:cut], block[cut:]
    assert "kill " in kill and "flwr run" in run
    run = run.replace("$((30000 + $(id -u) % 10000 * 2))", str(30000 + (os.getpid() % 5000) * 2))  # a port of its own
    checkout = copy_checkout(tmp_path / "checkout")
    env = {**{k: v for k, v in base_env().items() if k != "FL_DATA_DIR"}, "HF_ENDPOINT": "http://127.0.0.1:9"}
    script = f"set -uo pipefail\n{run}\necho '=== second'\nexport FL_DATA_DIR={data}\n{run}\n{kill}"
    marker = f"FLWR_HOME={checkout / '.flwr_home'}"
    started = time.monotonic()
    try:
        proc = subprocess.run(["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=900, start_new_session=True, check=False)
    finally:
        time.sleep(3)
        left = processes_with_env(marker)
        stop_pids(left)
    out = proc.stdout + proc.stderr
    first, _, second = out.partition("=== second")
    lines = [[line for line in part.splitlines() if "fl-drift: " in line and "ERROR" in line] for part in (first, second)]
    assert [len(part) for part in lines] == [1, 1], out[-6000:]
    assert "no data folder is set (env FL_DATA_DIR or run-config 'data-dir') and the Hugging Face hub failed" \
        in lines[0][0], lines[0][0]
    assert "an earlier `flwr run` started" in lines[1][0] and "FL_DATA_DIR is not set in the environment of the" \
        " local SuperLink" in lines[1][0], lines[1][0]
    assert "Traceback" not in out and "Retrying in" not in out, out[-6000:]
    assert [part.count('"status": "finished:failed"') for part in (first, second)] == [1, 2], out[-6000:]  # flwr ls
    assert not left, f"processes left running (stopped now): {left}"
    assert not list((checkout / "results").glob("*")), "a failed run left a folder in results/"
    print(f"two runs in {time.monotonic() - started:.0f} s; {len(out.splitlines())} lines")
