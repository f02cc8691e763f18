"""scripts/make_certs.py checks every name before it writes anything: `--device ../../evil`
wrote the CA and the server key, then refused the name; a device name over 64 characters (a
certificate's CN is at most 64) ended in a traceback after the CA was written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def make_certs():
    spec = importlib.util.spec_from_file_location("make_certs", ROOT / "scripts" / "make_certs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(make_certs, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        make_certs.main(argv)
    line = str(exit_.value.code)
    assert line and "\n" not in line and "Traceback" not in line
    return line


@pytest.mark.parametrize("argv, expected", [
    (["--device", "../../evil"], "--device name '../../evil' is not valid"),
    (["--device", "d" * 65], "it has 65 characters, at most 64"),
    (["--node-key", "../x"], "--node-key name '../x' is not valid"),
    (["--revoke", "../x"], "--revoke name '../x' is not valid"),
    (["--host", "127.0.0.1", "--device", "ok", "--device", "_bad"], "--device name '_bad' is not valid"),
    (["--revoke", "ghost"], "cannot revoke 'ghost'"),
])
def test_a_bad_name_is_refused_before_anything_is_written(make_certs, tmp_path, argv, expected):
    out = tmp_path / "certs"
    assert expected in refused(make_certs, ["--out", str(out), *argv])
    assert not out.exists() or list(out.iterdir()) == []  # no CA, no server key, no device file
    assert list(tmp_path.rglob("*evil*")) == []


def test_a_64_character_device_name_is_issued_and_revoked(make_certs, tmp_path):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    name = "d" * 64
    make_certs.main(["--out", str(tmp_path), "--device", name])
    cert = x509.load_pem_x509_certificate((tmp_path / f"device-{name}.pem").read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
    make_certs.main(["--out", str(tmp_path), "--revoke", name])  # a device issued earlier
    crl = x509.load_pem_x509_crl((tmp_path / "crl.pem").read_bytes())
    assert crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None
