"""Running a sweep's (label, seed) runs several at a time (``run_simulation.py --parallel N``).

Each of the N workers is a ``LocalSimulation`` of its own: its own SuperLink and SuperExec on
free ports, its own ``FLWR_HOME``, its own Ray (private ``RAY_TMPDIR``) and its own watchdog,
which also holds the results folder's lock. One SuperLink running several runs at once was not
chosen: Flower's simulation starts a Ray per run in any case (``flwr-simulation`` calls
``ray.init()`` and shuts it down at the run's end), so sharing the SuperLink would save N - 1
SuperLink starts per sweep, not per run (10-13 s each, measured on a 2-core machine at load
average 28), while it would put every run under one ``FLWR_HOME``, the marker by which a
failed run's or a dead runner's processes are found and stopped (``stop_marked``): stopping
one run would stop them all, and two runs' Rays would share one temp folder. Separate workers
keep every guarantee of the sequential runner per worker.

What this module decides, without starting anything (so it is unit-tested without Flower):

- ``default_workers``: how many runs the machine holds at once: a run's fixed processes
  (SuperLink, SuperExec, the ServerApp, Ray's daemons) and at least one client want about
  ``CPUS_PER_RUN`` cores, a run's Ray about ``MEMORY_PER_RUN`` of memory, and GPU clients no
  more than the GPUs hold (each client asks for its fraction); never more than the runs to
  launch, never oversubscribed: a 2-core machine runs one at a time.
- ``split``: each worker's share of the machine: the CPUs its Ray may schedule (Ray's
  ``num_cpus``, Flower's ``init-args-num-cpus``), so N workers' clients together use the cores
  one run alone would (threads per client stay ``--cpus-per-client``: a client's numbers do not
  depend on N); GPUs by device (``CUDA_VISIBLE_DEVICES``) when there are at least N, else each
  client's GPU fraction multiplied by N, so the N runs together put as many clients on the GPU
  as one run alone.
- ``run_pool``: the scheduler. Jobs are taken in order by whichever worker is free; each job's
  result is kept at its index (the caller merges them in the sweep's order, so comparison.csv is
  written from the same runs in the same order as sequentially); a job that raises is recorded
  and the worker goes on; a worker that cannot start leaves its jobs to the others (when none
  starts, the first error is raised, as the sequential runner raises it); Ctrl-C or SIGTERM in
  the calling thread closes every worker (each stops its processes) before the exception goes on.
  One worker runs in the calling thread, with no threads at all: the sequential runner.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from fl_app.config import ConfigError

CPUS_PER_RUN = 4  # a run's SuperLink, SuperExec, ServerApp and Ray daemons, and room for clients
MEMORY_PER_RUN = 3 * 2**30  # a run's Ray (GCS, raylet, workers with torch): about 1-3 GB on CPU

_OUTPUT = threading.Lock()


def say(text: str, file=None) -> None:
    """Print ``text`` (one or several lines) whole and flushed: the workers' messages never
    interleave within one (``file``: ``sys.stdout`` at the time of the call by default)."""
    with _OUTPUT:
        print(text, file=file or sys.stdout, flush=True)


J = TypeVar("J")
W = TypeVar("W")
R = TypeVar("R")


@dataclass(frozen=True)
class Machine:
    """What runs can share: cores this process may use (its CPU affinity, within a
    container's CPU quota), CUDA GPUs torch sees, memory available now (bytes; None where
    /proc/meminfo cannot be read)."""

    cores: int
    gpus: int = 0
    memory: int | None = None

    @classmethod
    def here(cls) -> Machine:
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        quota = cpu_quota()
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls(cores=min(cores, quota) if quota else cores, gpus=gpus, memory=available_memory())


def cpu_quota(root: str = "/sys/fs/cgroup") -> int | None:
    """The cores a cgroup CPU quota allows (rounded up; v2 ``cpu.max``, else v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), None without a quota: a container's
    affinity can list every core of the host while its quota allows a few."""
    for quota_file, period_file in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            text = Path(root, quota_file).read_text().split()
            quota, period = (text[0], text[1]) if period_file is None else (
                text[0], Path(root, period_file).read_text().strip())
            if quota in ("max", "-1"):
                return None
            return max(1, math.ceil(int(quota) / int(period)))
        except (OSError, ValueError, IndexError):
            continue
    return None


def available_memory() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes, None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_workers(parallel: int | None) -> None:
    """``--parallel`` must be a whole number >= 1 (None: chosen from the machine)."""
    if parallel is not None and parallel < 1:
        raise ConfigError(f"--parallel = {parallel} is invalid: must be >= 1 (runs at a time; leave it out to"
                          " choose from the machine's cores, GPUs and memory)")


def default_workers(machine: Machine, runs: int, cpus_per_client: float = 1.0, gpus_per_client: float = 0.0,
                    cluster: bool = False) -> int:
    """How many of ``runs`` to run at once on ``machine`` (see the module docstring); 1 on a
    Ray cluster (``cluster``: its scheduler shares it among runs; ask with --parallel)."""
    if cluster or runs <= 1:
        return 1
    n = machine.cores // max(CPUS_PER_RUN, 2 * math.ceil(cpus_per_client))
    if machine.memory is not None:
        n = min(n, machine.memory // MEMORY_PER_RUN)
    if machine.gpus and gpus_per_client > 0:
        n = min(n, int(machine.gpus / gpus_per_client + 1e-9))  # each run at least one client on a GPU
    return max(1, min(runs, n))


@dataclass(frozen=True)
class Share:
    """One worker's part of the machine. ``ray_cpus`` / ``ray_gpus``: its Ray's ``num_cpus`` /
    ``num_gpus`` (None: Ray counts the machine itself, as a run alone does); ``cuda_devices``:
    its ``CUDA_VISIBLE_DEVICES`` (None: unchanged); ``gpus_per_client``: what each of its
    clients asks Ray for."""

    ray_cpus: int | None = None
    ray_gpus: int | None = None
    cuda_devices: str | None = None
    gpus_per_client: float = 0.0

    def describe(self) -> str:
        parts = [f"{self.ray_cpus} CPUs" if self.ray_cpus is not None else "all CPUs"]
        if self.cuda_devices is not None:
            parts.append(f"GPU {self.cuda_devices}")
        if self.gpus_per_client:
            parts.append(f"{self.gpus_per_client:g} GPU per client")
        return ", ".join(parts)


def split(n: int, machine: Machine, cpus_per_client: float = 1.0, gpus_per_client: float = 0.0,
          cluster: bool = False, visible: str | None = None) -> list[Share]:
    """The ``n`` workers' shares (see the module docstring). One worker, or a Ray cluster
    (whose resources its own scheduler shares among the runs), gets what a run alone gets.
    ``visible``: this process's ``CUDA_VISIBLE_DEVICES``, which numbers torch's devices: a
    worker's devices are named as in it."""
    if n == 1 or cluster:
        return [Share(gpus_per_client=gpus_per_client)] * n
    least = max(1, math.ceil(cpus_per_client))  # a share must hold one client
    cpus = [max(least, machine.cores // n + (1 if i < machine.cores % n else 0)) for i in range(n)]
    if machine.gpus >= n:  # devices of its own: the run is as alone on them
        names = [d.strip() for d in visible.split(",")] if visible else []
        ids = names[:machine.gpus] if len(names) >= machine.gpus else [str(i) for i in range(machine.gpus)]
        chunks = [ids[i * len(ids) // n:(i + 1) * len(ids) // n] for i in range(n)]
        return [Share(c, len(ch), ",".join(ch), gpus_per_client) for c, ch in zip(cpus, chunks)]
    if machine.gpus:  # the GPUs shared: each client asks for n times its fraction
        return [Share(c, machine.gpus, None, min(1.0, gpus_per_client * n)) for c in cpus]
    return [Share(c, None, None, gpus_per_client) for c in cpus]


class Failed:
    """A job whose ``work`` raised: the exception, kept at the job's index."""

    def __init__(self, error: BaseException):
        self.error = error

    def __repr__(self) -> str:
        return f"Failed({self.error!r})"


class Pool(Generic[J, W, R]):
    """Runs ``work(worker, job)`` for every job on ``len(shares)`` workers, each made by
    ``start(share)`` and ended by ``stop(worker)`` (once, whoever asks first). ``results()``
    returns, in job order, what each ``work`` returned or ``Failed`` for one that raised.
    ``stopping`` is set once the pool is being stopped (Ctrl-C): ``work`` may look at it to
    leave a run's result unreported."""

    def __init__(self, jobs: Sequence[J], shares: Sequence[object], start: Callable[[object], W],
                 stop: Callable[[W], None], work: Callable[[W, J], R]):
        if not shares:
            raise ValueError("a pool needs at least one worker")
        self.jobs, self.shares = list(jobs), list(shares)
        self.start, self.stop, self.work = start, stop, work
        self.stopping = threading.Event()
        self._queue = deque(range(len(self.jobs)))
        self._results: list[R | Failed | None] = [None] * len(self.jobs)
        self._lock = threading.Lock()
        self._workers: dict[int, W] = {}
        self._stopped: set[int] = set()
        self._start_errors: list[BaseException] = []

    def _take(self) -> int | None:
        with self._lock:
            if self.stopping.is_set() or not self._queue:
                return None
            return self._queue.popleft()

    def _stop(self, k: int) -> None:
        with self._lock:
            if k in self._stopped or k not in self._workers:
                return
            self._stopped.add(k)
            worker = self._workers[k]
        self.stop(worker)

    def _serve(self, k: int, worker: W, catch: bool) -> None:
        try:
            while (j := self._take()) is not None:
                try:
                    self._results[j] = self.work(worker, self.jobs[j])
                except BaseException as exc:  # one run's failure stops neither this worker nor the others
                    if not catch:  # (in a worker thread: Ctrl-C only ever reaches the main thread)
                        raise
                    self._results[j] = Failed(exc)
        finally:
            self._stop(k)

    def _thread(self, k: int) -> None:
        try:
            worker = self.start(self.shares[k])
        except Exception as exc:  # its jobs go to the other workers
            with self._lock:
                self._start_errors.append(exc)
            return
        with self._lock:
            self._workers[k] = worker
        if self.stopping.is_set():
            self._stop(k)
            return
        self._serve(k, worker, catch=True)

    def results(self) -> list[R | Failed]:
        """Every job's result or ``Failed``, in job order, once all are done (see the class)."""
        if len(self.shares) == 1:  # the sequential runner: no thread, every exception as it comes
            self._workers[0] = self.start(self.shares[0])
            self._serve(0, self._workers[0], catch=False)
            return list(self._results)
        threads = [threading.Thread(target=self._thread, args=(k,), name=f"fl-drift-worker-{k}", daemon=True)
                   for k in range(len(self.shares))]
        try:  # starting the threads is inside: a Ctrl-C while they start stops those already started
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        except BaseException:  # Ctrl-C, SIGTERM (sys.exit): every worker stops its processes, at once
            self.stop_all()
            for t in threads:
                if t.ident is not None:  # started
                    t.join(60)
            raise
        if self._queue and self._start_errors:  # no worker started: fail as one would have
            raise self._start_errors[0]
        return list(self._results)

    def stop_all(self) -> None:
        """Take no further job and stop every started worker, all at the same time; returns
        when they are stopped (threads not daemonic: an interpreter that exits meanwhile
        waits for them)."""
        self.stopping.set()
        with self._lock:
            started = list(self._workers)
        closers = [threading.Thread(target=self._stop, args=(k,), name=f"fl-drift-stop-{k}") for k in started]
        for t in closers:
            t.start()
        for t in closers:
            t.join()


def run_pool(jobs: Sequence[J], shares: Sequence[object], start: Callable[[object], W],
             stop: Callable[[W], None], work: Callable[[W, J], R]) -> list[R | Failed]:
    """``Pool(...).results()``: each job's result (or ``Failed``) in job order."""
    return Pool(jobs, shares, start, stop, work).results()
