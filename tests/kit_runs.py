"""The kit of the tests of runs outside this process:

- simulations through Flower (`flwr run`, the ServerApp on Flower's loop): ``local_simulation``
  (a private SuperLink whose runs see the offline data and leave the split's picture out),
  ``SimulatedRun`` (a shared run's result), ``leftovers`` (processes that outlived a FLWR_HOME),
  the methods run end to end and their configs (``NEEDS``, ``SIMULATED``, ``SUPERNODES``,
  ``simulated_config``) and a tiny MNIST parquet folder (``tiny_parquet``);
- README's tested blocks and what runs them in a copy of the checkout (``readme_block``,
  ``shrink``, ``copy_checkout``, ``base_env``, ``processes_with_env``, ``stop_pids``);
- the two real deployments that tests/deployment/test_deployment.py reads (``run_killed``,
  ``run_mixed``, ``deploy_and_run``; the session fixtures that start them in the background are
  in conftest.py). Each deployment starts its own SuperLink and SuperNodes on loopback
  (``runner/deploy.py``: TLS, private FLWR_HOME, free ports, no runtime dependency installation)
  and checks that no process it started outlives it. The killed-node deployment spends about
  60 s idle, waiting for Flower's heartbeat timeout (30 s interval, two missed: constants of
  Flower with no public setting), and the mixed-nodes deployment runs in that wait. Run in the
  foreground, the two took about 2 minutes of the default run (115 s and more at load 2-3); most
  of that is waiting and one-core process start-ups, which the 2-core machine overlaps with the
  tests that run meanwhile, on one core;
- scripts/make_results.py and the fabricated run folders and experiment tables its tests build
  on (no training, no dataset): ``load_make_results`` (the script as a module), ``write_run``
  (a run's metrics.csv and summary.json), the ``TOY`` and ``GHOST`` experiment tables,
  ``section`` and ``row`` to read a table of the generated page, and ``non_split_files`` (what a
  ``--check`` must leave unchanged).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from fl_app.common import procfs
from fl_app.common.procfs import descendants
from fl_app.registry import METHODS
from runner.deploy import TLS, LocalDeployment
from runner.launch import LocalSimulation
from tests.kit import ROOT, data_env, without_picture


# ------------------------------------------------------------------------------------- simulations
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


@dataclass
class SimulatedRun:
    """A run of the session's simulation (``simulated`` in conftest.py): its exit code, its
    streamed lines, its run folder, and the config and number of SuperNodes it ran with."""
    rc: int
    lines: list[str]
    run_dir: Path
    config: dict
    num_supernodes: int


def leftovers(home: Path) -> list[int]:
    """PIDs of processes that still have ``home`` as FLWR_HOME, after up to 15 s for them to go."""
    deadline = time.monotonic() + 15
    while (left := procfs.processes_with_env("FLWR_HOME", str(home))) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


# Methods whose client needs something the synthetic/logreg default lacks.
NEEDS = {
    # lenet-bn: the smallest BN model (the BN entries stay on the clients); cnn-bn trains 4-5x slower
    "fedbn": {"dataset": "mnist", "model": "lenet-bn", "batch-size": 64},
    "moon": {"model": "mlp"},
    "fedpgvc": {"model": "mlp"},  # masks the last two Linear layers
    "feddecorr": {"model": "mlp"},  # logreg has no body: its representation term would act on nothing
    # logreg has no body: under the fixed ETF head nothing would train. At the default 0.05 the
    # class-share adaptation left synthetic's global model at 0.13 after 2 rounds (each client's
    # missing classes sit at logit 0); the authors' default --lr 0.01 reached 0.47.
    "fedgela": {"model": "mlp", "learning-rate": 0.01},
    # CCVR's last round asks every client by default; the runs here count the sampled clients of
    # every round (tests/methods/test_ccvr.py checks the default's every client).
    "ccvr": {"ccvr-clients": "sampled"},
    # Adaptive server optimisers move each coordinate by about eta per round (m / sqrt(v) ~ +-1),
    # so Flower's default eta = 0.01 leaves logreg at chance after 2 rounds (FedAdam: 0.108):
    # the test's "learns in 2 rounds" needs eta = 0.1, the upper end of Reddi et al.'s grid.
    "fedadam": {"fedopt-eta": 0.1},
    "fedyogi": {"fedopt-eta": 0.1},
    "fedadagrad": {"fedopt-eta": 0.1},
}


# Through Flower's transport and Ray, one method of each kind: plain FedAvg, client state
# (SCAFFOLD's c_i in context.state), client-local BN entries (FedBN), Flower's DP wrappers with
# their ClientApp mod, and Flower's server optimisers. Every method also trains two rounds in
# process (tests/methods/test_every_method.py), at a fraction of the start-up cost.
# More methods, each once through Flower's transport in the slow run only (about 20 s of start-up
# each); in the default run they train two rounds in process (tests/methods/test_every_method.py).
SLOW_TRANSPORT_METHODS = ("fedrs", "fedlc", "feddecorr", "fedacg", "fedexp", "feddc", "fedspeed")
SIMULATED = ("fedavg", "scaffold", "fedbn", "dp-fedavg", "fedyogi", *SLOW_TRANSPORT_METHODS)
SUPERNODES = 4
# The fedavg and scaffold runs are also the resume test's uninterrupted runs, against which it
# makes the same-seed check too (tests/runner/test_reliability.py), and the fedavg run is the one that
# tests/project/test_flower_app.py finds the FAB of `flwr build` installed and run: they go 6 rounds,
# not 2 (a synthetic round after the first takes about 0.3 s; a run's start about 20 s).
ROUNDS = {"fedavg": 6, "scaffold": 6}


def simulated_config(method: str, request) -> dict:
    """The end-to-end run of ``method``: synthetic data and logreg unless ``NEEDS`` says
    otherwise; MNIST runs read the session's MNIST sample (``small_mnist`` in conftest.py)."""
    cfg = {"strategy": method, "dataset": "synthetic", "model": "logreg", "num-server-rounds": ROUNDS.get(method, 2),
           "fraction-fit": 0.5, "learning-rate": 0.05, **NEEDS.get(method, {})}
    if cfg["dataset"] == "mnist":
        cfg["data-dir"] = str(request.getfixturevalue("small_mnist"))
    return cfg


