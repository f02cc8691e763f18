"""The tests' fixtures and hooks: the offline data folder, the session's simulation and its
runs, the background deployments, and what every test runs under (one torch thread, a private
disk cache, its environment restored). What tests import lives in the kit: tests/kit.py and
tests/kit_training.py, tests/kit_server.py, tests/kit_runs.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# No telemetry from the tests (they run offline): flwr-datasets' telemetry thread, opening an
# https connection while the main thread read a parquet file's metadata, once segfaulted a
# fresh-clone CI run (ssl.load_default_certs beside pyarrow's read_metadata). Set before Flower
# is imported, which reads it at import time; the processes the tests start inherit it.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, before the kit's imports

from runner.deploy import TLS  # noqa: E402
from tests.kit import ROOT, find_data_dir, has_data  # noqa: E402
from tests.kit_runs import (  # noqa: E402
    DeploymentRuns,
    NodeKiller,
    SimulatedRun,
    has_superlink,
    leftovers,
    local_simulation,
    run_killed,
    run_mixed,
)

# The default test command runs two pytest-xdist workers (``-n 2``, pyproject.toml): in one
# process the suite left one of the 2 cores idle most of the run (load average 1.0). The tests
# that read the session's shared Flower processes (one SuperLink in simulation mode, the runs it
# shares, the two background deployments) are one unit of work, so a single worker runs them all
# and starts each once, while the other worker runs the in-process tests. xdist's own
# ``--dist loadgroup`` cannot do this on pytest 9.2 (it renames a test by writing ``item._nodeid``,
# which pytest 9.2 no longer reads, so every group is silently ignored: an open pytest-xdist issue,
# "--dist=loadgroup silently stops grouping on pytest main", measured here with xdist 3.8.0), so
# the controller schedules with ``SharedFlowerScheduling``:
# each worker writes the ids of the tests that read the shared processes to a folder the
# controller names, and the scheduler puts those ids in one scope. ``-n 0`` runs everything in this process
# (a debugger, one test); another ``--dist`` mode is xdist's own.
SHARED_FLOWER_FIXTURES = frozenset({"sim", "simulated", "deployment_runs"})
SHARED_FLOWER_SCOPE = "shared-flower"
SHARED_FLOWER_IDS = "fl_drift_shared_flower_ids"  # the workerinput key: the folder for the ids


def reads_shared_flower(item: pytest.Item) -> bool:
    """Whether ``item`` reads the session's shared Flower processes (directly or through another fixture)."""
    return bool(SHARED_FLOWER_FIXTURES & set(getattr(item, "fixturenames", ())))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """In the xdist controller, before each worker starts: the folder it writes its ids to."""
    folder = node.config.stash.get(SHARED_IDS_FOLDER, None)
    if folder is None:
        folder = node.config.stash[SHARED_IDS_FOLDER] = Path(tempfile.mkdtemp(prefix="fl-drift-xdist-"))
    node.workerinput[SHARED_FLOWER_IDS] = str(folder)


