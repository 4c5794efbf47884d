"""Helpers for remoting tests: a raw client over our own codec, brokers with a remoting port, the official client."""

import itertools
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from metaq.protocol.remoting import CLOSED, NEED_DATA, RemotingParser, encode_command, make_request
from tests.harness.broker import free_port, small_config

PEER = os.path.join(os.path.dirname(__file__), "rmq_peer.py")


def rmq_config(data_dir, remoting=None, **sections):
    """small_config with a remoting port (a free one, fixed so that it survives restarts)."""
    values = {"port": free_port()}
    values.update(remoting or {})
    return small_config(data_dir, remoting=values, **sections)


def ns_of(broker):
    return "127.0.0.1:%d" % broker.config["remoting"]["port"]


class RemotingClient:
    """A raw remoting connection: requests out through ``encode_command``, frames in through ``RemotingParser``."""

    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = RemotingParser(max_frame=64 << 20)
        self._opaques = itertools.count(1)
        self.pending = []  # commands read while waiting for another opaque

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data):
        self.sock.sendall(data)

    def request(self, code, ext=None, body=b"", oneway=False, version=63):
        opaque = next(self._opaques)
        self.send_raw(encode_command(make_request(code, ext, body, opaque, oneway, "CPP", version)))
        return opaque

    def read(self, timeout=10.0):
        """The next frame from the broker, or CLOSED."""
        if self.pending:
            return self.pending.pop(0)
        self.sock.settimeout(timeout)
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                return event
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            self.parser.receive_data(data)

    def response(self, opaque, timeout=10.0):
        """The response to ``opaque`` (other frames are kept for later ``read`` calls)."""
        deadline = time.monotonic() + timeout
        kept = []
        try:
            while True:
                cmd = self.read(max(0.01, deadline - time.monotonic()))
                if cmd is CLOSED or (cmd.is_response and cmd.opaque == opaque):
                    return cmd
                kept.append(cmd)
        finally:
            self.pending.extend(kept)

    def call(self, code, ext=None, body=b"", version=63, timeout=10.0):
        return self.response(self.request(code, ext, body, version=version), timeout)

    def is_closed(self, timeout=5.0):
        """True once the broker has closed the connection (nothing else may arrive first)."""
        return self.read(timeout) is CLOSED


def peer_env(home):
    os.makedirs(str(home), exist_ok=True)
    env = dict(os.environ, HOME=str(home))
    return env


def require_official_client():
    try:
        import rocketmq  # noqa: F401  (only: is it there?)
    except ImportError:
        pytest.fail("the official RocketMQ client is not installed: it is in the test extra "
                    "(make test installs it; by hand: pip install rocketmq==0.4.4)")


def start_peer(home, *args):
    """Start ``rmq_peer.py`` with ``args``; returns the Popen (stdout: JSON lines)."""
    return subprocess.Popen([sys.executable, PEER] + [str(a) for a in args], env=peer_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_peer(proc, timeout=90.0):
    """Wait for a peer; returns its JSON lines (fails the test, with its stderr, if it did not exit 0)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError("RocketMQ peer did not finish in %.0f s:\n%s\n%s" % (timeout, out[-2000:], err[-2000:]))
    assert proc.returncode == 0, "RocketMQ peer failed (%s):\n%s" % (proc.returncode, err[-4000:])
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def run_peer(home, *args, timeout=90.0):
    return finish_peer(start_peer(home, *args), timeout)


def received(lines):
    """The message lines of a consume run."""
    return [line for line in lines if "body" in line]
