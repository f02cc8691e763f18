"""The mTLS edge in front of a Flower 1.41 SuperLink, and each device's forwarder: nginx configs.

Why an edge. Flower 1.41's SuperLink serves every API from one uvicorn HTTPS port
(``--host``/``--port``): the devices' Fleet API (``/v1/fleet/...``), run submission and node
registration (the Control API, ``/v1/control/...``), the ServerApp runtime
(``/v1/runtime/...``), ``/health``, ``/docs`` and ``/openapi.json``. ``--fleet-api-address`` and
``--control-api-address`` are deprecated and bind nothing, ``--serverappio-api-address`` is
rejected, and ``--ssl-ca-certfile`` does not make the server ask for a client certificate
(uvicorn gets only the certificate and key). So the SuperLink binds to 127.0.0.1 and this edge,
on the address the devices dial, is the only way in from their network:

* TLS with the SuperLink's certificate, and a client certificate is required
  (``ssl_verify_client on``) that the device CA issued (``ssl_client_certificate``) and that
  ``crl.pem`` does not list (``ssl_crl``). Without one, every request is answered
  ``400 No required SSL certificate was sent`` (revoked or foreign: ``400 The SSL certificate
  error``) before any routing: nothing reaches the SuperLink.
* With one, only ``POST`` to the Fleet API's own paths (read from Flower's Fleet router, so
  they match the installed SuperLink) is passed on, to exactly that path; every other path is
  ``403``. The SuperLink's certificate is verified on the loopback hop as well.
* The access log records each request's client certificate: ``$ssl_client_verify``
  (``SUCCESS``, ``NONE``, ``FAILED:<reason>``) and its subject.

Why a forwarder on each device. ``flower-supernode`` 1.41 talks to the Fleet API with httpx
and has no option for a client certificate (``--root-certificates`` only verifies the server;
httpx reads no client certificate from the environment). So each device runs a small nginx
that listens on the device's loopback, passes on only Fleet API paths, and speaks TLS to the
edge with the device's certificate and key, verifying the edge's certificate against
``ca.crt`` and the name it dials.

One device, one SuperNode. A certificate alone says nothing about how many SuperNodes use it:
without SuperNode authentication every ``flower-supernode`` registers a node of its own (with
a key it makes up), so one device could be many clients. So the SuperLink runs with
``--enable-supernode-auth``: the Fleet API then registers no node itself, a node is a public
key the operator registered (``flwr supernode register``, Control API, which the edge keeps
from the devices), and a key that is online is not activated a second time. Each device gets
one key (``make_certs.py --device NAME`` writes ``supernode-NAME.key`` beside its
certificate), so one device is one node: a second SuperNode behind the same certificate is
refused, without a key ("registration disabled") and with the device's own key alike ("could
not be activated"). Flower refuses a SuperNode key over plain HTTP, so the forwarder speaks TLS
on the device's loopback too, with a self-signed certificate for its own address
(``make_loopback_cert``) that the SuperNode is given as ``--root-certificates``.

Both configs run nginx in the foreground (``daemon off``) with every path (pid, logs, temp
files) inside their own folder, so ``LocalDeployment`` (``runner/deploy.py``) can start
and stop them like Flower's processes; ``python -m runner.edge`` writes the same files
for a real server and device (docs/deployment.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

# Flower's own limit for one message (flwr.supercore.grpc.GRPC_MAX_MESSAGE_LENGTH, 2 GiB):
# nginx's default (1 MiB) would refuse a FAB or a model's arrays.
MAX_BODY = "2048m"


class MissingNginx(RuntimeError):
    """nginx is not installed (Debian: ``apt-get install nginx-light``)."""


def nginx_binary() -> str:
    """The nginx executable (PATH, else /usr/sbin/nginx, which is not on a user's PATH on
    Debian); ``MissingNginx`` naming the install command when there is none."""
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise MissingNginx("nginx is not installed (neither on PATH nor /usr/sbin/nginx): "
                       "apt-get install nginx-light (Debian/Ubuntu) for the mTLS edge")


def nginx_command(folder: Path) -> list[str]:
    """The command that runs ``folder/nginx.conf`` in the foreground."""
    folder = Path(folder).resolve()
    return [nginx_binary(), "-p", str(folder), "-c", str(folder / "nginx.conf"),
            "-e", str(folder / "error.log")]


def fleet_paths() -> list[str]:
    """Every path of the installed SuperLink's Fleet API (``POST /v1/fleet/...``)."""
    from flwr.superlink.routers.fleet.router import router  # the SuperLink's own Fleet routes

    paths = sorted(route.path for route in router.routes)
    bad = [p for p in paths if not p.startswith("/v1/fleet/")]
    if bad or not paths:
        raise RuntimeError(f"unexpected Fleet API paths in this Flower version: {bad or 'none'}")
    return paths


