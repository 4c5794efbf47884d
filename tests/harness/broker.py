"""Real broker processes and a raw-socket text client for integration tests."""

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time

import yaml

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload, iter_records
from metaq.protocol.text import CLOSED, NEED_DATA, TextParser, serialize

READY_RE = re.compile(r"ready on ([0-9.]+):(\d+)")


def free_port(host="127.0.0.1"):
    """A port nobody listens on right now (for servers that must keep their port across restarts)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def url_of(broker):
    """``meta://127.0.0.1:<port>`` of a running BrokerProcess."""
    return "meta://127.0.0.1:%d" % broker.port


def wait_for(predicate, timeout=15.0, what="condition", interval=0.05):
    """The first truthy value of ``predicate()`` within ``timeout`` s; AssertionError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError("not within %.0f s: %s" % (timeout, what() if callable(what) else what))
        time.sleep(interval)


def small_config(data_dir, **sections):
    """A config for tests: small segments and index files, every topic allowed."""
    cfg = {
        "broker": {"id": 7, "host": "127.0.0.1", "port": 0, "data_dir": str(data_dir)},
        "store": {"segment_size": 1 << 20, "index_file_units": 4096, "flush": "sync",
                  "checkpoint_interval_ms": 200},
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

    def __init__(self, workdir, config=None, extra_args=()):
        self.workdir = workdir
        self.config = config or small_config(os.path.join(str(workdir), "data"))
        self.data_dir = str(self.config["broker"]["data_dir"])
        self.config_path = os.path.join(str(workdir), "server.yaml")
        self.log_path = os.path.join(str(workdir), "broker.log")
        self.extra_args = list(extra_args)
        self.proc = None
        self.port = None

    def start(self, timeout=20.0, expect_ready=True):
        with open(self.config_path, "w") as f:
            yaml.safe_dump(self.config, f)
        self._log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        log = open(self.log_path, "ab")
        cmd = [sys.executable, "-m", "metaq.server", "-c", self.config_path] + self.extra_args
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(self.workdir))
        log.close()
        if expect_ready:
            self.port = self._wait_ready(timeout)
        return self

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
        return TextClient("127.0.0.1", self.port, timeout)


class TextClient:
    """A raw-socket client that speaks the text protocol through our sans-IO parser."""

    def __init__(self, host, port, timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = TextParser(max_body=64 << 20)
        self._opaque = itertools.count(1)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def opaque(self):
        return next(self._opaque)

    def send(self, data):
        self.sock.sendall(data)

    def read_event(self):
        """The next reply (Result or Value), or CLOSED when the broker closed the connection."""
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                return event
            data = self.sock.recv(1 << 20)
            self.parser.receive_data(data)

    def call(self, event):
        self.send(serialize(event))
        return self.read_event()

    def put(self, topic, payload, partition=-1, attribute=None, checksum=True):
        flag, data = encode_payload(payload, attribute)
        crc = metaq_checksum(data) if checksum else -1
        return self.call(ev.Put(topic, partition, flag, data, self.opaque(), crc))

    def put_ok(self, topic, payload, partition=-1, attribute=None):
        """Put and return (msg_id, partition, offset); fail the test on anything but 200."""
        r = self.put(topic, payload, partition, attribute)
        assert isinstance(r, ev.Result) and r.code == 200, r
        msg_id, part, offset = (int(x) for x in r.body.split())
        return msg_id, part, offset

    def get(self, topic, partition, offset, max_size=1 << 20, group="g", max_wait_ms=None):
        return self.call(ev.Get(topic, group, partition, offset, max_size, self.opaque(), max_wait_ms))

    def get_records(self, topic, partition, offset, max_size=1 << 20):
        r = self.get(topic, partition, offset, max_size)
        if not isinstance(r, ev.Value):
            return r
        return [rec for rec, _end in iter_records(r.body)]

    def stats(self, item=None):
        r = self.call(ev.Stats(item, self.opaque()))
        assert r.code == 200, r
        return r.body.decode()

    def stats_dict(self, item=None):
        lines = self.stats(item).split("\r\n")
        assert lines[0] == "STATS" and lines[-2] == "END" and lines[-1] == "", lines
        return dict(line.split(" ", 1) for line in lines[1:-2])


def consume_all(client, topic, partition, start=0, max_size=1 << 20):
    """Every record of a partition from ``start`` to its end, following 301s."""
    out, offset = [], start
    while True:
        r = client.get(topic, partition, offset, max_size)
        if isinstance(r, ev.Result):
            if r.code == 404:
                return out
            if r.code == 301:
                offset = int(r.body)
                continue
            raise AssertionError(r)
        recs = [rec for rec, _ in iter_records(r.body)]
        assert recs, r
        out.extend(recs)
        offset += len(recs)


__all__ = ["BrokerProcess", "TextClient", "small_config", "consume_all", "CLOSED", "free_port", "url_of",
           "wait_for"]
