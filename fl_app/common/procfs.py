"""Reading Linux's /proc: the process table, a process tree, a process's ancestors, command
line and start time, processes by environment variable and by session, memory (RSS/PSS) and listening sockets.
The one /proc walker of the ServerApp (which SuperLink runs it: ``fl_app/server/data_source.py``),
the launchers, tests and benchmarks. Elsewhere than Linux every reader finds nothing."""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path


def proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, start time, command name) for every process readable in /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        table[int(entry)] = (int(fields[1]), fields[19], comm)  # ppid, starttime, name
    return table


def descendants(pids: list[int]) -> dict[int, tuple[str, str]]:
    """Every live descendant of ``pids`` (and the pids themselves): pid -> (start time, name)."""
    table = proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, tuple[str, str]] = {}
    stack = [p for p in pids if p in table]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found[pid] = table[pid][1:]
        stack.extend(children.get(pid, []))
    return found


def _same_process_alive(pid: int, start: str) -> bool:
    """True if ``pid`` still runs (not a zombie) and is the process first seen (no reused pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == start and fields[0] != "Z"


def alive(seen: dict[int, tuple[str, str]]) -> list[int]:
    """The PIDs of ``seen`` (pid -> (start time, name)) that still run."""
    return [pid for pid, (start, _) in seen.items() if _same_process_alive(pid, start)]


def processes_with_env(name: str, value: str) -> list[int]:
    """PIDs (but this one) whose environment has ``name=value`` (Ray workers and SuperExecs
    inherit a launcher's FLWR_HOME)."""
    return processes_with_any_env([(name, value)])


def processes_with_any_env(entries: list[tuple[str, str]]) -> list[int]:
    """PIDs (but this one) whose environment has one of ``entries`` (``(name, value)`` pairs).

    A process that renamed itself with setproctitle (Ray's ``ray::DashboardAgent``,
    ``ray::RuntimeEnvAgent``, ``ray::IDLE`` workers) has had the start of its environment
    block overwritten with zeros, and /proc shows only the entries after that point: which
    ones survive depends on the length of its command line, so such a process may lack any of
    them. ``sessions`` finds those by their session instead."""
    needles = {f"{name}={value}".encode() for name, value in entries}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needles.intersection(env):
            found.append(int(proc.name))
    return found


def sessions() -> dict[int, int]:
    """pid -> session id of every live process readable in /proc (zombies left out: they
    cannot be stopped, only reaped by their parent)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None and fields[0] != "Z":
            table[int(entry)] = int(fields[3])  # state, ppid, pgrp, session
    return table


def environ_of(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with ({} when it is gone or not readable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)
    return dict(pairs)


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in KiB; (0, 0) if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            rss = pss = 0
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
            return rss, pss
    except OSError:
        return 0, 0


def _listening_by_inode() -> dict[str, tuple[str, int]]:
    """socket inode -> (local address, port) of every listening TCP socket (IPv4 and IPv6) in
    this network namespace, from /proc/net/tcp and /proc/net/tcp6; an IPv4-mapped IPv6
    address (``::ffff:127.0.0.1``) is given in its IPv4 form."""
    found = {}
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr)  # the kernel prints each 32-bit word in host byte order
            words = [raw[i:i + 4] for i in range(0, width, 4)]
            packed = b"".join(w[::-1] if sys.byteorder == "little" else w for w in words)
            address = ipaddress.ip_address(packed)
            address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:127.0.0.1 is 127.0.0.1
            found[fields[9]] = (str(address), int(hex_port, 16))
    return found


def listening_sockets(pids: list[int]) -> list[tuple[int, str, str, int]]:
    """(pid, command name, local address, port) of every listening TCP socket that one of
    ``pids`` holds open (its /proc/<pid>/fd links ``socket:[inode]``); a process that is
    gone or not readable is skipped."""
    by_inode = _listening_by_inode()
    names = proc_table()
    found = []
    for pid in pids:
        for link in _fd_links(pid):
            inode = link[len("socket:["):-1] if link.startswith("socket:[") else None
            if inode in by_inode:
                found.append((pid, names.get(pid, (0, "", "?"))[2], *by_inode[inode]))
    return found


def _fd_links(pid: int) -> list[str]:
    """What each open descriptor of ``pid`` points at (``socket:[inode]`` for a socket); a
    descriptor closed while it is read is skipped, a process gone or not readable has none."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    links = []
    for fd in fds:
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return links


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after ``pid (comm)``: state, ppid, ... (None when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def ancestors(pid: int) -> list[int]:
    """The parent of ``pid``, its parent, ... up to (not including) PID 1 or the first unreadable one."""
    found: list[int] = []
    fields = _stat_fields(pid)
    while fields is not None and int(fields[1]) > 1 and int(fields[1]) not in found:
        found.append(int(fields[1]))
        fields = _stat_fields(found[-1])
    return found


def command_line(pid: int) -> list[str]:
    """The arguments ``pid`` was started with ([] when it is gone or not readable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def started_at(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the epoch (None when it is gone): the boot time
    plus its start time in clock ticks since boot."""
    fields = _stat_fields(pid)
    try:
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration):
        return None
    return None if fields is None else boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
