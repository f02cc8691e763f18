"""Shared test fixtures (the offline data folder, the session's simulation and its runs), the
stand-ins for Flower's client manager and transport, and the in-process way to serve a run.
Building a client, running its rounds and comparing its paths: tests/kit.py."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# No telemetry from the tests (they run offline): flwr-datasets' telemetry thread, opening an
# https connection while the main thread read a parquet file's metadata, once segfaulted a
# fresh-clone CI run (ssl.load_default_certs beside pyarrow's read_metadata). Set before Flower
# is imported, which reads it at import time; the processes the tests start inherit it.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import pytest  # noqa: E402
import torch  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.server.client_proxy import ClientProxy  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fl_app.client_app import client_fn  # noqa: E402
from fl_app.common.procfs import processes_with_env  # noqa: E402
from runner.inprocess import InProcessProxy  # noqa: E402
from runner.launch import LocalSimulation  # noqa: E402
from tests.helpers_deployment import deployment_certs, deployment_runs, has_superlink  # noqa: E402, F401

SHARED_DATA = ROOT.parent / "shared" / "data"


def find_data_dir() -> Path:
    """$FL_DATA_DIR when set, else the data folder beside the checkout (which may not exist:
    a fresh clone has none, and the tests that need data then skip, ``_offline_data``)."""
    configured = os.environ.get("FL_DATA_DIR")
    return Path(configured).expanduser().resolve() if configured else SHARED_DATA


def has_data(folder: Path) -> bool:
    return (folder / "mnist" / "train.parquet").exists()


def data_env() -> dict[str, str]:
    """``{"FL_DATA_DIR": folder}`` for a simulation's environment when the offline data folder
    exists, else ``{}``: a missing folder is never handed on (a run would fail on it instead of
    falling back, and a test that needs data skips before it launches one)."""
    found = find_data_dir()
    return {"FL_DATA_DIR": str(found)} if has_data(found) else {}


# The tests' runs leave the split's picture out (``split-picture``: a matplotlib import and ~0.5 s
# per run, about 20 s of the default run); a test that looks at the picture sets it true.
# tests/data/test_partitioners.py's test_a_run_writes_the_split_picture_unless_told_not_to checks a
# run's picture; test_split_files_draw_and_count_every_client and test_check_draws_the_split_
# without_training check the drawing and run_simulation.py --check's pictures.
NO_PICTURE = {"split-picture": False}


def without_picture(run_config: dict) -> dict:
    """``run_config`` with ``split-picture`` false unless it sets the key itself."""
    return {**NO_PICTURE, **run_config}


class SuiteSimulation(LocalSimulation):
    """A ``LocalSimulation`` whose runs leave the split's picture out unless their config asks
    for it (``without_picture``)."""

    def run(self, run_config: dict, *args, **kwargs) -> int:
        return super().run(without_picture(run_config), *args, **kwargs)


def local_simulation(**kwargs) -> SuiteSimulation:
    """A ``SuiteSimulation`` (not started) whose processes see the offline data folder when
    there is one (``data_env``); this process's environment is left as it is."""
    simulation = SuiteSimulation(**kwargs)
    simulation.env.update(data_env())
    return simulation


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """Tests (and the simulations they start) keep fl-drift's disk cache to themselves; the
    variable is restored at the end of the session."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FL_DRIFT_CACHE", str(tmp_path_factory.mktemp("fl-drift-cache")))
        yield


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """What the tests train in this process trains on one torch thread, as every simulated client
    does (``match_threads_to_cpu_share`` in fl_app/node/node_client.py: one CPU per client). The
    tests' models are small, so a second thread gains little; and whenever another process wants
    a core, every operator waits at OpenMP's barrier for a descheduled thread: on the 2-core
    machine at load 1.6-3.7, 161 in-process tests took 182 s on two threads and 22 s on one (a
    single cross-entropy of 32 examples: 9 ms instead of 0.01 ms). Simulations and deployments
    started by the tests choose their own threads. Restored at the end of the session."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def environment_restored():
    """Whatever a test (or code it calls, such as the runner's ``os.environ.setdefault``) does
    to the environment is undone after it, so no test sees another's variables: tests set
    variables with ``monkeypatch``, and this catches what slips past it."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture
def shared_data() -> Path:
    """The offline data folder (MNIST and CIFAR-10 parquet): $FL_DATA_DIR, else beside the checkout."""
    return _offline_data()


def _offline_data() -> Path:
    """The data folder, or a skip with the one reason every data test gives."""
    found = find_data_dir()
    if not has_data(found):
        pytest.skip(f"no offline data: {found} has no mnist/train.parquet (set FL_DATA_DIR to the data folder)")
    return found


@pytest.fixture(scope="session")
def mnist_sample(tmp_path_factory):
    """``mnist_sample(train, test)``: a data folder with a seeded sample of the real MNIST files
    (``train`` and ``test`` rows), written once per session and size: for end-to-end runs that
    check Flower's plumbing, not what full MNIST learns. Decoding and training on 60,000 images
    is most of such a run's cost beyond Flower's and Ray's start-up, and in a deployment every
    ClientApp process decodes its data anew."""
    import numpy as np
    import pyarrow.parquet as pq

    made: dict[tuple[int, int], Path] = {}

    def sample(train: int, test: int) -> Path:
        if (train, test) not in made:
            source = _offline_data() / "mnist"
            folder = tmp_path_factory.mktemp(f"mnist-{train}-{test}")
            (folder / "mnist").mkdir()
            rng = np.random.default_rng(0)
            for split, rows in (("train", train), ("test", test)):
                table = pq.read_table(source / f"{split}.parquet")
                keep = np.sort(rng.choice(table.num_rows, size=rows, replace=False))
                pq.write_table(table.take(keep), folder / "mnist" / f"{split}.parquet")
            made[train, test] = folder
        return made[train, test]

    return sample


@pytest.fixture(scope="session")
def small_mnist(mnist_sample) -> Path:
    """6,000 training and 1,000 test images of MNIST (``mnist_sample``)."""
    return mnist_sample(6000, 1000)


def leftovers(home: Path) -> list[int]:
    """PIDs of processes that still have ``home`` as FLWR_HOME, after up to 15 s for them to go."""
    deadline = time.monotonic() + 15
    while (left := processes_with_env("FLWR_HOME", str(home))) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.fixture(autouse=True, scope="session")
def start_deployments_early(request):
    """At the session's first test, start the background deployments (``deployment_runs``,
    tests/helpers_deployment.py) when a selected test reads them and they can run (Flower's
    SuperLink installed, the offline data present): they then run while the tests before
    tests/deployment/test_deployment.py do, mostly waiting and starting processes, on the core those
    tests leave free. Best effort: a failure to start is the deployment tests' own error (the
    fixture's error is kept and raised to each of them), not every test's."""
    wanted = any("deployment_runs" in item.fixturenames for item in request.session.items)
    if wanted and has_superlink() and has_data(find_data_dir()):
        try:
            request.getfixturevalue("deployment_runs")
        except Exception:  # noqa: BLE001 - raised again to the tests that read the deployments
            pass


@pytest.fixture(scope="session")
def sim():
    """One private SuperLink in simulation mode for the session's end-to-end runs (its start is
    paid once); stopped at the end with every process it started, checked by PID and FLWR_HOME."""
    simulation = local_simulation()
    simulation.start()
    yield simulation
    assert simulation.close() == [], "processes survived the simulation"
    assert leftovers(simulation.home) == [], "a process with the simulation's FLWR_HOME survived"


@dataclass
class SimulatedRun:
    rc: int
    lines: list[str]
    run_dir: Path
    config: dict
    num_supernodes: int


@pytest.fixture(scope="session")
def simulated(sim, tmp_path_factory):
    """``simulated(name, config, num_supernodes)``: the run ``name`` through the session's
    simulation, launched at its first request and then shared: tests that assert different
    things about the same run (every method's end-to-end check, the resume test's uninterrupted
    run and same-seed check, the FAB of ``flwr build``, the cohort path's per-client reference)
    read one run instead of each launching its own (about 20 s of Flower's and Ray's start-up
    per run). Asking for a name with another config is an error."""
    root = tmp_path_factory.mktemp("simulated")
    runs: dict[str, SimulatedRun] = {}

    def run(name: str, config: dict, num_supernodes: int) -> SimulatedRun:
        if name not in runs:
            lines: list[str] = []
            rc = sim.run({**config, "results-dir": str(root), "run-name": name}, num_supernodes=num_supernodes,
                         on_line=lines.append)
            runs[name] = SimulatedRun(rc, lines, root / name, dict(config), num_supernodes)
        shared = runs[name]
        assert (shared.config, shared.num_supernodes) == (config, num_supernodes), f"run {name!r} asked for twice"
        return shared

    return run


class FakeProxy:
    def __init__(self, cid):
        self.cid = cid


class FakeManager:
    """Just enough of a ClientManager for FedAvg.configure_fit."""

    def __init__(self, n):
        self.proxies = [FakeProxy(str(i)) for i in range(n)]

    def num_available(self):
        return len(self.proxies)

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return self.proxies[:num_clients]


Proxy = InProcessProxy  # hands the FitIns to a real NumPyClient, as Flower's transport would


class AppProxy(ClientProxy):
    """One node served as the ClientApp serves it, in this process: every message builds the
    client anew with ``fl_app.client_app.client_fn`` on the node's own Context (node config, run
    config, ``context.state``). Left out: Flower's transport and the ClientApp's mods."""

    def __init__(self, cid: str, context: Context):
        super().__init__(cid)
        self.context = context

    def get_properties(self, ins, timeout, group_id):
        return client_fn(self.context).get_properties(ins)

    def fit(self, ins, timeout, group_id):
        return client_fn(self.context).fit(ins)

    def evaluate(self, ins, timeout, group_id):
        return client_fn(self.context).evaluate(ins)

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


def serve_in_process(run_config: dict, nodes: int) -> None:
    """One run with no Ray and no SuperLink: the ServerApp's ``server_fn`` components (its
    ``DriftServer``, run as Flower's ServerApp runs it: ``fit``), ``nodes`` new nodes (partition k
    of ``nodes``, empty ``context.state``) served by ``AppProxy``. Exceptions of the server (an
    injected crash, ``RunAborted``) propagate. Clients fit one at a time: in one process they
    share the cached model (``tasks.models.cached_model``), as the clients of one Ray actor do.
    The split's picture is left out unless ``run_config`` asks for it (``without_picture``)."""
    from fl_app.server_app import server_fn

    run_config = without_picture(run_config)
    components = server_fn(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    server = components.server
    manager = server.client_manager()
    for k in range(nodes):  # node ids in another order than the partitions
        node_config = {"partition-id": k, "num-partitions": nodes}
        context = Context(run_id=0, node_id=900 - 7 * k, node_config=node_config, state=RecordDict(),
                          run_config=run_config)
        manager.register(AppProxy(str(900 - 7 * k), context))
    server.set_max_workers(1)
    server.fit(components.config.num_rounds, timeout=None)


def non_split_files(out: Path) -> list[str]:
    """The names in ``out``: a ``--check`` writes nothing there (no run, no record, no result,
    not even the pictures of its splits, which go to a temporary folder: runner/checks.py
    ``check_folder``), so this list is what it must leave unchanged."""
    return sorted(p.name for p in out.iterdir()) if out.exists() else []


def load_make_results():
    """scripts/make_results.py as a module (a script, not a package: loaded from its file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_results", ROOT / "scripts" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
