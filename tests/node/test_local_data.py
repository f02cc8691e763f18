"""Node-local data (``--node-config data-path=...``), the sampler with such nodes, TLS certificates.

Fast unit checks; the real SuperLink/SuperNode runs are in ``tests/deployment/test_deployment.py``.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import Context, RecordDict
from flwr.common import Code, GetPropertiesRes, Status
from PIL import Image

from clients import fedavg
from fl_app.client_app import node_partition
from fl_app.node.drift_client import DriftClient
from fl_app.registry import validate_config
from fl_app.server.sampling import SeededClientManager
from runner.deploy import node_config_arg
from tasks.local_files import LocalDataError, load_local_file
from tests.kit import ROOT

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def images():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8), np.array([0, 3, 3, 9, 1])


def write_parquet(path, images, labels, image_col="image"):
    cells = [{"bytes": png(a), "path": None} for a in images]
    pq.write_table(pa.table({image_col: cells, "label": labels.astype(np.int64)}), path)
    return path


def expected(images):
    return (torch.from_numpy(images).float()[:, None] / 255.0 - MNIST_MEAN) / MNIST_STD


def test_parquet_file_gets_the_named_datasets_normalisation(tmp_path, images):
    arrays, labels = images
    x, y = load_local_file(str(write_parquet(tmp_path / "own.parquet", arrays, labels)), "mnist")
    assert x.shape == (5, 1, 28, 28) and x.dtype == torch.float32
    torch.testing.assert_close(x, expected(arrays))
    assert y.tolist() == labels.tolist()


def test_image_folder_matches_parquet(tmp_path, images):
    arrays, labels = images
    for i, (a, label) in enumerate(zip(arrays, labels)):
        (tmp_path / "imgs" / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(a).save(tmp_path / "imgs" / str(label) / f"{i}.png")
    x, y = load_local_file(str(tmp_path / "imgs"), "mnist")
    order = sorted(range(5), key=lambda i: (str(labels[i]), f"{i}.png"))  # folder, then file name
    torch.testing.assert_close(x, expected(arrays[order]))
    assert y.tolist() == labels[order].tolist()


def test_cached_per_process_until_the_file_changes(tmp_path, images):
    arrays, labels = images
    path = write_parquet(tmp_path / "own.parquet", arrays, labels)
    first = load_local_file(str(path), "mnist")
    assert load_local_file(str(path), "mnist") is first
    time.sleep(0.01)
    write_parquet(path, arrays[:2], labels[:2])
    assert len(load_local_file(str(path), "mnist")[1]) == 2


@pytest.mark.parametrize("case", ["missing", "not-parquet", "columns", "size", "label", "folder", "empty"])
def test_bad_data_path_names_the_path(tmp_path, images, case):
    arrays, labels = images
    path = tmp_path / "data.parquet"
    if case == "not-parquet":
        path.write_text("not parquet")
    elif case == "columns":
        write_parquet(path, arrays, labels, image_col="img")
    elif case == "size":
        write_parquet(path, np.zeros((2, 32, 32), np.uint8), labels[:2])
    elif case == "label":
        write_parquet(path, arrays, np.array([0, 1, 2, 3, 10]))
    elif case == "folder":
        path = tmp_path / "imgs"
        (path / "cats").mkdir(parents=True)
    elif case == "empty":
        path = tmp_path / "imgs"
        (path / "0").mkdir(parents=True)
    with pytest.raises(LocalDataError, match="data-path") as err:
        load_local_file(str(path), "mnist")
    assert str(path) in str(err.value)


def node_context(node_config: dict) -> Context:
    return Context(run_id=0, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


def test_client_trains_on_its_data_path_and_reports_it(tmp_path, images):
    arrays, labels = images
    path = str(write_parquet(tmp_path / "own.parquet", arrays, labels))
    cfg = validate_config({"dataset": "mnist", "model": "cnn-small", "batch-size": 2, "checkpoint-every": 0})
    client = DriftClient(fedavg.UPDATE, cfg, node_context({"data-path": path}), *node_partition({"data-path": path}))
    assert client.get_properties({}) == {"data-path": path}
    _, n, metrics = client.fit(client.get_parameters({}), {"server-round": 1})
    assert n == 5 and metrics["num_steps"] == 3


def test_bad_data_path_fails_at_fit_not_before(tmp_path):
    path = str(tmp_path / "missing.parquet")
    cfg = validate_config({"dataset": "mnist", "model": "cnn-small", "checkpoint-every": 0})
    client = DriftClient(fedavg.UPDATE, cfg, node_context({"data-path": path}), *node_partition({"data-path": path}))
    assert client.get_properties({}) == {"data-path": path}  # the sampler can still ask it
    with pytest.raises(LocalDataError, match="missing.parquet"):
        client.fit(client.get_parameters({}), {"server-round": 1})


def test_node_partition_from_node_config():
    assert node_partition({"partition-id": 3, "num-partitions": 20}) == (3, 20)
    assert node_partition({"data-path": "/d.parquet"}) == (-1, 0)
    with pytest.raises(ValueError, match="data-path"):
        node_partition({"num-partitions": 20})


class Proxy:
    def __init__(self, cid, props):
        self.cid, self.props, self.asked = cid, props, 0

    def get_properties(self, ins, timeout, group_id):
        self.asked += 1
        return GetPropertiesRes(Status(Code.OK, ""), self.props)


def test_sampler_orders_data_path_nodes_after_partitions_and_asks_once():
    manager = SeededClientManager(0)
    proxies = [Proxy("50", {"data-path": "/b.parquet"}), Proxy("10", {"data-path": "/a.parquet"}),
               Proxy("99", {"partition-id": 1, "num-partitions": 20}),
               Proxy("30", {"partition-id": 0, "num-partitions": 20})]
    for p in proxies:
        manager.register(p)
    for _ in range(3):
        assert len(manager.sample(4)) == 4
    assert manager.ordered(["50", "10", "99", "30"]) == ["30", "99", "10", "50"]
    assert manager.num_partitions == 20
    assert [p.asked for p in proxies] == [1, 1, 1, 1]


def test_node_config_arg_quotes_strings():
    assert node_config_arg({"partition-id": 0, "num-partitions": 20}) == "partition-id=0 num-partitions=20"
    assert node_config_arg({"data-path": "/data/my file.parquet"}) == 'data-path="/data/my file.parquet"'


def test_make_certs_signs_a_server_certificate_for_the_host(tmp_path):
    script = str(ROOT / "scripts" / "make_certs.py")
    subprocess.run([sys.executable, script, "--out", str(tmp_path), "--host", "10.1.2.3", "--host",
                    "link.lan"], check=True, capture_output=True)
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    ca.public_key().verify(server.signature, server.tbs_certificate_bytes, ec.ECDSA(server.signature_hash_algorithm))
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"10.1.2.3", "127.0.0.1", "::1"}
    # every IP also as a DNS name: nginx 1.22 (the deployment's mTLS edge) checks DNS names only
    assert set(san.get_values_for_type(x509.DNSName)) == {"link.lan", "localhost", "10.1.2.3", "127.0.0.1", "::1"}
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # a second host later: same CA, so existing SuperNodes keep trusting the SuperLink
    subprocess.run([sys.executable, script, "--out", str(tmp_path), "--host", "10.1.2.4"],
                   check=True, capture_output=True)
    assert x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes()) == ca


def test_exported_partition_file_equals_the_partition(shared_data, tmp_path):
    """scripts/export_partitions.py: a data-path node with file k trains on partition k's rows."""
    from tasks.partitioning import PartitionSpec, load_partition

    subprocess.run([sys.executable, str(ROOT / "scripts" / "export_partitions.py"), "--dataset", "mnist",
                    "--num-partitions", "30", "--partitioner", "iid", "--ids", "2", "--data-dir",
                    str(shared_data), "--out", str(tmp_path)], check=True, capture_output=True)
    file = tmp_path / "mnist-iid-a0.3-seed0-30" / "partition-2.parquet"
    cfg = validate_config({"dataset": "mnist", "model": "cnn", "partitioner": "iid", "data-dir": str(shared_data)})
    x, y = load_partition(PartitionSpec.from_config(cfg, 30), 2)
    x_file, y_file = load_local_file(str(file), "mnist")
    assert torch.equal(x, x_file) and torch.equal(y, y_file)
