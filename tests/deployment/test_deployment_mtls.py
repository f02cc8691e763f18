"""The mTLS edge on loopback: only devices with a valid certificate reach the SuperLink, and
they reach only its Fleet API.

One deployment for the module (``runner/deploy.py``): a TLS SuperLink bound to
127.0.0.1 and the nginx edge (``runner/edge.py``) on the devices' address, 127.0.0.2
where it can be bound (Linux routes all of 127/8 to loopback), so that "not on the devices'
address" is a real connection attempt. Certificates come from ``scripts/make_certs.py`` as a
user runs it. An outsider holds ``ca.crt`` (every device does) and no device certificate; each
refusal is asserted as the client sees it (status and nginx's reason, or the CLI's error) and
as the edge logged it (``verify=NONE`` / ``FAILED:<reason>``), and the operator's view on
loopback shows nothing got in. Skipped where nginx is not installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import tomli_w

from runner import edge as nginx_edge
from runner.deploy import TLS, Device, DeviceCA, LocalDeployment
from runner.launch import APP_DIR
from runner.processes import exe
from runner.results.report import read_metrics
from tests.kit import ROOT
from tests.kit_runs import leftovers

try:
    NGINX: str | None = nginx_edge.nginx_binary()
except nginx_edge.MissingNginx:
    NGINX = None
needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx-light):"
                                 " the mTLS edge cannot be started")

MAKE_CERTS = [sys.executable, str(ROOT / "scripts" / "make_certs.py")]
SMALL = {"dataset": "mnist", "model": "cnn-small", "batch-size": 32, "local-epochs": 1,
         "learning-rate": 0.05, "fraction-fit": 1.0, "checkpoint-every": 0}
NO_CERT = "No required SSL certificate was sent"  # nginx's 400 page when ssl_verify_client on
BAD_CERT = "The SSL certificate error"  # nginx's 400 page for a certificate that fails verification
# what the operator's side serves, which devices must not reach (Flower 1.41's one port)
NOT_FOR_DEVICES = [("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/health"),
                   ("POST", "/v1/runtime/acquire-task"), ("POST", "/v1/control/start-run"),
                   ("POST", "/v1/control/register-node"), ("POST", "/v1/control/list-runs")]


def _devices_host() -> str:
    """127.0.0.2 where it can be bound (Linux), else 127.0.0.1."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
        return "127.0.0.2"
    except OSError:
        return "127.0.0.1"


HOST = _devices_host()


def _make_certs(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*MAKE_CERTS, "--out", str(out), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """The server certificate for the devices' address, devices dev0, dev1 and late, and gone,
    revoked at once."""
    out = tmp_path_factory.mktemp("certs")
    made = _make_certs(out, "--host", HOST, "--device", "dev0", "--device", "dev1", "--device", "late",
                       "--device", "gone", "--revoke", "gone", "--node-key", "evil")
    assert made.returncode == 0, made.stderr
    return out


@pytest.fixture(scope="module")
def live(certs, tmp_path_factory):
    """The SuperLink on 127.0.0.1 and its edge on ``HOST`` (no data: nothing here trains);
    stopped at the end, by PID, with every process it started."""
    if NGINX is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light): the mTLS edge cannot be started")
    deployment = LocalDeployment(tls=TLS.in_dir(certs), devices=DeviceCA.in_dir(certs), edge_host=HOST,
                                 home=tmp_path_factory.mktemp("mtls") / "flwr-home")
    try:
        deployment.start_superlink()
        yield deployment
    finally:
        survivors = deployment.close()
        assert survivors == [], f"processes survived close(): {survivors}"
        assert leftovers(deployment.home) == [], "a process with this deployment's FLWR_HOME survived"


def _client(certs: Path, device: str | None = None) -> httpx.Client:
    """An HTTPS client that trusts ``ca.crt`` and, with ``device``, presents its certificate."""
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if device is not None:
        context.load_cert_chain(certs / f"device-{device}.pem", certs / f"device-{device}.key")
    return httpx.Client(verify=context, timeout=30)


def _request(live: LocalDeployment, certs: Path, method: str, path: str, device: str | None = None) -> httpx.Response:
    with _client(certs, device) as client:
        return client.request(method, f"https://{live.edge_address}{path}",
                              headers={"Content-Type": "application/protobuf"},
                              content=b"" if method == "POST" else None)


