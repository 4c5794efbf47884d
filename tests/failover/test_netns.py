"""The network namespace harness (tests/harness/netns.py) on real namespaces, veth pairs and sockets: a topology is
made and deleted (also when the test fails inside it), a cut is silent both ways or one way only, a flapping link
comes back, a process runs inside a node by its own PID. Skipped, with the reason, where namespaces cannot be
made (not root, no ``ip netns``)."""

import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.harness import netns

pytestmark = [pytest.mark.integration, pytest.mark.root]

PORT = 9000


@pytest.fixture
def topo():
    why = netns.unavailable()
    if why:
        pytest.skip("network namespaces unavailable: " + why)
    with netns.Topology(["a", "b", "c"]) as t:
        yield t


def namespaces():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def udp_gets(topo, src, dst, timeout=0.5):
    """Whether a datagram ``src`` sends to ``dst`` arrives (each end a thread inside its node)."""
    got, ready = [], threading.Event()

    def receive():
        with topo.inside(dst) as address, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((address, PORT))
            s.settimeout(timeout)
            ready.set()
            try:
                got.append(s.recv(100))
            except socket.timeout:
                pass

    t = threading.Thread(target=receive)
    t.start()
    ready.wait(5)
    with topo.inside(src), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"hello", (topo.addresses[dst], PORT))
    t.join(5)
    return got == [b"hello"]


def test_a_topology_is_made_for_the_test_and_deleted_even_when_it_fails():
    why = netns.unavailable()
    if why:
        pytest.skip("network namespaces unavailable: " + why)
    topo = netns.Topology(["a", "b"])
    with pytest.raises(RuntimeError, match="inside"):
        with topo:
            listed = namespaces()
            assert all(ns in listed for ns in list(topo.namespaces.values()) + [topo.bridge_ns])
            with topo.inside("a") as address:
                assert address == topo.addresses["a"]
                raise RuntimeError("a failure inside")
    listed = namespaces()
    assert not [ns for ns in list(topo.namespaces.values()) + [topo.bridge_ns] if ns in listed]
    # the calling thread is back where it was: the namespaces' addresses are not ours
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        with pytest.raises(OSError):
            s.bind((topo.addresses["a"], PORT))


def test_a_cut_is_silent_both_ways_and_a_one_way_cut_only_one_way(topo):
    assert udp_gets(topo, "a", "b") and udp_gets(topo, "b", "a")
    cut = netns.Cut(topo, ["a"], ["b"])
    t = cut.inject()
    assert abs(time.monotonic() - t) < 5 and topo.dropped("b") == ["a"] and topo.dropped("a") == ["b"]
    assert not udp_gets(topo, "a", "b") and not udp_gets(topo, "b", "a")
    assert udp_gets(topo, "c", "b") and udp_gets(topo, "a", "c")  # the rest of the network is untouched
    with topo.inside("a"):  # a TCP connect is not refused, it times out: nothing comes back
        with pytest.raises(socket.timeout):
            socket.create_connection((topo.addresses["b"], PORT), timeout=1.0)
    assert cut.heal() >= t and topo.dropped("b") == [] and udp_gets(topo, "a", "b")
    one = netns.Cut(topo, ["a"], ["b"], one_way=True)
    one.inject()
    assert not udp_gets(topo, "a", "b") and udp_gets(topo, "b", "a")
    one.heal()
    assert udp_gets(topo, "a", "b")


def test_a_flapping_link_switches_until_healed_and_stays_up_after(topo):
    flap = netns.Flap(topo, ["a"], ["b"], 0.2)
    flap.inject()
    time.sleep(1.1)
    flap.heal()
    assert flap.flips >= 4 and not flap.cut.active and topo.dropped("b") == []
    assert udp_gets(topo, "a", "b")


def test_a_process_runs_inside_its_node_under_its_own_pid(topo):
    code = ("import socket,sys;s=socket.create_server((sys.argv[1],%d));print('up',flush=True);"
            "c,_=s.accept();c.sendall(b'hi');c.close()" % PORT)
    proc = subprocess.Popen(topo.prefix("b") + [sys.executable, "-c", code, topo.addresses["b"]],
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"
        with open("/proc/%d/cmdline" % proc.pid, "rb") as f:
            assert f.read().startswith(sys.executable.encode())  # ip netns exec ran it in place
        with topo.inside("c"), socket.create_connection((topo.addresses["b"], PORT), timeout=5) as s:
            assert s.recv(10) == b"hi"
    finally:
        proc.kill()
        proc.wait(10)


def test_netem_is_used_where_the_kernel_has_it(topo):
    why = netns.netem_unavailable()
    if why:
        pytest.skip(why)
    loss = netns.Netem(topo, "a", loss=100)
    loss.inject()
    assert not udp_gets(topo, "a", "b") and udp_gets(topo, "b", "a")  # what a sends is lost, not what it gets
    loss.heal()
    assert udp_gets(topo, "a", "b")
