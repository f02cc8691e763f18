"""A runner that cannot outlive itself or share a folder.

Without a guard, `kill -9` of `run_simulation.py` leaves 13 processes (SuperLink, SuperExec,
flwr-simulation, Ray) that finish the run unattended, and a `--resume` of the same folder started
meanwhile writes into it too. A watchdog (runner/watchdog.py) stops everything with the runner's
FLWR_HOME when the runner dies, Ray's session folders live in a private temp folder that goes
with it, and a results folder is held by one runner at a time (an flock'ed ``.lock``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fl_app.common.procfs import descendants, environ_of, processes_with_env
from runner.processes import FolderInUse, lock_folder
from tests.kit import ROOT

GONE_WITHIN = 30.0  # seconds after the runner's death within which its processes are gone


def wait_until(condition, timeout: float, step: float = 0.2):
    """``condition()``'s first truthy value within ``timeout`` s, else its last value."""
    deadline = time.monotonic() + timeout
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(step)
    return value


def python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, **kwargs)


# ---- the folder lock ------------------------------------------------------------------------------------

def test_a_held_folder_is_refused_naming_the_holder_and_a_dead_holder_s_lock_is_taken(tmp_path):
    out = tmp_path / "out"
    holder = python(f"from runner.processes import lock_folder; import time; lock_folder(__import__('pathlib')"
                    f".Path({str(out)!r})); print('held', flush=True); time.sleep(120)", stdout=subprocess.PIPE,
                    text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=f"in use by another run_simulation.py, PID {holder.pid}"):
            lock_folder(out)
    finally:
        holder.kill()  # SIGKILL: the lock is left behind, stale
        holder.wait()
    fd = lock_folder(out)  # taken over
    try:
        assert (out / ".lock").read_text() == f"{os.getpid()}\n"
    finally:
        os.close(fd)


# ---- the watchdog, without Flower ------------------------------------------------------------------------

LAUNCHER = """
import os, subprocess, sys, time
from pathlib import Path
marker, folder = sys.argv[1], sys.argv[2]
watchdog = subprocess.Popen([sys.executable, "-m", "runner.watchdog", "--marker", f"FLWR_HOME={marker}",
                             f"--remove={folder}"], stdin=subprocess.PIPE, start_new_session=True)
# like SuperExec: a child in a session of its own that ignores SIGTERM (only SIGKILL ends it)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                          " time.sleep(600)"], env={**os.environ, "FLWR_HOME": marker}, start_new_session=True)
print(child.pid, flush=True)
if sys.argv[3] == "close":
    child.kill(); child.wait()
    watchdog.communicate(b"done")
    print("closed", flush=True)
time.sleep(600)
"""


def test_the_watchdog_stops_a_dead_launcher_s_processes_and_removes_its_folders(tmp_path):
    marker, folder = str(tmp_path / "home"), tmp_path / "ray"
    folder.mkdir()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, marker, str(folder), "die"], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    assert wait_until(lambda: processes_with_env("FLWR_HOME", marker) == [child], 10), processes_with_env(
        "FLWR_HOME", marker)
    launcher.kill()  # kill -9: the watchdog's pipe closes
    launcher.wait()
    assert wait_until(lambda: not processes_with_env("FLWR_HOME", marker), GONE_WITHIN), processes_with_env(
        "FLWR_HOME", marker)
    assert wait_until(lambda: not folder.exists(), 10), "the watchdog did not remove the folder"


def test_the_watchdog_of_a_launcher_that_closed_touches_nothing(tmp_path):
    marker, folder = str(tmp_path / "home"), tmp_path / "ray"
    folder.mkdir()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, marker, str(folder), "close"], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
    try:
        launcher.stdout.readline()
        assert launcher.stdout.readline().strip() == "closed"  # the watchdog has exited on "done"
    finally:
        launcher.kill()
        launcher.wait()
    time.sleep(1)
    assert folder.exists()


# ---- Ray's renamed agents, a second marker, no folder before the watchdog ------------------------------

# A launcher with a LocalSimulation's watchdog (no SuperLink), and two processes like the Ray processes
# that outlived a killed runner: a "SuperExec" in a session of its own carrying FLWR_HOME, whose child
# ("ray::DashboardAgent", whose /proc environ shows neither marker: Ray's setproctitle zeroed it) stays
# in that session, outlives it and ignores SIGTERM; and a process that carries only RAY_TMPDIR.
RAY_LIKE = """
import os, subprocess, sys, time
from runner.launch import LocalSimulation
sim = LocalSimulation()
sim.start_watchdog()
bare = {k: v for k, v in os.environ.items() if k not in ("FLWR_HOME", "RAY_TMPDIR")}
ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
leader = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; p = subprocess.Popen([sys.executable,"
                           f" '-c', {ignore!r}], env={bare!r}); print(p.pid, flush=True); time.sleep(600)"],
                          env={**bare, "FLWR_HOME": str(sim.home)}, start_new_session=True, stdout=subprocess.PIPE)
agent = int(leader.stdout.readline())
ray_only = subprocess.Popen([sys.executable, "-c", ignore], env={**bare, "RAY_TMPDIR": str(sim.ray_dir)},
                            start_new_session=True)
print(sim.home, sim.ray_dir, leader.pid, agent, ray_only.pid, flush=True)
time.sleep(600)
"""


