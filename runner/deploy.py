"""A real Flower deployment on this machine: one SuperLink, N SuperNodes, ``flwr run``.

``LocalDeployment`` starts ``flower-superlink`` (TLS when given certificates) and
``flower-supernode`` processes on loopback with free ports, in a private ``FLWR_HOME``, with
runtime dependency installation disabled, and submits runs with ``flwr run . <connection>``
exactly as on real devices. Every process it starts gets its own process group; ``close()``
stops those groups and then, by PID, every descendant it saw (Flower starts SuperExec in a
new session, so a group kill alone would miss it). Used by ``tests/deployment/test_deployment.py``,
``tests/deployment/test_deployment_mtls.py`` and ``scripts/deploy_timing.py``; docs/deployment.md gives
the same commands.

mTLS edge (``devices=DeviceCA.in_dir(certs)``): the SuperLink stays on 127.0.0.1 and an nginx
edge (``runner/edge.py``) on ``edge_host`` is the only thing the devices reach: it
requires a device certificate from ``make_certs.py --device`` that ``crl.pem`` does not list and
passes on only the Fleet API. A SuperNode started with ``device=Device.in_dir(certs, name)``
talks to it through its own forwarder (nginx on loopback, with that device's certificate, TLS
towards the SuperNode with a self-signed loopback certificate); one started without a device
dials the edge directly with ``ca.crt`` only, as an outsider would. With the edge the SuperLink
always authenticates SuperNodes (``--enable-supernode-auth``): a node is a key the operator
registered (``register_supernode``), one per device, so one device certificate is one node
(``runner/edge.py``). Runs are submitted on loopback (``self.address``), as the operator does on
the server.

Isolation: ``subprocess`` (Flower's default) lets each SuperLink/SuperNode start its own
``flower-superexec``; ``process`` starts SuperLink/SuperNode with ``--isolation process`` and a
separate, long-running ``flower-superexec`` next to each of them.
"""

from __future__ import annotations

import shlex
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from fl_app.common.procfs import alive, descendants
from runner import edge as nginx_edge
from runner.launch import APP_DIR
from runner.processes import (
    Managed,
    exe,
    free_port,
    private_env,
    stop_processes,
    stream_flwr_run,
)


@dataclass(frozen=True)
class TLS:
    """PEM paths from ``scripts/make_certs.py``: CA certificate, server certificate and key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, folder: Path) -> TLS:
        folder = Path(folder)
        return cls(folder / "ca.crt", folder / "server.pem", folder / "server.key")


@dataclass(frozen=True)
class DeviceCA:
    """What the edge checks device certificates against: the device CA and its CRL."""

    ca: Path
    crl: Path

    @classmethod
    def in_dir(cls, folder: Path) -> DeviceCA:
        folder = Path(folder)
        return cls(folder / "device-ca.crt", folder / "crl.pem")


@dataclass(frozen=True)
class Device:
    """One device's client certificate and key (``make_certs.py --device NAME``)."""

    name: str
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, folder: Path, name: str) -> Device:
        folder = Path(folder)
        return cls(name, folder / f"device-{name}.pem", folder / f"device-{name}.key")


def node_config_arg(node_config: dict) -> str:
    """``--node-config`` text: space-separated ``key=value``, strings quoted as TOML."""
    parts = []
    for key, value in node_config.items():
        if isinstance(value, str):
            value = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif isinstance(value, bool):
            value = "true" if value else "false"
        parts.append(f"{key}={value}")
    return " ".join(parts)