# -------------------------------------------------------------------------------------------- data
def tiny_parquet(folder, columns=("image", "label"), rows=20):
    """``folder`` with mnist/train.parquet and mnist/test.parquet of ``rows`` rows each: a black
    28 x 28 PNG under ``columns[0]`` and the labels 0-9 in turn under ``columns[1]``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(buf, format="PNG")
    data = {columns[0]: [{"bytes": buf.getvalue(), "path": None}] * rows, columns[1]: [i % 10 for i in range(rows)]}
    (folder / "mnist").mkdir(parents=True)
    for split in ("train", "test"):
        pq.write_table(pa.table(data), folder / "mnist" / f"{split}.parquet")
    return folder


# ------------------------------------------------------------------------------- README's commands
# Every fenced block of README.md is marked <!-- test: NAME --> with one of these names, and a test
# of tests/project/test_readme.py runs it (tests/project/test_docs.py checks that no other block exists).
TESTED_BLOCKS = ("setup", "run-flwr", "run-runner", "docs")


SHRINK = {
    "run-flwr": {"num-server-rounds=2": "num-server-rounds=1", "num-supernodes=4": "num-supernodes=2"},
    "run-runner": {"--rounds 6": "--rounds 1", "--clients 50": "--clients 2", "--fraction 0.2": "--fraction 1",
                   "--seeds 0 1 2": "--seeds 0"},
}


def readme_block(name: str) -> str:
    """The fenced bash block that follows ``<!-- test: name`` in README.md."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- test: {re.escape(name)}\b[^>]*-->\s*```bash\n(.*?)```", text, re.DOTALL)
    assert match, f"README.md has no bash block marked <!-- test: {name} -->"
    return match.group(1)


def shrink(name: str) -> str:
    """README's block ``name`` with ``SHRINK``'s replacements made (each checked to be there): the
    same commands on fewer rounds, clients and seeds."""
    block = readme_block(name)
    for old, new in SHRINK.get(name, {}).items():
        assert old in block, f"README's {name} block no longer contains {old!r}"
        block = block.replace(old, new)
    return block


def copy_checkout(dest: Path) -> Path:
    """Tracked and untracked-but-not-ignored files of the checkout."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def processes_with_env(marker: str) -> list[int]:
    """PIDs (of this user) whose environment contains ``marker`` (``NAME=value``)."""
    name, _, value = marker.partition("=")
    return procfs.processes_with_env(name, value)


def stop_pids(pids: list[int]) -> None:
    """SIGTERM, then SIGKILL, each process of ``pids`` (2 s after each signal; gone ones skipped)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(2)


def base_env() -> dict[str, str]:
    """This process's environment without PYTHONPATH, FLWR_HOME and FLWR_LOCAL*, this Python's
    folder first on PATH: what a user's shell in a fresh checkout would have."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FLWR_HOME") and not k.startswith("FLWR_LOCAL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


# ------------------------------------------------------------------------------------- deployments
# SCAFFOLD keeps c_i in context.state; FedGAM-CV is the fallback with the same mechanism.
STATEFUL = "scaffold" if "scaffold" in METHODS else "fedgam-cv"
SMALL = {"dataset": "mnist", "model": "cnn-small", "batch-size": 32, "local-epochs": 1,
         "learning-rate": 0.05, "fraction-fit": 1.0, "checkpoint-every": 0}
TIMEOUT = 420


def has_superlink() -> bool:
    """Whether Flower's SuperLink is installed (on PATH or beside this Python)."""
    return shutil.which("flower-superlink") is not None or (Path(sys.executable).parent / "flower-superlink").exists()