def _edge_log(live: LocalDeployment) -> list[str]:
    return (live.home / "edge" / "access.log").read_text().splitlines()


def _edge_logged(live: LocalDeployment, text: str, times: int = 1, timeout: float = 15) -> bool:
    """Whether ``times`` lines of the edge's access log contain ``text``, waiting up to
    ``timeout`` seconds: nginx writes a request's line after it has sent the response."""
    deadline = time.monotonic() + timeout
    while sum(text in line for line in _edge_log(live)) < times:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _superlink_saw(live: LocalDeployment, path: str, timeout: float = 0) -> bool:
    """Whether the SuperLink's own access log (uvicorn) has a request for ``path``, waiting up
    to ``timeout`` seconds for it."""
    deadline = time.monotonic() + timeout
    while f' {path} HTTP/1.1"' not in (live.home / "superlink.log").read_text():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _outsider_home(live: LocalDeployment, tmp_path: Path) -> dict[str, str]:
    """An outsider's FLWR_HOME: a connection to the edge with ``ca.crt`` only."""
    home = tmp_path / "outsider-home"
    home.mkdir()
    entry = {"address": live.edge_address, "root-certificates": str(live.tls.ca)}
    (home / "config.toml").write_text(tomli_w.dumps({"superlink": {"default": "edge", "edge": entry}}))
    return {**live.env, "FLWR_HOME": str(home)}


def _operator(live: LocalDeployment, *args: str) -> str:
    """``flwr <args> <loopback connection>`` as the operator on the server; its output."""
    done = subprocess.run([exe("flwr"), *args, live.connection, "--format", "json"], env=live.env,
                          cwd=live.home, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# ------------------------------------------------------------------ certificates and config
def test_make_certs_device_certificates_and_revocation(tmp_path):
    """Device certificates come from their own CA and serve only as TLS clients; --revoke is
    cumulative, and revoking an unknown name is one line naming the devices there are."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    assert _make_certs(tmp_path, "--host", "10.0.0.1", "--device", "a", "--device", "b").returncode == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "device-ca.crt").read_bytes())
    server_ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    certs = {n: x509.load_pem_x509_certificate((tmp_path / f"device-{n}.pem").read_bytes()) for n in "ab"}
    for name, cert in certs.items():
        cert.verify_directly_issued_by(ca)
        with pytest.raises(ValueError):
            cert.verify_directly_issued_by(server_ca)  # the CA every device holds cannot issue them
        assert cert.subject.rfc4514_string() == f"CN={name}"
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        assert (tmp_path / f"device-{name}.key").stat().st_mode & 0o077 == 0
        # ... and each device its own SuperNode key: the node the operator registers for it
        assert (tmp_path / f"supernode-{name}.key").stat().st_mode & 0o077 == 0
        assert (tmp_path / f"supernode-{name}.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    # the server certificate names an IP address as IP and DNS name (nginx checks DNS names only)
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "10.0.0.1" in names.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)][0] == "10.0.0.1"

    def revoked() -> set[int]:
        crl = x509.load_pem_x509_crl((tmp_path / "crl.pem").read_bytes())
        assert crl.is_signature_valid(ca.public_key())
        return {r.serial_number for r in crl}

    assert revoked() == set()
    server_before = (tmp_path / "server.pem").read_bytes()
    assert _make_certs(tmp_path, "--revoke", "a").returncode == 0
    assert _make_certs(tmp_path, "--revoke", "b").returncode == 0
    assert revoked() == {certs["a"].serial_number, certs["b"].serial_number}
    assert (tmp_path / "server.pem").read_bytes() == server_before  # no --host: server cert kept
    unknown = _make_certs(tmp_path, "--revoke", "nobody")
    assert unknown.returncode != 0 and unknown.stderr.count("\n") == 1
    assert "device-nobody.pem does not exist (devices in" in unknown.stderr and "a, b" in unknown.stderr


def test_edge_passes_only_the_fleet_api(tmp_path):
    """The edge's config: a client certificate is required (device CA, CRL), and the only
    paths passed on are the installed SuperLink's Fleet API paths, POST only, each to itself."""
    import re

    from flwr.superlink.routers.fleet.router import router

    c = tmp_path
    text = nginx_edge.edge_config(tmp_path / "edge", "10.0.0.1:8443", "127.0.0.1:8000", c / "server.pem",
                                  c / "server.key", c / "ca.crt", c / "device-ca.crt", c / "crl.pem")
    assert "ssl_verify_client on;" in text
    assert f'ssl_client_certificate "{c / "device-ca.crt"}";' in text and f'ssl_crl "{c / "crl.pem"}";' in text
    passed = re.findall(r"location = (\S+) \{\s*limit_except POST \{ deny all; \}\s*proxy_pass https://superlink(\S+);",
                        text)
    assert sorted(p for p, _ in passed) == sorted(r.path for r in router.routes)
    assert all(p == q and p.startswith("/v1/fleet/") for p, q in passed)
    assert text.count("proxy_pass") == len(passed)  # nothing else is passed on
    assert "location / { return 403; }" in text and "listen 10.0.0.1:8443 ssl;" in text


def test_forwarder_speaks_tls_to_its_supernode(tmp_path):
    """The device forwarder listens with TLS (Flower sends a SuperNode key over TLS only), with a
    self-signed certificate for its own address that a client given it as root certificate
    accepts, as the SuperNode does; its key is the owner's alone."""
    import threading

    from runner.processes import free_port

    cert, key = nginx_edge.make_loopback_cert(tmp_path / "fwd", "127.0.0.1")
    assert key.stat().st_mode & 0o077 == 0
    text = nginx_edge.forwarder_config(tmp_path / "fwd", "127.0.0.1:9090", "10.0.0.1:8443", tmp_path / "ca.crt",
                                       tmp_path / "device-a.pem", tmp_path / "device-a.key", cert, key)
    assert "listen 127.0.0.1:9090 ssl;" in text
    assert f'ssl_certificate "{cert}";' in text and f'ssl_certificate_key "{key}";' in text
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    port = free_port()
    with socket.create_server(("127.0.0.1", port)) as server:
        accept = threading.Thread(target=lambda: server_side.wrap_socket(server.accept()[0], server_side=True).close())
        accept.start()
        client_side = ssl.create_default_context(cafile=str(cert))  # what --root-certificates gives httpx
        with client_side.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1"):
            pass
        accept.join(timeout=10)


# ------------------------------------------------------------------ live deployment
@needs_nginx
def test_superlink_is_not_on_the_devices_address(live):
    """The SuperLink listens on loopback only; on the devices' address only the edge answers."""
    if HOST == "127.0.0.1":
        pytest.skip("127.0.0.2 cannot be bound here: the devices' address is the SuperLink's")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, live.port), timeout=5)
    socket.create_connection((HOST, live.edge_port), timeout=5).close()