def _quote(path: Path | str) -> str:
    text = str(Path(path).resolve()) if isinstance(path, Path) else str(path)
    if any(c in text for c in '"\\;{}\n'):
        raise ValueError(f"path {text!r} contains a character nginx configs cannot hold")
    return f'"{text}"'


def _host(address: str) -> str:
    """``host`` of ``host:port`` (``[v6]:port`` -> ``v6``)."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


def _frame(folder: Path, body: str) -> str:
    """The parts every config shares: foreground, one worker, all files inside ``folder``."""
    folder = Path(folder).resolve()
    temp = "\n".join(f"    {kind}_temp_path {_quote(folder / ('tmp-' + kind))};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""# written by runner/edge.py
daemon off;
worker_processes 1;
pid {_quote(folder / 'nginx.pid')};
error_log {_quote(folder / 'error.log')} info;
events {{ worker_connections 512; }}
http {{
    log_format edge '$remote_addr [$time_local] "$request" $status verify=$ssl_client_verify '
                    'subject="$ssl_client_s_dn"';
    access_log {_quote(folder / 'access.log')} edge;
{temp}
    server_tokens off;
    client_max_body_size {MAX_BODY};
    proxy_request_buffering off;
    proxy_buffering off;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
{body}
}}
"""


def edge_config(folder: Path, listen: str, superlink: str, server_cert: Path, server_key: Path,
                ca: Path, device_ca: Path, crl: Path) -> str:
    """The edge: mTLS on ``listen`` (``host:port`` the devices dial), Fleet API paths only,
    passed to the SuperLink at ``superlink`` (``127.0.0.1:port``), whose certificate is
    verified against ``ca`` for the name ``superlink``'s host."""
    locations = "\n".join(f"""        location = {path} {{
            limit_except POST {{ deny all; }}
            proxy_pass https://superlink{path};
        }}""" for path in fleet_paths())
    body = f"""    upstream superlink {{ server {superlink}; keepalive 8; }}
    server {{
        listen {listen} ssl;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_certificate {_quote(server_cert)};
        ssl_certificate_key {_quote(server_key)};
        ssl_verify_client on;
        ssl_client_certificate {_quote(device_ca)};
        ssl_crl {_quote(crl)};
        ssl_verify_depth 1;
        proxy_ssl_verify on;
        proxy_ssl_trusted_certificate {_quote(ca)};
        proxy_ssl_name {_host(superlink)};
        proxy_ssl_session_reuse on;
{locations}
        location / {{ return 403; }}
    }}"""
    return _frame(folder, body)


def forwarder_config(folder: Path, listen: str, edge: str, ca: Path, device_cert: Path,
                     device_key: Path, loopback_cert: Path, loopback_key: Path, edge_name: str | None = None) -> str:
    """A device's forwarder: TLS with ``loopback_cert`` on ``listen`` (the device's loopback) for
    its SuperNode, Fleet API paths only, to the edge at ``edge`` over TLS with the device's
    certificate; the edge's certificate is verified against ``ca`` for ``edge_name`` (default:
    ``edge``'s host)."""
    name = edge_name or _host(edge)
    body = f"""    upstream edge {{ server {edge}; keepalive 4; }}
    server {{
        listen {listen} ssl;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_certificate {_quote(loopback_cert)};
        ssl_certificate_key {_quote(loopback_key)};
        location /v1/fleet/ {{
            proxy_pass https://edge;
            proxy_ssl_certificate {_quote(device_cert)};
            proxy_ssl_certificate_key {_quote(device_key)};
            proxy_ssl_verify on;
            proxy_ssl_verify_depth 2;
            proxy_ssl_trusted_certificate {_quote(ca)};
            proxy_ssl_name {name};
            proxy_ssl_session_reuse on;
        }}
        location / {{ return 403; }}
    }}"""
    return _frame(folder, body)