@dataclass
class Node:
    """A SuperNode of a deployment: its node config, its authentication key (when the
    deployment authenticates nodes) and whether that key is registered with the SuperLink."""
    config: dict
    key: str | None = None  # supernode-<key>.key from make_certs.py --node-key
    registered: bool = True


@dataclass
class DeployedRun:
    """A finished deployment's exit code, streamed output and (closed) ``LocalDeployment``;
    ``results``: its run folder; ``logs``: its processes' logs (for a failure's message)."""
    rc: int
    output: str
    deployment: LocalDeployment
    results: Path
    logs: str


def deploy_and_run(tmp_path: Path, tls: TLS, nodes: list[Node], run_config: dict, data: Path, auth: bool = False,
                   watch=None, timeout: float = TIMEOUT) -> DeployedRun:
    """Start SuperLink + SuperNodes (partitions from ``data``), run ``run_config`` (its
    ``run-name`` under ``tmp_path / "results"``), stop everything.

    ``watch(deployment, line)`` sees every streamed line of the run (e.g. to kill a node)."""
    deployment = LocalDeployment(tls=tls, home=tmp_path / "flwr-home", supernode_auth=auth,
                                 extra_env={"FL_DATA_DIR": str(data)})
    lines: list[str] = []
    try:
        deployment.start_superlink()
        for node in nodes:
            key = None
            if node.key is not None:
                key = tls.ca.parent / f"supernode-{node.key}.key"
                if node.registered:
                    deployment.register_supernode(key.with_suffix(".pub"))
            deployment.add_supernode(node.config, auth_key=key, wait=node.registered)

        def on_line(line: str) -> None:
            lines.append(line)
            if watch is not None:
                watch(deployment, line)

        rc = deployment.run({**SMALL, "results-dir": str(tmp_path / "results"), **run_config},
                            on_line=on_line, timeout=timeout)
    finally:
        survivors = deployment.close()
    assert survivors == [], f"processes survived close(): {survivors}"
    assert leftovers(deployment.home) == [], "a process with this deployment's FLWR_HOME survived"
    logs = "" if rc == 0 else deployment.logs()[-6000:]
    return DeployedRun(rc, "\n".join(lines), deployment, tmp_path / "results" / run_config["run-name"], logs)


class NodeKiller:
    """Once the server logs that the nodes told it their partitions (each in a ClientApp process
    of its own), SIGKILLs SuperNode ``index`` and everything under it (SuperExec, ClientApp) as
    soon as its next ClientApp, round 1's training, runs: a device that dies mid-training
    without telling the SuperLink."""

    def __init__(self, index: int):
        self.index = index
        self.thread: threading.Thread | None = None
        self.killed: dict[int, tuple[str, str]] = {}
        self.done = threading.Event()  # set once the node's tree is killed

    def __call__(self, deployment: LocalDeployment, line: str) -> None:
        if self.thread is None and "nodes for their partition in" in line:
            node = deployment.supernodes[self.index]
            self.thread = threading.Thread(target=self._kill, args=(node.proc.pid,), daemon=True)
            self.thread.start()

    def _kill(self, pid: int) -> None:
        before = set(descendants([pid]))
        deadline = time.monotonic() + 60  # else kill it anyway, between tasks
        while time.monotonic() < deadline:
            tree = descendants([pid])
            if any(name.startswith("flwr-clientapp") and p not in before for p, (_, name) in tree.items()):
                time.sleep(0.5)
                break
            time.sleep(0.1)
        self.killed = descendants([pid])
        for child in self.killed:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.done.set()


def run_killed(small_mnist: Path, tmp_path: Path, certs: TLS, killer: NodeKiller) -> DeployedRun:
    """Two rounds of SCAFFOLD (client state in context.state) on three TLS SuperNodes with
    MNIST partitions; ``killer`` kills node 2 while it trains in round 1."""
    nodes = [Node({"partition-id": i, "num-partitions": 20}) for i in range(3)]
    return deploy_and_run(
        tmp_path, certs, nodes,
        {"strategy": STATEFUL, "num-server-rounds": 2, "min-available-clients": 3, "run-name": "kill"},
        small_mnist, watch=killer,
    )