# -------------------------------------------------------------------------- deployment
class LocalDeployment:
    """``with LocalDeployment(tls=TLS.in_dir(certs)) as d: d.add_supernode({...}); d.run({...})``."""

    def __init__(
        self,
        tls: TLS | None = None,
        isolation: str = "subprocess",
        app_dir: Path = APP_DIR,
        home: Path | None = None,
        host: str = "127.0.0.1",
        extra_env: dict[str, str] | None = None,
        supernode_auth: bool = False,
        devices: DeviceCA | None = None,
        edge_host: str = "127.0.0.1",
    ):
        if isolation not in ("subprocess", "process"):
            raise ValueError(f"isolation must be 'subprocess' or 'process', not {isolation!r}")
        if supernode_auth and tls is None:
            raise ValueError("SuperNode authentication needs TLS")
        if devices is not None and tls is None:
            raise ValueError("the mTLS edge (devices=...) needs TLS certificates (tls=...)")
        self.devices = devices
        self.edge_host = edge_host
        self.edge_port: int | None = None
        self.edge: Managed | None = None
        self.tls = tls
        self.supernode_auth = supernode_auth or devices is not None  # the edge: one registered key, one node
        self.isolation = isolation
        self.app_dir = Path(app_dir)
        self.home = Path(home) if home else Path(tempfile.mkdtemp(prefix="fl-drift-deploy-"))
        self.home.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.port = free_port()
        self.address = f"{host}:{self.port}"
        self.env = private_env(self.home, **(extra_env or {}))
        self.processes: list[Managed] = []
        self.seen: dict[int, tuple[str, str]] = {}  # every process ever seen: pid -> (start, name)
        self.supernodes: list[Managed] = []
        self.connection = "fl-drift-deploy"
        self.survivors: list[int] = []

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> LocalDeployment:
        try:
            self.start_superlink()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _spawn(self, name: str, command: list[str], cwd: Path | None = None) -> Managed:
        log = self.home / f"{name}.log"
        with open(log, "ab") as out:
            out.write(("$ " + shlex.join(command) + "\n").encode())
            out.flush()
            proc = subprocess.Popen(
                command, env=self.env, cwd=cwd or self.home, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, stopped by close()
            )
        managed = Managed(name, proc, log)
        self.processes.append(managed)
        return managed

    def _tls_client_args(self) -> list[str]:
        return ["--root-certificates", str(self.tls.ca)] if self.tls else ["--insecure"]

    def _superexec(self, name: str, runtime_address: str, insecure: bool, parent: int) -> Managed:
        command = [exe("flower-superexec"), "--runtime-api-address", runtime_address,
                   "--parent-pid", str(parent)]
        command += ["--insecure"] if insecure else ["--root-certificates", str(self.tls.ca)]
        return self._spawn(name, command)

    def start_superlink(self, timeout: float = 60) -> None:
        command = [
            exe("flower-superlink"), "--host", self.host, "--port", str(self.port),
            "--isolation", self.isolation, "--database", str(self.home / "state.db"),
            "--disable-runtime-dependency-installation",
        ]
        if self.tls:
            command += ["--ssl-ca-certfile", str(self.tls.ca), "--ssl-certfile", str(self.tls.cert),
                        "--ssl-keyfile", str(self.tls.key)]
        else:
            command += ["--insecure"]
        if self.supernode_auth:
            command += ["--enable-supernode-auth"]
        link = self._spawn("superlink", command)
        self._wait_healthy(link, self.port, timeout)
        if self.isolation == "process":
            self._superexec("superexec-superlink", self.address, self.tls is None, link.proc.pid)
        self._write_connection()
        if self.devices is not None:
            self.start_edge(timeout)

    # ---------------------------------------------------------------- mTLS edge
    @property
    def edge_address(self) -> str:
        """``host:port`` the devices dial (the edge); only with ``devices``."""
        if self.edge_port is None:
            raise RuntimeError("no edge: start the deployment with devices=DeviceCA.in_dir(certs)")
        host = f"[{self.edge_host}]" if ":" in self.edge_host else self.edge_host
        return f"{host}:{self.edge_port}"

    def _nginx(self, name: str, config: str, host: str, port: int, timeout: float) -> Managed:
        """Write ``<home>/<name>/nginx.conf``, start nginx on it, wait until it listens."""
        folder = self.home / name
        nginx_edge.write_config(folder, config)
        managed = self._spawn(name, nginx_edge.nginx_command(folder))
        self._wait_listening(managed, host, port, timeout)
        return managed

    def start_edge(self, timeout: float = 60) -> None:
        """The mTLS edge on ``edge_host`` in front of the loopback SuperLink."""
        self.edge_port = free_port()
        config = nginx_edge.edge_config(
            self.home / "edge", self.edge_address, self.address, self.tls.cert, self.tls.key,
            self.tls.ca, self.devices.ca, self.devices.crl)
        self.edge = self._nginx("edge", config, self.edge_host, self.edge_port, timeout)

    def reload_edge(self, timeout: float = 30) -> None:
        """Make the edge re-read its files (a new ``crl.pem``): ``nginx -s reload``, then wait
        until the old worker has gone, so that every new connection sees the new files."""
        master = self.edge.proc.pid

        def workers() -> set[int]:
            return set(descendants([master])) - {master}

        before = workers()
        subprocess.run([*nginx_edge.nginx_command(self.home / "edge"), "-s", "reload"],
                       check=True, capture_output=True, timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = workers()
            if now and not (now & before):
                self.refresh()
                return
            time.sleep(0.1)
        raise RuntimeError(f"the edge did not reload in {timeout}s; see {self.home / 'edge' / 'error.log'}")

    def _wait_listening(self, managed: Managed, host: str, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if managed.proc.poll() is not None:
                raise RuntimeError(f"{managed.name} exited early; see {managed.log}")
            try:
                socket.create_connection((host, port), timeout=1).close()
                managed.refresh()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{managed.name} did not listen on {host}:{port} in {timeout}s; see {managed.log}")

    def start_forwarder(self, device: Device, timeout: float = 60) -> tuple[str, Path]:
        """A device's forwarder (nginx on loopback, with its certificate) to the edge; returns
        the ``host:port`` its SuperNode dials and the certificate that SuperNode is to trust."""
        port = free_port()
        name = f"forwarder-{device.name}-{len(self.processes)}"
        loopback = nginx_edge.make_loopback_cert(self.home / name, self.host)
        config = nginx_edge.forwarder_config(self.home / name, f"{self.host}:{port}", self.edge_address,
                                             self.tls.ca, device.cert, device.key, *loopback)
        self._nginx(name, config, self.host, port, timeout)
        return f"{self.host}:{port}", loopback[0]

    def _wait_healthy(self, managed: Managed, port: int, timeout: float, tls: bool = True) -> None:
        scheme = "https" if (self.tls and tls) else "http"
        context = ssl.create_default_context(cafile=str(self.tls.ca)) if scheme == "https" else None
        url = f"{scheme}://{self.host}:{port}/health"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if managed.proc.poll() is not None:
                raise RuntimeError(f"{managed.name} exited early; see {managed.log}")
            try:
                with urllib.request.urlopen(url, timeout=1, context=context):
                    managed.refresh()
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{managed.name} did not become healthy in {timeout}s; see {managed.log}")

    def _write_connection(self) -> None:
        entry: dict = {"address": self.address}
        if self.tls:
            entry["root-certificates"] = str(self.tls.ca)
        else:
            entry["insecure"] = True
        config = {"superlink": {"default": self.connection, self.connection: entry}}
        (self.home / "config.toml").write_text(tomli_w.dumps(config))

    def register_supernode(self, public_key: Path) -> str:
        """``flwr supernode register <public key> <connection>`` (SuperNode authentication)."""
        result = subprocess.run(
            [exe("flwr"), "supernode", "register", str(public_key), self.connection],
            env=self.env, cwd=self.home, capture_output=True, text=True, timeout=60,
        )
        if result.returncode != 0:
            raise RuntimeError(f"flwr supernode register failed: {result.stdout}{result.stderr}")
        return result.stdout

    def add_supernode(
        self, node_config: dict, timeout: float = 60, auth_key: Path | None = None, wait: bool = True,
        device: Device | None = None, extra_args: tuple[str, ...] = (),
    ) -> Managed:
        """Start one SuperNode with ``--node-config`` (partition-id/num-partitions or data-path).

        ``auth_key``: its private key (``make_certs.py --node-key`` or ``--device``) when the
        SuperLink authenticates SuperNodes (always with the edge). ``wait``: wait until its
        Runtime API answers. With the mTLS edge: ``device`` gives it a forwarder with that
        device's certificate; without one it dials the edge with ``ca.crt`` only (and is refused)."""
        index = len(self.supernodes)
        port = free_port()
        if self.devices is None:
            link = ["--superlink", self.address, *self._tls_client_args()]
        elif device is not None:
            forwarder, loopback_cert = self.start_forwarder(device, timeout)
            link = ["--superlink", forwarder, "--root-certificates", str(loopback_cert)]
        else:
            link = ["--superlink", self.edge_address, *self._tls_client_args()]
        command = [
            exe("flower-supernode"), *link,
            "--node-config", node_config_arg(node_config), "--isolation", self.isolation,
            "--host", self.host, "--port", str(port), *extra_args,
        ]
        if auth_key is not None:
            command += ["--auth-supernode-private-key", str(auth_key)]
        node = self._spawn(f"supernode-{index}", command)
        self.supernodes.append(node)
        if not wait:
            return node
        self._wait_healthy(node, port, timeout, tls=False)  # its Runtime API is plain HTTP
        if self.isolation == "process":
            self._superexec(f"superexec-supernode-{index}", f"{self.host}:{port}", True, node.proc.pid)
        return node

    # ---------------------------------------------------------------------- runs
    def run(
        self,
        run_config: dict,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> int:
        """``flwr run <app> <connection> --run-config <file> --stream``; returns its exit code.

        A relative ``results-dir`` is made absolute here: the ServerApp runs in the
        SuperLink's process tree, whose working directory is not the caller's."""
        run_config = dict(run_config)
        if "results-dir" in run_config:
            run_config["results-dir"] = str(Path(run_config["results-dir"]).expanduser().resolve())
        return stream_flwr_run(
            self.app_dir, self.connection, run_config, self.env, self.home, [],
            on_line=on_line, timeout=timeout, tracked=self.processes, on_tick=self.refresh,
        )

    def refresh(self) -> None:
        """Record the current descendants of every started process (for ``close()``)."""
        for m in self.processes:
            m.refresh()
            self.seen.update(m.seen)

    def logs(self) -> str:
        return "\n".join(f"===== {m.name}\n{m.log.read_text(errors='replace')}"
                         for m in self.processes if m.log.suffix == ".log" and m.log.exists())

    def close(self) -> list[int]:
        """Stop everything started here; returns PIDs that survived (should be empty)."""
        self.refresh()
        stop_processes(self.processes)
        self.survivors = alive(self.seen)
        self.processes = [m for m in self.processes if m.proc.poll() is None]
        return self.survivors
