"""Create a private CA and a SuperLink TLS certificate signed by it.

    python scripts/make_certs.py --out certs --host 192.168.1.10 [--host superlink.lan ...]

writes ``ca.crt`` / ``ca.key`` (the CA; keep ``ca.key`` private) and ``server.pem`` /
``server.key`` (the SuperLink's certificate and key). Start the SuperLink with
``--ssl-ca-certfile certs/ca.crt --ssl-certfile certs/server.pem --ssl-keyfile certs/server.key``
and give every SuperNode and ``flwr`` connection ``ca.crt`` as root certificate.

``--node-key NAME`` (repeatable) also writes a SuperNode authentication key pair,
``supernode-NAME.key`` (OpenSSH private key, for ``flower-supernode
--auth-supernode-private-key``) and ``supernode-NAME.pub`` (for ``flwr supernode register``),
used when the SuperLink runs with ``--enable-supernode-auth``.

The certificate names every ``--host`` (an IP address or a DNS name, as the SuperNodes will
dial it) and, unless ``--no-loopback``, also localhost / 127.0.0.1 / ::1: in Flower 1.41 the
SuperLink's own SuperExec and ServerApp processes reach its Runtime API over loopback with the
same certificate. An IP address is written both as an IP name (what Python's ``ssl``, used by
Flower, checks) and as a DNS name (what nginx's ``proxy_ssl_verify`` checks: nginx 1.22 matches
only DNS names, and only the subject's CN when there is none). An existing CA in ``--out`` is
reused, so adding a host keeps old nodes valid. The server certificate is (re)issued when
``--host`` is given or none exists yet; ``--device``/``--revoke``/``--node-key`` alone leave it.

Device certificates (mutual TLS at the edge in front of the SuperLink, ``runner/edge.py``):
``--device NAME`` (repeatable) writes ``device-NAME.pem`` / ``device-NAME.key`` (a client
certificate, CN = NAME, usable only for TLS client authentication) and the device's SuperNode
key pair ``supernode-NAME.key`` / ``.pub`` (as ``--node-key NAME``: the certificate lets the
device reach the edge, the key, once the operator registers its ``.pub``, makes it one node;
``runner/edge.py`` says why both), the certificate issued by a separate device CA, ``device-ca.crt`` / ``device-ca.key``, created on first use: the edge trusts device
certificates and nothing else, and the SuperLink's CA (which every device holds) cannot issue
them. ``--revoke NAME`` (repeatable) adds ``device-NAME.pem`` to ``crl.pem``, the device CA's
certificate revocation list, which keeps every earlier entry and is re-signed, valid for
``--days``, on every call that touches devices, and by ``--renew-crl`` (give the edge the new
``crl.pem`` and reload it; an expired CRL makes the edge refuse every device).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK = ("localhost", "127.0.0.1", "::1")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def write_private(path: Path, data: bytes) -> None:
    """Write a private key so that it is never readable by others, not even for a moment: a new
    file created with mode 0600 (``os.open``; an existing file's mode would be kept), then
    renamed over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _write_key(key, path: Path) -> None:
    write_private(path, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _sans(host: str) -> list[x509.GeneralName]:
    """An IP address as an IP name and as a DNS name (for nginx, see the module docstring);
    any other host as a DNS name."""
    try:
        return [x509.IPAddress(ipaddress.ip_address(host)), x509.DNSName(host)]
    except ValueError:
        return [x509.DNSName(host)]


def load_or_make_ca(out: Path, days: int, stem: str = "ca", common_name: str = "fl-drift private CA"
                    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """``<stem>.crt`` / ``<stem>.key`` in ``out``: loaded when both exist, else created."""
    crt, key_path = out / f"{stem}.crt", out / f"{stem}.key"
    if crt.is_file() and key_path.is_file():
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        return cert, key  # type: ignore[return-value]
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                          key_agreement=False, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key, key_path)
    _write_cert(cert, crt)
    return cert, key


def make_server_cert(out: Path, hosts: list[str], days: int = 365, loopback: bool = True) -> dict[str, Path]:
    """Write the CA (if absent) and a server certificate for ``hosts``; return the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = load_or_make_ca(out, days)
    names = list(dict.fromkeys([*hosts, *(LOOPBACK if loopback else ())]))
    if not names:
        raise SystemExit("give at least one --host (or drop --no-loopback)")
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([n for h in names for n in _sans(h)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": out / "ca.crt", "cert": out / "server.pem", "key": out / "server.key"}
    _write_key(key, paths["key"])
    _write_cert(cert, paths["cert"])
    return paths


def make_node_key(out: Path, name: str) -> dict[str, Path]:
    """A SuperNode authentication key pair (ECDSA P-384, OpenSSH formats)."""
    name = _device_name(name, "SuperNode key")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    paths = {"private": out / f"supernode-{name}.key", "public": out / f"supernode-{name}.pub"}
    write_private(paths["private"], key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ))
    paths["public"].write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ) + b"\n")
    return paths


DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
MAX_NAME = 64  # X.509's upper bound on a common name (RFC 5280, ub-common-name), which a device's name is


def _device_name(name: str, what: str = "device") -> str:
    """``name`` when it is a valid name of a device or SuperNode key: letters, digits, '.', '_'
    and '-', not starting with '.', '_' or '-' (it is part of a file name, so no '/' or '..'), and at
    most ``MAX_NAME`` characters (a device's name is its certificate's CN); else the one-line
    refusal (``SystemExit``)."""
    if not DEVICE_NAME.fullmatch(name):
        raise SystemExit(f"{what} name {name!r} is not valid: use letters, digits, '.', '_' and '-', starting with a"
                         " letter or digit (it becomes the file name device-NAME.pem and the certificate's CN)")
    if len(name) > MAX_NAME:
        raise SystemExit(f"{what} name {name[:20]!r}... is not valid: it has {len(name)} characters, at most"
                         f" {MAX_NAME} (a certificate's CN is at most {MAX_NAME})")
    return name


def load_or_make_device_ca(out: Path, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The device CA (``device-ca.crt`` / ``device-ca.key``): issues device certificates only."""
    return load_or_make_ca(out, days, stem="device-ca", common_name="fl-drift device CA")


def write_crl(out: Path, days: int, revoke: x509.Certificate | None = None) -> Path:
    """(Re)write ``crl.pem``, signed by the device CA: every serial it already lists, plus
    ``revoke``'s; valid from now for ``days`` days."""
    ca_cert, ca_key = load_or_make_device_ca(out, days)
    path = out / "crl.pem"
    revoked: dict[int, dt.datetime] = {}
    if path.is_file():
        old = x509.load_pem_x509_crl(path.read_bytes())
        if not old.is_signature_valid(ca_key.public_key()):
            raise SystemExit(f"{path} is not signed by {out / 'device-ca.crt'}: move it away and revoke again")
        revoked = {r.serial_number: r.revocation_date_utc for r in old}
    now = dt.datetime.now(dt.UTC)
    if revoke is not None:
        revoked.setdefault(revoke.serial_number, now)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - dt.timedelta(minutes=5))
        .next_update(now + dt.timedelta(days=days))
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    for serial, when in sorted(revoked.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build())
    path.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return path


def make_device_cert(out: Path, name: str, days: int = 365) -> dict[str, Path]:
    """A device's client certificate ``device-NAME.pem`` / ``device-NAME.key`` (CN = NAME,
    extended key usage: TLS client authentication only), issued by the device CA; also writes
    the device CA and ``crl.pem`` if absent."""
    name = _device_name(name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = load_or_make_device_ca(out, days)
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"device-ca": out / "device-ca.crt", "cert": out / f"device-{name}.pem",
             "key": out / f"device-{name}.key"}
    _write_key(key, paths["key"])
    _write_cert(cert, paths["cert"])
    paths["crl"] = write_crl(out, days)
    return paths


def revoke_device(out: Path, name: str, days: int = 365) -> Path:
    """Add ``device-NAME.pem`` to ``crl.pem``; returns the CRL's path."""
    out = Path(out)
    path = out / f"device-{_device_name(name)}.pem"
    if not path.is_file():
        known = sorted(p.name[len("device-"):-len(".pem")] for p in out.glob("device-*.pem"))
        raise SystemExit(f"cannot revoke {name!r}: {path} does not exist (devices in {out}: "
                         f"{', '.join(known) or 'none'})")
    return write_crl(out, days, revoke=x509.load_pem_x509_certificate(path.read_bytes()))


def check_request(args: argparse.Namespace, out: Path) -> None:
    """Every name and every request checked before anything is written: a bad ``--device``,
    ``--revoke`` or ``--node-key`` name (``../../evil``, one over 64 characters), a ``--revoke``
    of a device never issued here (nor by this call), a ``--renew-crl`` without a device CA; so a
    refused call leaves ``--out`` as it was (no new CA, no server key)."""
    for flag, names in (("--node-key", args.node_key), ("--device", args.device), ("--revoke", args.revoke)):
        for name in names:
            _device_name(name, flag)
    for name in args.revoke:
        if name not in args.device and not (out / f"device-{name}.pem").is_file():
            known = sorted(p.name[len("device-"):-len(".pem")] for p in out.glob("device-*.pem"))
            raise SystemExit(f"cannot revoke {name!r}: {out / f'device-{name}.pem'} does not exist (devices in {out}:"
                             f" {', '.join(known) or 'none'})")
    if args.renew_crl and not args.device and not (out / "device-ca.crt").is_file():
        raise SystemExit(f"--renew-crl: {out / 'device-ca.crt'} does not exist (issue a --device first)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="certs", help="output folder (default: certs)")
    parser.add_argument("--host", action="append", default=[],
                        help="IP address or DNS name the SuperNodes dial (repeatable)")
    parser.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    parser.add_argument("--node-key", action="append", default=[], metavar="NAME",
                        help="also write a SuperNode auth key pair supernode-NAME.{key,pub} (repeatable)")
    parser.add_argument("--no-loopback", action="store_true",
                        help="do not add localhost/127.0.0.1/::1 to the certificate")
    parser.add_argument("--device", action="append", default=[], metavar="NAME",
                        help="also write a device client certificate device-NAME.{pem,key} and its SuperNode"
                             " key pair supernode-NAME.{key,pub} (repeatable)")
    parser.add_argument("--revoke", action="append", default=[], metavar="NAME",
                        help="add device-NAME.pem to crl.pem (repeatable)")
    parser.add_argument("--renew-crl", action="store_true",
                        help="re-sign crl.pem, valid --days from now (before it expires)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    check_request(args, out)
    paths: dict[str, Path] = {}
    if args.host or args.no_loopback or not (out / "server.pem").is_file():
        paths = make_server_cert(out, args.host, args.days, loopback=not args.no_loopback)
    for name in args.node_key:
        paths.update({f"{name} {k}": v for k, v in make_node_key(out, name).items()})
    for name in args.device:
        paths.update({f"device {name} {k}": v for k, v in make_device_cert(out, name, args.days).items()})
        paths.update({f"device {name} node {k}": v for k, v in make_node_key(out, name).items()})
    for name in args.revoke:
        paths[f"revoked {name}: crl"] = revoke_device(out, name, args.days)
    if args.renew_crl:
        paths["crl"] = write_crl(out, args.days)
    for what, path in paths.items():
        print(f"{what}: {path}")
    for name in args.device:
        print(f"register device {name} as one SuperNode (on the server): flwr supernode register"
              f" {out / f'supernode-{name}.pub'} <connection>")


if __name__ == "__main__":
    main()