@pytest.hookimpl(trylast=True)  # after ``-m`` and ``-k`` have deselected
def pytest_collection_modifyitems(config, items):
    """In an xdist worker: write the ids of the selected tests that read the shared processes,
    before the worker reports its collection to the controller."""
    if is_xdist_worker(config) and SHARED_FLOWER_IDS in config.workerinput:
        ids = [item.nodeid for item in items if reads_shared_flower(item)]
        folder = Path(config.workerinput[SHARED_FLOWER_IDS])
        (folder / f"{config.workerinput['workerid']}.txt").write_text("\n".join(ids))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """The controller's scheduler for xdist's default mode (``--dist load``), see above."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFlowerScheduling(LoadScopeScheduling):
        """Load scheduling, one test per unit of work, except the tests that read the shared
        Flower processes: one unit, so one worker runs them all. The ids are read when the
        scheduler first splits (every worker has then reported its collection, written after
        its ids)."""

        shared: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.shared is None:
                folder = config.stash[SHARED_IDS_FOLDER]
                self.shared = frozenset(line for f in folder.glob("*.txt") for line in f.read_text().splitlines())
            return SHARED_FLOWER_SCOPE if nodeid in self.shared else nodeid

    return SharedFlowerScheduling(config, log)


def pytest_unconfigure(config):
    folder = config.stash.get(SHARED_IDS_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


SHARED_IDS_FOLDER = pytest.StashKey[Path]()


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
    made: dict[tuple[int, int], Path] = {}

    def sample(train: int, test: int) -> Path:
        if (train, test) not in made:
            made[train, test] = write_mnist_sample(tmp_path_factory.mktemp(f"mnist-{train}-{test}"), train, test)
        return made[train, test]

    return sample


def write_mnist_sample(folder: Path, train: int, test: int) -> Path:
    """Write ``folder``/mnist/{train,test}.parquet: ``train`` and ``test`` rows of the offline
    MNIST files drawn by one generator seeded 0 (the train rows first), kept in file order;
    returns ``folder`` (``mnist_sample``'s sample, also for scripts run outside pytest)."""
    import numpy as np
    import pyarrow.parquet as pq

    source = _offline_data() / "mnist"
    (folder / "mnist").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, rows in (("train", train), ("test", test)):
        table = pq.read_table(source / f"{split}.parquet")
        keep = np.sort(rng.choice(table.num_rows, size=rows, replace=False))
        pq.write_table(table.take(keep), folder / "mnist" / f"{split}.parquet")
    return folder


@pytest.fixture(scope="session")
def small_mnist(mnist_sample) -> Path:
    """6,000 training and 1,000 test images of MNIST (``mnist_sample``)."""
    return mnist_sample(6000, 1000)


@pytest.fixture(autouse=True)
def start_deployments_early(request):
    """Start the background deployments (``deployment_runs``, tests/kit_runs.py) early, when a
    selected test reads them and they can run (Flower's SuperLink installed, the offline data
    present): they then run while other tests do, mostly waiting and starting processes. In one
    process, at the session's first test; under pytest-xdist, at the first test of the shared
    Flower group in the worker that runs that group (the only worker that reads them). Tried once
    per process. Best effort: a failure to start is the deployment tests' own error (the
    fixture's error is kept and raised to each of them), not every test's."""
    stash = request.config.stash
    if stash.get(DEPLOYMENTS_TRIED, False):
        return
    if is_xdist_worker(request.config) and not reads_shared_flower(request.node):
        return
    stash[DEPLOYMENTS_TRIED] = True
    wanted = any("deployment_runs" in item.fixturenames for item in request.session.items)
    if wanted and has_superlink() and has_data(find_data_dir()):
        try:
            request.getfixturevalue("deployment_runs")
        except Exception:  # noqa: BLE001 - raised again to the tests that read the deployments
            pass


DEPLOYMENTS_TRIED = pytest.StashKey[bool]()


def is_xdist_worker(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist worker (xdist gives each its ``workerinput``)."""
    return hasattr(config, "workerinput")


def only_this_worker_starts(what: str, config: pytest.Config, tmp_path_factory) -> None:
    """Under pytest-xdist, fail when another worker of this session has started ``what`` (the
    shared Flower group was split: each worker would pay its own start-up). Each worker leaves
    a file in the session's common temporary folder before it looks for the others', so of two
    workers starting at once at least one sees the other."""
    if not is_xdist_worker(config):
        return
    root = tmp_path_factory.getbasetemp().parent  # the session's, above each worker's popen-gwN
    mine = root / f"started-{what}-{config.workerinput['workerid']}"
    mine.touch()
    others = sorted(p.name for p in root.glob(f"started-{what}-*") if p != mine)
    assert not others, (f"{what} started in two xdist workers ({mine.name}, {others}): the tests that read it"
                        f" must be one unit of work ({SHARED_FLOWER_SCOPE!r}, SharedFlowerScheduling in tests/conftest.py)")


@pytest.fixture(scope="session")
def sim(request, tmp_path_factory):
    """One private SuperLink in simulation mode for the session's end-to-end runs (its start is
    paid once, in one xdist worker); stopped at the end with every process it started, checked
    by PID and FLWR_HOME."""
    only_this_worker_starts("sim", request.config, tmp_path_factory)
    simulation = local_simulation()
    simulation.start()
    yield simulation
    assert simulation.close() == [], "processes survived the simulation"
    assert leftovers(simulation.home) == [], "a process with the simulation's FLWR_HOME survived"


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


@pytest.fixture(scope="session")
def deployment_certs(tmp_path_factory) -> TLS:
    """scripts/make_certs.py, as a user runs it: a CA and a SuperLink certificate for 127.0.0.1."""
    out = tmp_path_factory.mktemp("certs")
    keys = [arg for name in ("own", "part", "bad", "stranger") for arg in ("--node-key", name)]
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_certs.py"), "--out", str(out),
                    "--host", "127.0.0.1", *keys], check=True, capture_output=True)
    return TLS.in_dir(out)


@pytest.fixture(scope="session")
def deployment_runs(request, small_mnist, tmp_path_factory, deployment_certs):
    """The two deployments of tests/deployment/test_deployment.py (``run_killed``, ``run_mixed``
    in tests/kit_runs.py), each in a thread of its own, started at the first request (early:
    ``start_deployments_early`` says when); the
    session waits for both at its end. Each has its own SuperLink, FLWR_HOME and ports and stops
    every process it started before its result is read."""
    only_this_worker_starts("deployments", request.config, tmp_path_factory)
    killer = NodeKiller(2)
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="deployment")
    killed = pool.submit(run_killed, small_mnist, tmp_path_factory.mktemp("killed"), deployment_certs, killer)
    mixed = pool.submit(run_mixed, small_mnist, tmp_path_factory.mktemp("mixed"), deployment_certs, (killed, killer))
    yield DeploymentRuns(killed, killer, mixed)
    pool.shutdown(wait=True)