@needs_nginx
@pytest.mark.parametrize(("method", "path"), [*NOT_FOR_DEVICES, ("POST", "/v1/fleet/register-node")])
def test_ca_crt_alone_is_refused_before_anything_is_served(live, certs, method, path):
    """With ``ca.crt`` and no device certificate, every path (Fleet API included) is answered
    400 "No required SSL certificate was sent" by the edge and never reaches the SuperLink."""
    response = _request(live, certs, method, path)
    assert response.status_code == 400 and NO_CERT in response.text, response.text
    assert _edge_logged(live, f'"{method} {path} HTTP/1.1" 400 verify=NONE')
    assert not _superlink_saw(live, path)


@needs_nginx
@pytest.mark.parametrize(("method", "path"), NOT_FOR_DEVICES)
def test_devices_reach_only_the_fleet_api(live, certs, method, path):
    """A valid device certificate opens the Fleet API and nothing else: the operator's paths
    (/docs, the Control and Runtime APIs) are 403 at the edge."""
    response = _request(live, certs, method, path, device="dev0")
    assert response.status_code == 403 and "403 Forbidden" in response.text, response.text
    assert _edge_logged(live, f'"{method} {path} HTTP/1.1" 403 verify=SUCCESS subject="CN=dev0"')
    assert not _superlink_saw(live, path)
    # ... while a Fleet API call is passed to the SuperLink, which answers it itself (an
    # unsigned request: Flower's own 401)
    fleet = _request(live, certs, "POST", "/v1/fleet/get-run", device="dev0")
    assert fleet.status_code == 401 and fleet.json() == {"detail": "Invalid SuperNode authentication"}, fleet.text
    assert _superlink_saw(live, "/v1/fleet/get-run", timeout=15)


