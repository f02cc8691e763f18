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
same certificate. An existing CA in ``--out`` is reused, so adding a host keeps old nodes valid.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
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


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def load_or_make_ca(out: Path, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    crt, key_path = out / "ca.crt", out / "ca.key"
    if crt.is_file() and key_path.is_file():
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        return cert, key  # type: ignore[return-value]
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fl-drift private CA")])
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
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in names]), critical=False)
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
    args = parser.parse_args(argv)
    paths = make_server_cert(Path(args.out), args.host, args.days, loopback=not args.no_loopback)
    for name in args.node_key:
        paths.update({f"{name} {k}": v for k, v in make_node_key(Path(args.out), name).items()})
    for what, path in paths.items():
        print(f"{what}: {path}")


if __name__ == "__main__":
    main()
