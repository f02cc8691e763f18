"""A private local SuperLink for simulations, started and stopped by this process.

``flwr run . local`` auto-starts a detached SuperLink on fixed ports that outlives the run.
``LocalSimulation`` instead starts the same simulation-mode SuperLink itself, in its own
``FLWR_HOME`` on free loopback ports (Flower reads ``FLWR_LOCAL_*_PORT``), with runtime
dependency installation disabled, and in ``close()`` stops it and every process it started
(SuperExec, the simulation, Ray) by PID. Used by ``run_simulation.py`` and the tests.

A home it made itself (a temporary folder: the SuperLink's database, logs and the installed
app, about 3.5 MB a run) is deleted in ``close()``, unless the SuperLink failed to start or
``flwr run`` exited with an error: then its logs stay for the message that points at them.
(A run whose ServerApp fails still ends ``flwr run`` with 0; its traceback is in the run's
own output, which ``run()`` streams to the caller.) A ``home`` passed in is always kept.

Ray writes its session folders (logs, sockets: hundreds of MB over many runs) under a private
temporary folder (``RAY_TMPDIR``, Ray's own setting for its temp root; Flower 1.41's
federation config offers no ``temp_dir``), not the shared ``/tmp/ray``, and ``close()``
deletes it. That Ray listens on 127.0.0.1 only (``LOOPBACK_RAY``), as the SuperLink does: a
simulation on one machine is reachable from that machine only. Nothing outlives the object's
owner either: ``start()`` first starts a watchdog (``runner/watchdog.py``), which makes both
temporary folders (nothing is made before it runs: an object never started leaves none) and,
if this process dies without ``close()`` (``kill -9``), stops every process with this
``FLWR_HOME`` or ``RAY_TMPDIR`` or in a session one of them leads (Ray's renamed agents), and
deletes the folders.

Ray's dashboard: Flower passes ``include_dashboard=False`` to ``ray.init()`` already (its
Ray backend's default; the federation config's ``init-args-*`` reach only num-cpus, num-gpus,
logging-level and log-to-driver), and Ray 2.55 still starts its API server
(``ray/dashboard/dashboard.py`` with the non-dashboard modules, on 127.0.0.1) and a
``ray::DashboardAgent`` per node: no public setting of Flower or Ray turns them off, so
they are stopped like every other Ray process (tests/runner/test_runner_lifecycle.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from fl_app.api import Execution, cohort_node_count
from fl_app.api import execution_for as launch_decision
from runner.processes import (
    Managed,
    exe,
    free_port,
    marked_sessions,
    private_env,
    stop_marked,
    stop_processes,
    stream_flwr_run,
)

APP_DIR = Path(__file__).resolve().parents[1]
PORT_TRIES = 3  # SuperLink starts on fresh ports when one was taken after free_port() picked it
# A private Ray reachable from this machine only. Ray 2.55 takes the node's address from
# ray.util.get_node_ip_address(): the machine's external address, and then its GCS, raylet, agents,
# driver and workers listen on every interface; with Ray's switch for multi-node clusters off
# (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, on by default on Linux) the node is 127.0.0.1 and every
# one of them listens on 127.0.0.1 only. Flower 1.41 passes no `_node_ip_address` to ray.init()
# (its federation config has only init-args num-cpus, num-gpus, logging-level, log-to-driver; Ray
# would also turn 127.0.0.1 back into the external address) and keeps Ray's dashboard off
# (include_dashboard=False). Not set for a Ray cluster (--ray-address): that is the user's network.
LOOPBACK_RAY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class LocalSimulation:
    """Context manager: ``with LocalSimulation() as sim: sim.run({...}, num_supernodes=10)``."""

    def __init__(self, app_dir: Path = APP_DIR, home: Path | None = None, ray_address: str | None = None,
                 hold: tuple[int, ...] = ()):
        """``ray_address`` (``host:port`` of a running Ray cluster's head) attaches the
        simulation to that cluster: the SuperLink's environment, which its SuperExec and the
        simulation process inherit, gets ``RAY_ADDRESS``, and Flower's ``ray.init()`` then
        connects instead of starting a private Ray (whose temp folder is then the cluster's,
        left alone). ``close()`` stops only what this object started (the cluster's own
        processes are not in its process tree and lack its FLWR_HOME). ``hold``: descriptors
        the watchdog keeps open until it is done (the runner's folder lock)."""
        self.app_dir = Path(app_dir)
        # a home of its own is made by start()'s watchdog (which removes it if this process dies)
        self.home: Path | None = Path(home) if home else None
        self.keep_home = home is not None
        self.ray_address = ray_address
        self.ray_dir: Path | None = None  # made by start(), unless the cluster at ray_address is used
        self.hold = tuple(hold)
        # Ray's own resources for this simulation's runs (Flower's ``init-args-num-cpus`` /
        # ``-num-gpus``); empty: Ray counts the machine. Set by --parallel (runner/parallel.py).
        self.ray_resources: dict[str, int] = {}
        self.env = private_env(self.home, **({"RAY_ADDRESS": ray_address} if ray_address else {}))
        self.choose_ports()
        self.process: subprocess.Popen | None = None
        self.managed: Managed | None = None
        self.watchdog: subprocess.Popen | None = None

    @property
    def log_file(self) -> Path:
        assert self.home is not None, "start() first"
        return self.home / "superlink.log"

    def __enter__(self) -> LocalSimulation:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def choose_ports(self) -> None:
        """Free ports for the SuperLink's HTTP and control APIs, in its environment too."""
        self.http_port, self.control_port = free_port(), free_port()
        self.env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(self.http_port)
        self.env["FLWR_LOCAL_CONTROL_API_PORT"] = str(self.control_port)

    def start(self, timeout: float = 60) -> None:
        """Start the watchdog and the SuperLink, and wait until it answers its health check.

        A port is free when ``free_port`` picks it but another process (another run's Ray,
        under ``--parallel``) can bind it before the SuperLink does; the SuperLink then exits
        at once with "address already in use", and this tries fresh ports, ``PORT_TRIES``
        times in all, before it gives up naming the log."""
        exe("flower-superexec")  # started by the SuperLink: refuse now, naming it, if it is missing
        if self.home is not None:
            self.home.mkdir(parents=True, exist_ok=True)
        self.start_watchdog()  # makes the temporary home and Ray's folder: removed if this process dies
        assert self.home is not None
        self.env["FLWR_HOME"] = str(self.home)
        if self.ray_dir is not None:
            self.env.update(RAY_TMPDIR=str(self.ray_dir), **LOOPBACK_RAY)
        for attempt in range(1, PORT_TRIES + 1):
            if attempt > 1:
                self.choose_ports()
            if self.start_superlink(timeout, last_try=attempt == PORT_TRIES):
                return

    def start_superlink(self, timeout: float, last_try: bool) -> bool:
        """Start the SuperLink on this object's ports and wait for its health check: True when
        it answers; False when it exited because a port was taken (unless ``last_try``), its
        process reaped, so that the caller tries other ports; else stop everything and raise."""
        command = [
            exe("flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
            "--control-api-address", f"127.0.0.1:{self.control_port}",
            "--host", "127.0.0.1", "--port", str(self.http_port),
            "--database", str(self.home / "state.db"),
        ]
        log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                command, env=self.env, cwd=self.app_dir, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.managed = Managed("superlink", self.process, self.log_file)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                with open(self.log_file, "rb") as log:
                    log.seek(log_start)
                    port_taken = b"address already in use" in log.read().lower()
                if port_taken and not last_try:
                    stop_processes([self.managed])
                    self.process = self.managed = None
                    return False
                self.keep_home = True
                self.close()
                raise RuntimeError(f"flower-superlink exited early; see {self.log_file}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/health", timeout=1):
                    return True
            except OSError:
                time.sleep(0.3)
        self.keep_home = True
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
        cohort_nodes: int | None = None,
    ) -> int:
        """Submit one run with ``flwr run --stream`` and wait for it; returns its exit code.

        ``num_supernodes`` is the run's clients N. A cohort run (``num-virtual-clients`` > 0 in
        ``run_config``, ``fl_app/common/execution_path.py``) starts M cohort nodes instead, each with its
        share of the cores and GPUs (``cohort_resources``; ``cohort_nodes`` sets M)."""
        if int(run_config.get("num-virtual-clients", 0) or 0):
            # a client the cohort trains alone runs at the per-client path's threads (client-threads)
            run_config = {**run_config, "client-threads": max(1, int(cpus_per_client))}
            num_supernodes, cpus_per_client, gpus_per_client = self.cohort_resources(num_supernodes, cohort_nodes)
        federation = (
            f"num-supernodes={num_supernodes} client-resources-num-cpus={_toml_number(cpus_per_client)}"
            f" client-resources-num-gpus={float(gpus_per_client)}"
        ) + "".join(f" init-args-{key}={int(value)}" for key, value in self.ray_resources.items())
        assert self.managed is not None, "start() first"
        rc = stream_flwr_run(
            self.app_dir, "local", run_config, self.env, self.home, ["--federation-config", federation],
            on_line=on_line, timeout=timeout,
            on_tick=self.managed.refresh,  # remember the SuperExec/simulation/Ray tree while intact
        )
        self.keep_home |= rc != 0
        return rc

    def cohort_resources(self, clients: int, nodes: int | None = None) -> tuple[int, float, float]:
        """(M cohort nodes, CPUs and GPUs per node) for a cohort run of ``clients`` virtual
        clients: M = ``nodes``, else one per GPU this simulation may use (its
        ``CUDA_VISIBLE_DEVICES``, else what torch sees), 1 on a CPU; the simulation's cores and
        GPUs are shared among the M nodes (a cohort node trains many clients in one process)."""
        limits = self.ray_resources
        cpus = limits.get("num-cpus") or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                          else os.cpu_count() or 1)
        gpus = limits.get("num-gpus")
        if gpus is None:
            gpus = visible_gpus(self.env.get("CUDA_VISIBLE_DEVICES"))
        m = nodes or cohort_node_count(gpus, clients)
        return m, max(1, int(cpus // m)), (gpus / m if gpus else 0.0)

    def start_watchdog(self) -> None:
        """Start the watchdog (``runner/watchdog.py``) of this object's processes, in a
        session of its own; its stdin is a pipe only this process writes to. It makes the
        temporary folders (this object's home unless one was passed in, and Ray's private temp
        folder unless the cluster at ``ray_address`` is used), so that it removes them however
        this process ends, and stops every process that carries ``FLWR_HOME`` or
        ``RAY_TMPDIR``, or runs in a session that one of those leads."""
        make = [] if self.home is not None else ["FLWR_HOME=fl-drift-flwr-"]
        # short: Ray's socket paths (<dir>/ray/session_<date>_<pid>/sockets/plasma_store) must fit 107 bytes
        make += [] if self.ray_address else ["RAY_TMPDIR=fl-ray-"]
        marker = [] if self.home is None else [f"--marker=FLWR_HOME={self.home}"]
        self.watchdog = subprocess.Popen(
            [sys.executable, "-m", "runner.watchdog", *marker, *(f"--make={m}" for m in make)],
            cwd=APP_DIR,  # the checkout: the folder holding runner/ and fl_app/
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True, pass_fds=self.hold,
        )
        assert self.watchdog.stdout is not None
        made = dict(self.watchdog.stdout.readline().decode().rstrip("\n").partition("=")[::2] for _ in make)
        self.watchdog.stdout.close()
        if set(made) != {m.split("=")[0] for m in make} or not all(made.values()):
            self.watchdog.kill()
            self.watchdog.wait()
            self.watchdog = None
            raise RuntimeError(f"the watchdog (python -m runner.watchdog) did not start: {made}")
        if "FLWR_HOME" in made:
            self.home = Path(made["FLWR_HOME"])
        if "RAY_TMPDIR" in made:
            self.ray_dir = Path(made["RAY_TMPDIR"])

    def markers(self) -> list[tuple[str, str]]:
        """The environment entries every process of this object carries (its FLWR_HOME, its Ray's RAY_TMPDIR)."""
        found = [("FLWR_HOME", str(self.home))] if self.home is not None else []
        return found + ([("RAY_TMPDIR", str(self.ray_dir))] if self.ray_dir is not None else [])

    def close(self) -> list[int]:
        """Stop the SuperLink and every process it started (by process tree, then by its
        FLWR_HOME and RAY_TMPDIR and the sessions of the processes that carry them: Ray's
        renamed agents may show neither), delete Ray's temp folder, and dismiss the watchdog;
        returns the PIDs that survived."""
        left: list[int] = []
        if self.managed is not None:
            markers = self.markers()
            owned = marked_sessions(markers)  # while their leaders (SuperExec, SuperLink) still run
            stop_processes([self.managed])  # the tree: groups, then each PID seen (SIGTERM first)
            left = stop_marked(markers, owned=owned)  # the tree's survivors, Ray's orphans too
            self.process = self.managed = None
        if not left and self.ray_dir is not None:
            shutil.rmtree(self.ray_dir, ignore_errors=True)
        if not self.keep_home and not left and self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)
        self.dismiss_watchdog(left)
        return left

    def dismiss_watchdog(self, left: list[int]) -> None:
        """Tell the watchdog that everything is stopped and wait for it to exit; when
        processes survived, close its pipe without a word instead: it goes on stopping them."""
        if self.watchdog is None:
            return
        watchdog, self.watchdog = self.watchdog, None
        if left:
            watchdog.stdin.close()
            return
        try:
            watchdog.communicate(b"done", timeout=10)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            watchdog.kill()
            watchdog.wait()


def visible_gpus(cuda_visible_devices: str | None) -> int:
    """CUDA GPUs a simulation may use: those named in ``CUDA_VISIBLE_DEVICES`` when set, else
    every GPU torch sees (0 without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return 0
    if cuda_visible_devices is not None:
        return len([d for d in cuda_visible_devices.split(",") if d.strip()])
    return torch.cuda.device_count()


def execution_for(raw: dict, clients: int, cluster: bool = False) -> tuple[dict, Execution]:
    """The runner's choice of path for the run config ``raw`` of ``clients`` partitions on the GPUs
    this process may use (``fl_app.api.execution_for``: ``auto`` takes the cohort path on CUDA for
    a method and settings that support it), and ``raw`` as it is launched: with
    ``num-virtual-clients`` = ``clients`` on the cohort path (the server and ClientApp then
    take it, ``LocalSimulation.run`` starts cohort nodes). A refused cohort raises ConfigError."""
    return launch_decision(raw, clients, visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES")), cluster)


def _toml_number(value: float) -> str:
    """Flower wants an int where the value is integral (``1``, not ``1.0``)."""
    return str(int(value)) if float(value).is_integer() else str(value)