def make_loopback_cert(folder: Path, host: str, days: int = 3650) -> tuple[Path, Path]:
    """``folder/loopback.pem`` and ``folder/loopback.key`` (mode 0600 from the start): a
    self-signed certificate for ``host`` (the forwarder's listening address) and localhost /
    127.0.0.1 / ::1, for TLS server authentication only. It is its own trust root: the SuperNode
    gets ``loopback.pem`` as ``--root-certificates``, and nothing else trusts it. Made on the
    device (no CA key leaves the server); made anew on each call."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names: list[x509.GeneralName] = []
    for name in dict.fromkeys([host, "localhost", "127.0.0.1", "::1"]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            names.append(x509.DNSName(name))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"fl-drift forwarder {host}")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "loopback.pem", folder / "loopback.key"
    tmp = folder / f".loopback.key.{os.getpid()}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    os.replace(tmp, key_path)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def write_config(folder: Path, text: str) -> Path:
    """``folder/nginx.conf`` (the folder is created, and so are nginx's temp folders)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nginx.conf"
    path.write_text(text)
    return path


def _write_role(args: argparse.Namespace) -> tuple[Path, str]:
    """Write the config that ``args`` asks for (its files checked first); returns its path and
    what to run beside nginx (the device's SuperNode command; nothing for the edge)."""
    certs, out = Path(args.certs), Path(args.out)
    if args.role == "edge":
        need = [certs / n for n in ("server.pem", "server.key", "ca.crt", "device-ca.crt", "crl.pem")]
    else:
        need = [certs / n for n in ("ca.crt", f"device-{args.name}.pem", f"device-{args.name}.key")]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: run scripts/make_certs.py (--device NAME) first")
    if args.role == "edge":
        return write_config(out, edge_config(out, args.listen, args.superlink, *need)), ""
    loopback = make_loopback_cert(out, _host(args.listen))
    path = write_config(out, forwarder_config(out, args.listen, args.edge, *need, *loopback))
    supernode = (f"flower-supernode --superlink {args.listen} --root-certificates {loopback[0]}"
                 f" --auth-supernode-private-key {certs / f'supernode-{args.name}.key'} --node-config ...")
    return path, supernode


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m runner.edge",
        description="Write the nginx config of the mTLS edge (server) or of a device's forwarder.")
    sub = parser.add_subparsers(dest="role", required=True)
    edge = sub.add_parser("edge", help="on the server, in front of the SuperLink")
    edge.add_argument("--listen", required=True, help="host:port the devices dial, e.g. 192.168.1.10:8443")
    edge.add_argument("--superlink", default="127.0.0.1:8000", help="the SuperLink's loopback host:port")
    device = sub.add_parser("device", help="on a device, between its SuperNode and the edge")
    device.add_argument("--edge", required=True, help="the edge's host:port, as the device dials it")
    device.add_argument("--name", required=True, help="the device (device-NAME.pem / device-NAME.key)")
    device.add_argument("--listen", default="127.0.0.1:9090", help="loopback host:port for the SuperNode")
    for p in (edge, device):
        p.add_argument("--certs", default="certs", help="folder written by scripts/make_certs.py")
        p.add_argument("--out", required=True, help="folder for nginx.conf, logs and pid file")
    args = parser.parse_args(argv)
    path, supernode = _write_role(args)
    try:
        command = nginx_command(Path(args.out))
    except MissingNginx:  # written here, run where nginx is installed
        folder = Path(args.out).resolve()
        command = ["nginx", "-p", str(folder), "-c", str(path.resolve()), "-e", str(folder / "error.log")]
    print(f"wrote {path}; run: {' '.join(command)}")
    if supernode:
        print(f"then: {supernode}")


if __name__ == "__main__":
    main()