def run_mixed(small_mnist: Path, tmp_path: Path, certs: TLS, after: tuple[Future, NodeKiller]) -> DeployedRun:
    """One round of FedAvg with SuperNode authentication: a node reading its own parquet file,
    one a partition, one with a data-path that does not exist, and an unregistered one.

    Starts once the killed deployment (``after``) has killed its node (or ended), to run while
    that deployment waits for Flower's heartbeat timeout and not in its busy start-up."""
    killed, killer = after
    deadline = time.monotonic() + TIMEOUT
    while not (killer.done.wait(1) or killed.done()) and time.monotonic() < deadline:
        pass
    table = pq.read_table(small_mnist / "mnist" / "train.parquet")
    rows = np.random.default_rng(0).choice(table.num_rows, size=256, replace=False)
    own = tmp_path / "node-data" / "mnist-own.parquet"
    own.parent.mkdir()
    pq.write_table(table.take(rows), own)
    nodes = [Node({"data-path": str(own)}, "own"), Node({"partition-id": 3, "num-partitions": 20}, "part"),
             Node({"data-path": str(missing_path(tmp_path))}, "bad"),
             Node({"partition-id": 4, "num-partitions": 20}, "stranger", registered=False)]
    return deploy_and_run(
        tmp_path, certs, nodes,
        {"strategy": "fedavg", "num-server-rounds": 1, "min-available-clients": 3,
         "min-fit-clients": 3, "run-name": "mixed"},
        small_mnist, auth=True,
    )


def missing_path(tmp_path: Path) -> Path:
    """The bad node's data-path: a file that does not exist."""
    return tmp_path / "node-data" / "does-not-exist.parquet"


@dataclass
class DeploymentRuns:
    """The futures of the two deployments (``DeployedRun`` each) and the killed one's killer."""
    killed: Future
    killer: NodeKiller
    mixed: Future


# -------------------------------------------------------------------------------- the results page
def load_make_results():
    """scripts/make_results.py as a module (a script, not a package: loaded from its file), a
    fresh copy at each call."""
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "scripts" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def non_split_files(out: Path) -> list[str]:
    """The names in ``out``: a ``--check`` writes nothing there (no run, no record, no result,
    not even the pictures of its splits, which go to a temporary folder: runner/checks.py
    ``check_folder``), so this list is what it must leave unchanged."""
    return sorted(p.name for p in out.iterdir()) if out.exists() else []


def write_run(runs: Path, method: str, seed: int, accs: list[float], finished: bool = True,
              stopped: str | None = None, min_class: float | None = None, folder: str = "") -> None:
    """A fabricated run folder ``runs / folder`` (default ``<method>-seed<seed>``): metrics.csv
    with one row per test accuracy of ``accs`` (round r's minimum class accuracy ``min_class`` +
    r / 100 when given) and, when ``finished``, a summary.json (``stopped`` as given)."""
    d = runs / (folder or f"{method}-seed{seed}")
    d.mkdir(parents=True)
    with (d / "metrics.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "test_accuracy", "test_loss", "train_loss", "num_clients", "round_seconds",
                    "min_class_accuracy"])
        for r, a in enumerate(accs, 1):
            w.writerow([r, a, 1.0 - a, 0.5, 10, 1.0, "" if min_class is None else min_class + r / 100])
    if finished:
        (d / "summary.json").write_text(json.dumps({
            "config": {"strategy": method, "seed": seed}, "rounds": len(accs),
            "final_accuracy": accs[-1], "best_accuracy": max(accs), "final_loss": 0.1,
            "total_seconds": 5.0, "stopped": stopped, "data_source": "/machine/data",
        }))


TOY = """
name = "toy"
paper = "Toy (Doe et al. 2020), Table 2, column X: test accuracy"
description = "a toy comparison"
reduction = "3 rounds instead of 300"
findings = "fedprox seed 1 diverged"
strategies = ["fedavg", "fedprox", "fedsol", "fedntd"]
seeds = [0, 1]
clients = 10
target-accuracy = 0.5

[run-config]
num-server-rounds = 3

[paper-results]
fedavg = 0.56
fedprox = 0.60
fedntd = 0.63
fedsol = 0.64

# how the rows' settings were chosen: one known protocol for all, so their claims are counted
[chosen-by]
all = "fixed from the toy paper"
"""


GHOST = """
name = "ghost"
paper = "Ghost (Poe et al. 2022), Table 3"
strategies = ["fedavg", "fedgam"]
seeds = [0, 1]
clients = 10
target-accuracy = 0.9

[paper-results]
fedavg = 0.95
fedgam = 0.98

# how the rows' settings were chosen: one known protocol for all, so their claims are counted
[chosen-by]
all = "fixed from the toy paper"
"""


def section(text: str, name: str) -> str:
    """The section ``## name`` of the generated page ``text``, up to the next ``## ``."""
    return text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]


def row(sec: str, method: str) -> list[str]:
    """The cells of ``method``'s row (its name bold or not) of the table in ``sec``."""
    for line in sec.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0].strip("*") == method:
            return cells
    raise AssertionError(f"no row for {method}")