@needs_nginx
def test_outsider_cannot_register_submit_or_join(live, tmp_path):
    """An outsider holding only ``ca.crt``, against the edge: ``flwr supernode register``,
    ``flwr run`` and a SuperNode are refused with the edge's 400; on loopback the operator
    sees no node and no run."""
    env = _outsider_home(live, tmp_path)
    evil = live.tls.ca.parent / "supernode-evil.pub"
    nodes = json.loads(_operator(live, "supernode", "list"))["nodes"]
    runs = json.loads(_operator(live, "ls"))["runs"]
    for command, path in (([exe("flwr"), "supernode", "register", str(evil), "edge"], "/v1/control/register-node"),
                          ([exe("flwr"), "run", str(APP_DIR), "edge"], "/v1/control/start-run")):
        done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
        output = " ".join((done.stdout + done.stderr).split())
        assert done.returncode != 0 and "Client error '400 Bad Request'" in output and path in output, output
    node = live.add_supernode({"partition-id": 0, "num-partitions": 2}, wait=False,
                              extra_args=("--max-retries", "1", "--max-wait-time", "20"))
    assert node.proc.wait(timeout=180) != 0
    log = node.log.read_text()
    assert "Client error '400 Bad Request' for url" in log and "/v1/fleet/register-node" in log, log[-2000:]
    for path in ("/v1/control/register-node", "/v1/control/start-run", "/v1/fleet/register-node"):
        assert _edge_logged(live, f'"POST {path} HTTP/1.1" 400 verify=NONE')
    assert json.loads(_operator(live, "supernode", "list"))["nodes"] == nodes  # no node more
    assert json.loads(_operator(live, "ls"))["runs"] == runs == []  # no run, ever, on this SuperLink


@needs_nginx
def test_revoked_certificate_is_refused(live, certs):
    """A certificate in crl.pem is refused by the edge ("certificate revoked"), and so is a
    SuperNode whose forwarder presents it."""
    response = _request(live, certs, "POST", "/v1/fleet/register-node", device="gone")
    assert response.status_code == 400 and BAD_CERT in response.text, response.text
    node = live.add_supernode({"partition-id": 1, "num-partitions": 2}, wait=False,
                              device=Device.in_dir(certs, "gone"),
                              extra_args=("--max-retries", "1", "--max-wait-time", "20"))
    assert node.proc.wait(timeout=180) != 0
    assert "Client error '400 Bad Request' for url" in node.log.read_text(), node.log.read_text()[-2000:]
    assert _edge_logged(live, 'verify=FAILED:certificate revoked subject="CN=gone"', times=2)  # client, SuperNode
    refused = [line for line in _edge_log(live) if 'verify=FAILED:certificate revoked subject="CN=gone"' in line]
    assert all('/v1/fleet/register-node HTTP/1.1" 400' in line for line in refused)


@needs_nginx
def test_revoking_a_device_shuts_it_out_after_a_reload(live, certs):
    """make_certs.py --revoke and an edge reload turn a device that got through into one
    that is refused."""
    before = _request(live, certs, "POST", "/v1/fleet/get-run", device="late")
    assert before.json() == {"detail": "Invalid SuperNode authentication"}, before.text  # the SuperLink's answer
    assert _make_certs(certs, "--revoke", "late").returncode == 0
    live.reload_edge()
    after = _request(live, certs, "POST", "/v1/fleet/get-run", device="late")
    assert after.status_code == 400 and BAD_CERT in after.text, after.text
    assert _edge_logged(live, '"POST /v1/fleet/get-run HTTP/1.1" 400 verify=FAILED:certificate revoked subject="CN=late"')


def _node_status(live: LocalDeployment) -> dict[int, str]:
    """node id -> status of the nodes the operator sees on loopback."""
    nodes = json.loads(_operator(live, "supernode", "list"))["nodes"]
    return {n["node-id"]: n["status"] for n in nodes}


def _wait_online(live: LocalDeployment, node_id: int, timeout: float = 120) -> dict[int, str]:
    """The operator's view once node ``node_id`` is online (or after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while (status := _node_status(live)).get(node_id) != "online" and time.monotonic() < deadline:
        time.sleep(1)
    return status


def _register(live: LocalDeployment, certs: Path, device: str) -> int:
    """The operator registers ``device``'s SuperNode key (``flwr supernode register``); its node id."""
    before = set(_node_status(live))
    live.register_supernode(certs / f"supernode-{device}.pub")
    (node_id,) = set(_node_status(live)) - before
    return node_id


