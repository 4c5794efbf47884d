"""A broker as a child process of this one, on 127.0.0.1, with its own config, data dir and log file.

For scripts, benchmarks and tests: ``BrokerProcess(workdir, small_config(data_dir)).start()`` runs
``python -m metaq.server`` and returns once its log says "ready on"; ``stop()`` / ``kill()`` act
on its own PID. ``rmq_config`` adds a remoting port.
"""

import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import time

import yaml

from metaq.client.raw import TextClient

__all__ = ["BrokerProcess", "small_config", "rmq_config", "ns_of", "free_port", "free_port_run", "read_text"]

READY_RE = re.compile(r"ready on ([0-9.]+):(\d+)")


#: Where ``free_port`` looks when the kernel's ephemeral range cannot be read (Linux's default starts at 32768).
FIXED_PORTS = (20000, 32768)
#: Ports handed out by this process, oldest first (a dict kept in insertion order).
_handed_out = {}


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return FIXED_PORTS[1]


def _slice(low, high):
    """This process's part of ``low .. high`` among the test run's side-by-side workers (the whole when none)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return low, high
    index, count = int(worker[2:]) % int(count), int(count)
    width = (high - low) // count
    return low + index * width, low + (index + 1) * width


def free_port(host="127.0.0.1"):
    """A port nobody listens on right now, for a server that must keep its port across restarts.

    Not one the kernel picks: a port from its ephemeral range (what binding port 0 gives) may be handed to any
    outgoing connection or port-0 server between our check and the server's bind, or while the server is down
    between a kill and a restart. So the port comes from below that range (``FIXED_PORTS``), is checked bindable,
    and is never handed out twice by this process. Processes of one test run side by side (pytest-xdist's
    ``PYTEST_XDIST_WORKER`` ``gwN`` of ``PYTEST_XDIST_WORKER_COUNT``) each take their own slice of that range: one
    process's check cannot see a port another has handed out and not yet bound."""
    return free_port_run(1, host)


def free_port_run(count, host="127.0.0.1"):
    """The first of ``count`` consecutive ports each of which ``free_port`` could hand out (for a local cluster whose
    members' ports follow a base port), all within this process's slice and all handed out at once: none was handed
    out before (a server of an earlier test, down for a restart, comes back on its own port) and none is after.

    A long test run can hand out its whole slice: then the older half of what it handed out is given again (the
    servers of tests long ended; one still listening is passed over by the bind check), never the newer half."""
    low, high = _slice(FIXED_PORTS[0], min(FIXED_PORTS[1], _ephemeral_low()))
    base = _first_free_run(count, host, low, high)
    if base is None:
        for port in list(_handed_out)[: len(_handed_out) // 2]:
            del _handed_out[port]
        base = _first_free_run(count, host, low, high)
    if base is None:
        raise RuntimeError("no free run of %d ports in %d..%d" % (count, low, high))
    _handed_out.update(dict.fromkeys(range(base, base + count)))
    return base


def _first_free_run(count, host, low, high):
    span = high - count + 1 - low
    start = random.Random().randrange(low, high - count + 1)
    for step in range(span):  # every base once, from a random one: a slice fragmented by a long run still serves
        base = low + (start - low + step) % span
        run = range(base, base + count)
        if not any(port in _handed_out for port in run) and all(_bindable(host, port) for port in run):
            return base
    return None


def _bindable(host, port):
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


#: The ``store:`` settings small_config sets (small segments and index files, frequent checkpoints).
SMALL_STORE = {"segment_size": 1 << 20, "index_file_units": 4096, "key_index_slots": 4096,
               "key_index_entries": 16384, "flush": "sync", "checkpoint_interval_ms": 200,
               # the host's disk is not the broker's to judge here: at the default 75 % a busy test machine
               # made retention delete a test's segments early; disk tests set their own ratios
               "disk_warn_ratio": 1.0, "disk_danger_ratio": 1.0}


def small_config(data_dir, **sections):
    """A broker config with small segments and index files, every topic allowed (tests, benchmarks)."""
    cfg = {
        "broker": {"id": 7, "host": "127.0.0.1", "port": 0, "data_dir": str(data_dir)},
        "store": dict(SMALL_STORE),
        "limits": {"max_body_bytes": 256 * 1024},
        "topics": [{"name": "t*", "partitions": 4}, {"name": "*", "partitions": 2}],
    }
    for name, values in sections.items():
        if isinstance(values, dict):
            cfg.setdefault(name, {}).update(values)
        else:
            cfg[name] = values
    return cfg


def read_text(path, offset=0):
    """A log file's text from ``offset`` (bytes), decoded leniently; "" if it does not exist yet."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


class BrokerProcess:
    """``python -m metaq.server`` on 127.0.0.1 with its own config, data dir and log file."""

    #: Where ``client()`` connects (a broker bound to an address in a network namespace sets it to that address).
    host = "127.0.0.1"
    #: A command prefix the broker runs under (e.g. ``["ip", "netns", "exec", NS]``); it must exec the broker in
    #: place, so that ``proc.pid`` stays the broker's own.
    prefix = ()
    #: (soft, hard) RLIMIT_NOFILE the broker process starts under, set in the child before it runs the broker
    #: (None: this process's). The broker raises its soft limit itself, up to the hard one (docs/limits.md).
    nofile = None

    def __init__(self, workdir, config=None, extra_args=()):
        self.workdir = workdir
        self.config = config or small_config(os.path.join(str(workdir), "data"))
        self.config_text = None  # the file's text as written when set (a YAML form safe_dump would not write)
        self.data_dir = str(self.config["broker"]["data_dir"])
        self.config_path = os.path.join(str(workdir), "server.yaml")
        self.log_path = os.path.join(str(workdir), "broker.log")
        self.extra_args = list(extra_args)
        self.proc = None
        self.port = None

    def start(self, timeout=20.0, expect_ready=True):
        with open(self.config_path, "w") as f:
            f.write(self.config_text if self.config_text is not None else yaml.safe_dump(self.config))
        self._log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        log = open(self.log_path, "ab")
        cmd = list(self.prefix) + [sys.executable, "-m", "metaq.server", "-c", self.config_path] + self.extra_args
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(self.workdir),
                                     preexec_fn=self._child_limits if self.nofile else None)
        log.close()
        if expect_ready:
            self.port = self._wait_ready(timeout)
        return self

    def _child_limits(self):
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = READY_RE.search(self.log_text(since_start=True))
            if m:
                return int(m.group(2))
            if self.proc.poll() is not None:
                raise RuntimeError("broker exited with %s:\n%s" % (self.proc.returncode, self.log_text()))
            time.sleep(0.02)
        raise TimeoutError("broker not ready after %.0f s:\n%s" % (timeout, self.log_text()))

    def log_text(self, since_start=False):
        return read_text(self.log_path, self._log_offset if since_start else 0)

    def wait_exit(self, timeout=30.0):
        return self.proc.wait(timeout)

    def stop(self, timeout=30.0):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout)
        return self.proc.returncode if self.proc else None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def client(self, timeout=10.0):
        return TextClient(self.host, self.port, timeout)


def rmq_config(data_dir, remoting=None, **sections):
    """small_config with a remoting port (a free one, fixed so that it survives restarts)."""
    values = {"port": free_port()}
    values.update(remoting or {})
    return small_config(data_dir, remoting=values, **sections)


def ns_of(broker):
    return "127.0.0.1:%d" % broker.config["remoting"]["port"]