def test_the_watchdog_stops_ray_processes_that_show_no_flwr_home_and_removes_the_folders_it_made():
    """After a ``kill -9`` of the runner, ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` can live
    on for a minute, their environment in /proc lacking FLWR_HOME, the watchdog's first marker."""
    launcher = python(RAY_LIKE, stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        home, ray_dir, *words = launcher.stdout.readline().split()
        pids = [int(w) for w in words]
        leader, agent, ray_only = pids
        assert Path(home).is_dir() and Path(ray_dir).is_dir()
        assert os.getsid(agent) == leader and "FLWR_HOME" not in environ_of(agent)
        assert "FLWR_HOME" not in environ_of(ray_only)
        launcher.kill()  # kill -9
        launcher.wait()
        assert wait_until(lambda: not any(map(running, pids)), GONE_WITHIN), [p for p in pids if running(p)]
        assert wait_until(lambda: not Path(home).exists() and not Path(ray_dir).exists(), 10)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_simulation_never_started_makes_no_folder(tmp_path, monkeypatch):
    """A runner killed before ``start()`` leaves no empty ``fl-drift-flwr-*``: the home is made by
    the watchdog (which removes it), not in ``__init__``."""
    import tempfile

    from runner.launch import LocalSimulation

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    simulation = LocalSimulation()
    assert simulation.close() == []
    assert list(tmp_path.iterdir()) == []


def test_the_sessions_of_marked_leaders_are_owned_but_never_a_spared_one(tmp_path):
    from runner.processes import marked_sessions

    marker = ("FLWR_HOME", str(tmp_path / "home"))
    leader = python("import time; time.sleep(60)", env={**os.environ, marker[0]: marker[1]}, start_new_session=True)
    member = python("import time; time.sleep(60)", env={**os.environ, marker[0]: marker[1]})  # in pytest's session
    try:
        assert wait_until(lambda: processes_with_env(*marker) == sorted([leader.pid, member.pid]), 10)
        assert marked_sessions([marker]) == {leader.pid}  # not pytest's own session, though a member is marked
        assert marked_sessions([marker], spare={leader.pid}) == set()
    finally:
        for proc in (leader, member):
            proc.kill()
            proc.wait()


# ---- a real runner, killed with SIGKILL ------------------------------------------------------------------

def runner(out: Path, data: Path, *extra: str) -> subprocess.Popen:
    argv = ["--strategy", "fedavg", "--dataset", "mnist", "--data-dir", str(data), "--set", "model=cnn-small",
            "--set", "tracking=none", "--clients", "2", "--rounds", "50", "--out", str(out), *extra]
    return subprocess.Popen([sys.executable, "run_simulation.py", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def started_ray(pid: int) -> dict[int, tuple[str, str]] | None:
    """The runner's process tree once Ray's raylet runs in it, else None."""
    tree = descendants([pid])
    return tree if any(name == "raylet" for _, name in tree.values()) else None


# a real simulation up to Ray, then its death: 45 s on a 2-core machine at load 3.5 (the default run keeps it)
def test_kill_9_of_the_runner_leaves_no_process_and_frees_its_folder(tmp_path, mnist_sample):
    data, out = mnist_sample(600, 100), tmp_path / "out"
    first = runner(out, data)
    try:
        tree = wait_until(lambda: first.poll() is None and started_ray(first.pid), 300, step=0.5)
        assert tree, f"the runner ended or Ray never started: {first.stdout.read() if first.poll() else ''}"
        home = next(env["FLWR_HOME"] for pid in tree if "FLWR_HOME" in (env := environ_of(pid)))
        ray_dir = Path(next(env["RAY_TMPDIR"] for pid in tree if "RAY_TMPDIR" in (env := environ_of(pid))))
        assert list((ray_dir / "ray").glob("session_2*")), "Ray did not use its private temp folder"
        marked = processes_with_env("FLWR_HOME", home)
        assert len(marked) >= 5  # SuperLink, SuperExec, flwr-simulation, flwr run, Ray's daemons and workers

        # a second runner on the folder in use, by --out or by --resume, is refused in one line
        same_out = ["--strategy", "fedavg", "--dataset", "mnist", "--data-dir", str(data), "--set", "model=cnn-small",
                    "--clients", "2", "--out", str(out)]
        for argv in (same_out, ["--resume", str(out)]):
            done = subprocess.run([sys.executable, "run_simulation.py", *argv], cwd=ROOT, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 2, done.stderr
            assert done.stderr.count("\n") == 1 and f"in use by another run_simulation.py, PID {first.pid}" in done.stderr

        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed = time.monotonic()
        early = try_lock(out)  # the watchdog holds the lock until the dead runner's processes are gone:
        if early is not None:  # taken now, so none may be left (processes do not come back)
            os.close(early)
            assert not processes_with_env("FLWR_HOME", home), "the folder was free while the runner's processes ran"
        gone = wait_until(lambda: not processes_with_env("FLWR_HOME", home), GONE_WITHIN)
        assert gone, f"processes left {GONE_WITHIN:.0f} s after kill -9: {processes_with_env('FLWR_HOME', home)}"
        print(f"every process of the runner gone {time.monotonic() - killed:.1f} s after kill -9")
        assert wait_until(lambda: not ray_dir.exists() and not Path(home).exists(), 10)
        fd = wait_until(lambda: try_lock(out), 10)  # the stale lock is taken over once the watchdog is done
        assert fd, "the dead runner's folder stayed locked"
        os.close(fd)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


RAY_AGENTS = ("ray::DashboardA", "ray::RuntimeEnv")  # their names in /proc/<pid>/stat (15 characters)


def with_ray_agents(pid: int) -> dict[int, tuple[str, str]] | None:
    """The runner's process tree once Ray's dashboard agent and runtime-env agent run in it, else None."""
    tree = descendants([pid])
    names = {name for _, name in tree.values()}
    return tree if all(agent in names for agent in RAY_AGENTS) else None


def kill_9_probe(tmp_path: Path, data: Path) -> dict:
    """Start a runner, wait until its rounds run (Ray's agents up, the first round's line printed), kill
    it with SIGKILL and look 10 s later: what is left of its processes (by FLWR_HOME, by RAY_TMPDIR,
    by the PIDs and sessions of its tree) and of its temporary folders."""
    import threading

    from fl_app.common.procfs import alive

    out = tmp_path / "out"
    proc = runner(out, data)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        tree = wait_until(lambda: proc.poll() is None and any("round 1" in line.lower() for line in lines)
                          and with_ray_agents(proc.pid), 300, step=0.5)
        assert tree, f"the runner ended or its rounds never ran: {''.join(lines[-20:])}"
        envs = {pid: environ_of(pid) for pid in tree}
        home = next(env["FLWR_HOME"] for env in envs.values() if "FLWR_HOME" in env)
        ray_dir = next(env["RAY_TMPDIR"] for env in envs.values() if "RAY_TMPDIR" in env)
        watchdog = next(pid for pid in tree if "runner.watchdog" in Path(f"/proc/{pid}/cmdline").read_text())
        owned = {sid for pid in tree if (sid := session_table().get(pid)) not in (None, proc.pid, watchdog)}
        agents = {pid: name for pid, (_, name) in tree.items() if name in RAY_AGENTS}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(10)
        table = session_table()
        return {
            "agents": agents,
            "agents_showing_no_marker": [pid for pid in agents if not {"FLWR_HOME", "RAY_TMPDIR"} <= set(envs[pid])],
            "marked": processes_with_env("FLWR_HOME", home) + processes_with_env("RAY_TMPDIR", ray_dir),
            "tree": [pid for pid in alive({p: i for p, i in tree.items() if p not in (proc.pid, watchdog)})],
            "in_sessions": sorted(pid for pid, sid in table.items() if sid in owned),
            "folders": [f for f in (home, ray_dir) if Path(f).exists()],
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def session_table() -> dict[int, int]:
    """pid -> session of every running process (zombies left out)."""
    table = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if running(int(entry)):
                table[int(entry)] = os.getsid(int(entry))
        except OSError:
            continue
    return table


@pytest.mark.slow  # a real simulation up to its first round: 1-2 minutes on a loaded 2-core machine
def test_kill_9_mid_run_leaves_no_ray_process_and_no_folder_10_s_later(tmp_path, mnist_sample):
    """After a ``kill -9`` of the runner, no ``ray::DashboardAgent`` or ``ray::RuntimeEnvAgent`` is alive
    10 s later (unguarded, they were 30 s later in 2 of 4 kills), and no empty ``fl-drift-flwr-*`` is left."""
    found = kill_9_probe(tmp_path, mnist_sample(600, 100))
    print(found)
    left = {key: found[key] for key in ("marked", "tree", "in_sessions", "folders") if found[key]}
    assert not left, f"10 s after kill -9: {left} (Ray's agents were {found['agents']})"


def try_lock(folder: Path) -> int | None:
    try:
        return lock_folder(folder)
    except FolderInUse:
        return None


# ---- a port taken between free_port() and the SuperLink's bind ---------------------------------------
def test_a_superlink_port_taken_before_it_binds_is_retried_on_fresh_ports():
    """Under --parallel another run's Ray can bind the port free_port() chose before the
    SuperLink does; the SuperLink then exits with "address already in use". The launcher
    starts it again on fresh ports (before: "flower-superlink exited early", the run lost)."""
    import socket

    from runner.launch import LocalSimulation

    simulation = LocalSimulation()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", simulation.http_port))
        taken.listen()
        chosen = simulation.http_port
        try:
            simulation.start()
            assert simulation.http_port != chosen
            assert simulation.env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] == str(simulation.http_port)
            assert b"address already in use" in simulation.log_file.read_bytes().lower()  # the first try hit it
        finally:
            assert simulation.close() == []