@needs_nginx
def test_device_supernode_joins_through_its_forwarder(live, certs):
    """A SuperNode behind its device's forwarder, with the device's key that the operator
    registered, comes online (seen by the operator on loopback); the edge logged the device's
    certificate on its Fleet calls."""
    node_id = _register(live, certs, "dev1")
    live.add_supernode({"partition-id": 0, "num-partitions": 20}, device=Device.in_dir(certs, "dev1"),
                       auth_key=certs / "supernode-dev1.key")
    assert _wait_online(live, node_id)[node_id] == "online"
    assert _edge_logged(live, '"POST /v1/fleet/activate-node HTTP/1.1" 200 verify=SUCCESS subject="CN=dev1"')


@needs_nginx
def test_one_device_certificate_is_one_supernode(live, certs):
    """Behind one device's certificate, once its SuperNode is online, a second
    SuperNode is refused whatever key it brings: none (it would register a node of its own), one
    the operator never registered, or a copy of the device's own key (that node is online). The
    operator sees no node more, and the device's node stays online."""
    node_id = _register(live, certs, "dev0")
    dev0 = Device.in_dir(certs, "dev0")
    live.add_supernode({"partition-id": 1, "num-partitions": 20}, device=dev0, auth_key=certs / "supernode-dev0.key")
    before = _wait_online(live, node_id)
    assert before[node_id] == "online", before
    once = ("--max-retries", "0", "--max-wait-time", "20")
    second = {key: live.add_supernode({"partition-id": 2, "num-partitions": 20}, wait=False, device=dev0,
                                      auth_key=None if key == "none" else certs / f"supernode-{key}.key",
                                      extra_args=once)
              for key in ("none", "evil", "dev0")}
    for key, node in second.items():
        assert node.proc.wait(timeout=180) != 0, f"a second SuperNode with key {key} was not refused"
    logs = {key: " ".join(node.log.read_text().split()) for key, node in second.items()}
    assert "[code: 2001] SuperNode authentication is enabled" in logs["none"], logs["none"][-2000:]
    for key in ("evil", "dev0"):
        assert "[code: 2004] Failed to activate SuperNode" in logs[key], logs[key][-2000:]
    superlink = (live.home / "superlink.log").read_text()  # why, as the SuperLink logged it
    assert "exception: No SuperNode found with the given public key" in superlink
    assert f"exception: SuperNode with node ID {node_id} could not be activated" in superlink
    assert _node_status(live) == before  # no node more, and dev0's still online


@needs_nginx
@pytest.mark.slow  # about 100 s on the shared 2-core machine
def test_devices_with_certificates_train_a_round(certs, small_mnist, tmp_path):
    """Two SuperNodes, each behind its device's forwarder, train one FedAvg round of cnn-small
    on MNIST partitions through the edge (a deployment of its own); the edge logged both
    devices' certificates, and no process survives."""
    deployment = LocalDeployment(tls=TLS.in_dir(certs), devices=DeviceCA.in_dir(certs), edge_host=HOST,
                                 home=tmp_path / "flwr-home", extra_env={"FL_DATA_DIR": str(small_mnist)})
    lines: list[str] = []
    try:
        deployment.start_superlink()
        for index, name in enumerate(("dev0", "dev1")):
            deployment.register_supernode(certs / f"supernode-{name}.pub")
            deployment.add_supernode({"partition-id": index, "num-partitions": 20},
                                     device=Device.in_dir(certs, name), auth_key=certs / f"supernode-{name}.key")
        rc = deployment.run({**SMALL, "strategy": "fedavg", "num-server-rounds": 1, "min-available-clients": 2,
                             "min-fit-clients": 2, "run-name": "mtls", "results-dir": str(tmp_path / "results")},
                            on_line=lines.append, timeout=420)
    finally:
        survivors = deployment.close()
    assert survivors == [] and leftovers(deployment.home) == []
    assert rc == 0, "\n".join(lines)[-3000:] + deployment.logs()[-3000:]
    rows = read_metrics(tmp_path / "results" / "mtls")
    assert [r["round"] for r in rows] == [1]
    assert rows[0]["num_clients"] == 2 and rows[0]["num_failures"] == 0
    edge_log = "\n".join(_edge_log(deployment))
    for name in ("dev0", "dev1"):
        assert f'"POST /v1/fleet/push-messages HTTP/1.1" 200 verify=SUCCESS subject="CN={name}"' in edge_log
