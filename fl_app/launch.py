"""A private local SuperLink for simulations, started and stopped by this process.

``flwr run . local`` auto-starts a detached SuperLink on fixed ports that outlives the run.
``LocalSimulation`` instead starts the same simulation-mode SuperLink itself, in its own
``FLWR_HOME`` on free loopback ports (Flower reads ``FLWR_LOCAL_*_PORT``), with runtime
dependency installation disabled, and stops its whole process group by PID in ``close()``.
Used by ``run_simulation.py`` and by the end-to-end tests.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable

import tomli_w

APP_DIR = Path(__file__).resolve().parent.parent


def _process_tools():
    """Process-tree tracking shared with the deployment launcher (imported late: it imports us)."""
    from fl_app.deploy import Managed, stop_processes

    return Managed, stop_processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalSimulation:
    """Context manager: ``with LocalSimulation() as sim: sim.run({...}, num_supernodes=10)``."""

    def __init__(self, app_dir: Path = APP_DIR, home: Path | None = None):
        self.app_dir = Path(app_dir)
        self.home = Path(home) if home else Path(tempfile.mkdtemp(prefix="fl-drift-flwr-"))
        self.http_port, self.control_port = free_port(), free_port()
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(self.control_port),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "PYTHONUNBUFFERED": "1",
        }
        if self.env.get("FL_DATA_DIR"):
            self.env["FL_DATA_DIR"] = str(Path(self.env["FL_DATA_DIR"]).resolve())
        self.process: subprocess.Popen | None = None
        self.log_file = self.home / "superlink.log"

    def __enter__(self) -> "LocalSimulation":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, timeout: float = 60) -> None:
        bin_dir = Path(sys.executable).parent
        superlink = bin_dir / "flower-superlink"
        command = [
            str(superlink) if superlink.exists() else "flower-superlink",
            "--insecure", "--simulation", "--isolation", "subprocess",
            "--control-api-address", f"127.0.0.1:{self.control_port}",
            "--host", "127.0.0.1", "--port", str(self.http_port),
            "--database", str(self.home / "state.db"),
        ]
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                command, env=self.env, cwd=self.app_dir, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        Managed, _ = _process_tools()
        self.managed = Managed("superlink", self.process, self.log_file)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"flower-superlink exited early; see {self.log_file}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        self.close()
        raise RuntimeError(f"flower-superlink did not become healthy in {timeout}s; see {self.log_file}")

    def run(
        self,
        run_config: dict,
        num_supernodes: int,
        cpus_per_client: float = 1,
        gpus_per_client: float = 0.0,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> int:
        """Submit one run with ``flwr run --stream`` and wait for it; returns its exit code."""
        config_file = self.home / f"run-config-{time.monotonic_ns()}.toml"
        config_file.write_text(tomli_w.dumps(run_config))
        federation = (
            f"num-supernodes={num_supernodes} client-resources-num-cpus={_toml_number(cpus_per_client)}"
            f" client-resources-num-gpus={float(gpus_per_client)}"
        )
        flwr = Path(sys.executable).parent / "flwr"
        command = [
            str(flwr) if flwr.exists() else "flwr", "run", str(self.app_dir), "local",
            "--run-config", str(config_file), "--federation-config", federation, "--stream",
        ]
        proc = subprocess.Popen(
            command, env=self.env, cwd=self.app_dir, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        assert proc.stdout is not None
        for line in proc.stdout:
            if on_line is not None:
                on_line(line.rstrip("\n"))
            self.managed.refresh()  # remember the SuperExec/simulation/Ray tree while it is intact
            if deadline is not None and time.monotonic() > deadline:
                Managed, stop_processes = _process_tools()
                stop_processes([Managed("flwr run", proc, self.log_file)])
                return 124
        return proc.wait()

    def close(self) -> list[int]:
        """Stop the SuperLink and every process it started (SuperExec, simulation, Ray: they
        run in sessions of their own, so the whole tree is tracked, not just one group).
        Returns the PIDs that survived (empty on success)."""
        if self.process is None:
            return []
        _, stop_processes = _process_tools()
        left = stop_processes([self.managed])
        self.process = None
        return left


def _toml_number(value: float) -> str:
    """Flower wants an int where the value is integral (``1``, not ``1.0``)."""
    return str(int(value)) if float(value).is_integer() else str(value)
