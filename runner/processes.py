"""Starting and stopping Flower's processes: free ports, private environments, process trees.

Flower starts SuperExec (and through it the simulation, Ray and ClientApp processes) in new
sessions, so stopping one process group misses them. ``Managed`` remembers every descendant
it has seen while the tree was intact, and ``stop_processes`` ends the groups and then each
remembered PID. Used by the simulation launcher (``runner/launch.py``) and the
deployment launcher (``runner/deploy.py``); /proc is read by ``fl_app/common/procfs.py``.

Every process a launcher starts inherits its private ``FLWR_HOME`` (``private_env``), Ray's
daemons and workers included, so ``stop_marked`` finds and stops them by that marker (and
the sessions of marked processes: Ray's renamed agents may no longer show it) even after the
tree is broken (its launcher killed); ``runner/watchdog.py`` does so when a launcher dies.
``lock_folder`` gives one runner at a time a results folder.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from fl_app.common.procfs import alive, ancestors, descendants, processes_with_any_env, sessions

BIN_DIR = Path(sys.executable).parent


class MissingTool(RuntimeError):
    """A Flower console script is neither beside this Python nor on PATH."""


def exe(name: str) -> str:
    """A console script of this Python environment (flwr, flower-superlink, ...): the one
    beside ``sys.executable``, else the one on PATH; ``MissingTool`` naming it when neither."""
    path = BIN_DIR / name
    if path.exists():
        return str(path)
    if shutil.which(name) is None:
        raise MissingTool(f"{name} is neither beside {sys.executable} nor on PATH: install fl-drift's"
                          " dependencies into this Python (pip install -e .) or run the python of the venv"
                          " that has them")
    return name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_env(home: Path | None, **extra: str) -> dict[str, str]:
    """The environment for processes of one launcher: its own FLWR_HOME (none yet when
    ``home`` is None: ``LocalSimulation`` sets it once its watchdog has made it), no runtime
    dependency installation, no update check, unbuffered output, absolute FL_DATA_DIR, and
    this Python's bin folder first on PATH.

    SuperExec's poll for new runs stays at Flower's 1 s: a 0.1 s poll starts a run 0.45 s
    sooner on average but keeps SuperLink and SuperExec at 8% of a core (1.8% at 1 s), which
    a 2-core simulation loses over every round (docs/performance.md, "What was tried and did not work")."""
    env = {
        **os.environ,
        # the SuperLink starts flower-superexec by name: this environment's, even when the
        # venv's bin is not on PATH (venv/bin/python run_simulation.py)
        "PATH": os.pathsep.join([str(BIN_DIR), *filter(None, [os.environ.get("PATH")])]),
        **({"FLWR_HOME": str(home)} if home is not None else {}),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    if env.get("FL_DATA_DIR"):
        env["FL_DATA_DIR"] = str(Path(env["FL_DATA_DIR"]).resolve())
    return env


@dataclass
class Managed:
    name: str
    proc: subprocess.Popen
    log: Path
    seen: dict[int, tuple[str, str]] = field(default_factory=dict)  # pid -> (start, name)

    def refresh(self) -> None:
        if self.proc.poll() is None:
            self.seen.update(descendants([self.proc.pid]))


def stop_processes(managed: list[Managed], grace: float = 5.0) -> list[int]:
    """SIGTERM every group, wait, SIGKILL what is left (groups, then each PID seen).

    Returns the PIDs still alive afterwards (empty on success)."""
    for m in managed:
        m.refresh()
    seen = {pid: info for m in managed for pid, info in m.seen.items()}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for m in managed:
            if m.proc.poll() is None:
                try:
                    os.killpg(m.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        if sig == signal.SIGKILL:
            for pid in alive(seen):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            for m in managed:
                if m.proc.poll() is None:
                    try:
                        m.proc.wait(timeout=0.1)
                    except subprocess.TimeoutExpired:
                        pass
            if not alive(seen):
                return []
            time.sleep(0.1)
    return alive(seen)


Marker = tuple[str, str]  # (NAME, VALUE): an environment entry every process of a launcher carries


def spared_sessions() -> set[int]:
    """The sessions ``stop_marked`` never ends: this process's and each of its ancestors'
    (the runner's terminal, its shell), whatever their processes' environment holds."""
    return {sid for pid in (os.getpid(), *ancestors(os.getpid())) if (sid := _getsid(pid)) is not None}


def marked_sessions(markers: list[Marker], spare: set[int] | None = None) -> set[int]:
    """The sessions led by a process that carries one of ``markers`` (a SuperExec, the
    SuperLink, ``flwr run``: each started in a session of its own), but those of ``spare``
    (default ``spared_sessions()``)."""
    spare = spared_sessions() if spare is None else spare
    table = sessions()
    return {pid for pid in processes_with_any_env(markers) if table.get(pid) == pid and pid not in spare}


def stop_marked(markers: list[Marker], grace: float = 5.0, limit: float = 25.0, owned: Iterable[int] = (),
                spare: set[int] | None = None) -> list[int]:
    """Stop every process of a launcher: each whose environment has one of ``markers`` (its
    FLWR_HOME, its Ray's RAY_TMPDIR) and each in a session such a process leads or led
    (``owned``: sessions found before, e.g. by ``marked_sessions`` while their leaders ran).

    By session because a marker is not enough: Ray's agents and idle workers (``ray::
    DashboardAgent``, ``ray::RuntimeEnvAgent``, ``ray::IDLE``) rename themselves, which
    zeroes the start of their environment block in /proc, so they may show neither marker
    (a dashboard agent can outlive a ``kill -9``'d runner by a minute). They run in the
    session of the SuperExec that started the simulation (Ray starts its processes in the
    driver's session), and stay in it once their parents are dead.

    SIGTERM, then SIGKILL to those still there ``grace`` s later, scanning /proc again every
    0.2 s (a dying Ray raylet or SuperExec can start one more process) until none is left or
    ``limit`` s have passed. Never this process, its ancestors, or a session of ``spare``
    (default ``spared_sessions()``). Returns the PIDs left (empty on success)."""
    spare = spared_sessions() if spare is None else spare
    spare_pids = {1, os.getpid(), *ancestors(os.getpid())}
    owned = set(owned) - spare
    first_seen: dict[int, float] = {}
    deadline = time.monotonic() + limit
    while True:
        table = sessions()
        marked = processes_with_any_env(markers)
        owned |= {pid for pid in marked if table.get(pid) == pid and pid not in spare}
        pids = sorted((set(marked) | {pid for pid, sid in table.items() if sid in owned}) - spare_pids)
        if not pids:
            return []
        now = time.monotonic()
        if now > deadline:
            return pids
        for pid in pids:
            if pid not in first_seen:
                first_seen[pid], sig = now, signal.SIGTERM
            elif now - first_seen[pid] >= grace:
                sig = signal.SIGKILL
            else:
                continue
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.2)


def _getsid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


class FolderInUse(RuntimeError):
    """Another runner holds the results folder's lock."""


LOCK_NAME = ".lock"


def lock_folder(folder: Path) -> int:
    """Create ``folder`` if needed and hold ``<folder>/.lock`` (``fcntl.flock``, exclusive),
    with this process's PID written in it; returns the open descriptor, which holds the lock
    until it is closed, and the kernel closes it when the process dies by any signal: a stale
    lock of a dead runner is simply taken. A descriptor handed to a child (the watchdog,
    ``LocalSimulation(hold=...)``) keeps the lock held until that child ends too. A lock file
    its holder removed on release (``release_folder``) between our open and our lock is not
    the folder's lock any more: the lock is taken again on the file now at the path.

    ``FolderInUse`` names the holder's PID when another process holds it; ``OSError`` when
    the folder cannot be made or written (a file in its place, no permission)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise FolderInUse(in_use(folder, holder)) from None
        if _is_at(fd, path):
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def in_use(folder: Path, holder: str) -> str:
    """The line refusing ``folder`` held by PID ``holder`` (a runner, or its watchdog after it died)."""
    gone = holder.isdigit() and not Path(f"/proc/{holder}").exists()
    state = (" (it has ended: its watchdog is still stopping the processes it started; try again in a few"
             " seconds)" if gone else "")
    return (f"{folder} is in use by another run_simulation.py, PID {holder}{state}: one runner per"
            f" results folder (lock {folder / LOCK_NAME}); wait for it to finish, stop it (kill"
            f" {holder}), or use another --out")


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is the file now at ``path``."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def release_folder(folder: Path, fd: int, remove: bool) -> None:
    """Release the lock ``lock_folder`` returned; with ``remove`` (a clean exit, every
    watchdog dismissed) first delete ``<folder>/.lock``, while still holding it, so a finished
    folder holds only results. A runner that opened the file just before is not fooled: it
    checks, once it holds its lock, that its file is still the one at the path."""
    try:
        if remove and _is_at(fd, folder / LOCK_NAME):
            (folder / LOCK_NAME).unlink()
    finally:
        os.close(fd)


def stream_flwr_run(
    app_dir: Path, connection: str, run_config: dict, env: dict, home: Path, extra_args: list[str],
    on_line: Callable[[str], None] | None = None, timeout: float | None = None,
    tracked: list[Managed] | None = None, on_tick: Callable[[], None] | None = None,
) -> int:
    """``flwr run <app> <connection> --run-config <file> --stream [extra]``; returns its exit code.

    ``on_tick`` runs on every output line (launchers refresh their process trees there);
    past ``timeout`` seconds the run is stopped and 124 returned, also when it has gone
    silent (a server waiting for nodes prints nothing)."""
    config_file = Path(home) / f"run-config-{time.monotonic_ns()}.toml"
    config_file.write_text(tomli_w.dumps(run_config))
    command = [exe("flwr"), "run", str(app_dir), connection, "--run-config", str(config_file),
               "--stream", *extra_args]
    proc = subprocess.Popen(
        command, env=env, cwd=app_dir, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    managed = Managed("flwr-run", proc, config_file)
    if tracked is not None:
        tracked.append(managed)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        stop_processes([managed])  # closes its output, which ends the loop below

    timer = None
    if timeout is not None:
        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if on_tick is not None:
                on_tick()
            if on_line is not None:
                on_line(line.rstrip("\n"))
            if expired.is_set():
                break
        rc = proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
    if expired.is_set():
        stop_processes([managed])
        return 124
    return rc
