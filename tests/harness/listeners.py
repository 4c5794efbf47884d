"""The TCP ports a process and its descendants listen on, read from /proc (Linux): which address each is bound to.

``listening(pid)`` answers ``{(address, port)}`` for every listening socket that ``pid`` or a process below it
holds, so a test can check that a server it ran (a Spark driver's JVM, started by PySpark as a child) binds
loopback only."""

import ipaddress
import os
import socket

#: /proc/net/tcp's state of a listening socket.
TCP_LISTEN = "0A"


def descendants(pid):
    """``pid`` and every live process below it."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _socket_inodes(pid):
    inodes = set()
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_address, family):
    raw = bytes.fromhex(hex_address)
    if family == socket.AF_INET:
        return socket.inet_ntop(family, raw[::-1])
    return socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listening(pid):
    """``{(address, port)}`` of the TCP sockets ``pid`` and its descendants listen on (IPv4 and IPv6)."""
    inodes = set()
    for p in descendants(pid):
        inodes |= _socket_inodes(p)
    found = set()
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(path) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == TCP_LISTEN and fields[9] in inodes:
                host, port = fields[1].split(":")
                found.add((_address(host, family), int(port, 16)))
    return found


def is_loopback(address):
    """True for 127.0.0.0/8, ::1 and an IPv4-mapped loopback address."""
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def run_watching(cmd, timeout, interval=0.2, **popen):
    """Run ``cmd`` to its end (killed past ``timeout`` seconds, which fails), sampling what its process tree listens
    on every ``interval`` s: ``(returncode, stdout, stderr, {(address, port)})``."""
    import subprocess
    import tempfile
    import time

    seen = set()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, **popen)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise AssertionError("%s did not end within %.0f s" % (cmd, timeout))
                seen |= listening(proc.pid)
                time.sleep(interval)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"), seen
