"""Real network partitions for tests: network namespaces joined by veth pairs to a bridge (issue 41 point 6).

``Topology(["zk", "m0", "m1", "c"]).start()`` makes, all of it new and all of it the test's own:

* a namespace per node (``mq<run>-<node>``) with ``lo`` up and ``eth0``, one end of a veth pair, at an address
  of a private /24 (``10.241.<k>.<10+i>``: ``NodePlan``);
* one more namespace (``mq<run>-br``) holding the bridge ``br0`` and every veth's other end (``v-<node>``).

Every link is created inside the test's namespaces (``ip link add ... netns``): the host's own interfaces,
addresses and routes are never touched, and since every address lives behind the run's own bridge, two runs
at once (names carry the pid and a counter) never see each other. ``close()`` stops nothing but deletes the
namespaces (the processes started in them are the test's to stop, by their PIDs, first).

A process runs in a node with ``prefix(node)`` (``ip netns exec <ns>``) before its command, and binds
``address(node)``; the test's own threads reach the nodes from one of them with ``with topo.inside("c"):``
(``setns`` of the calling thread: threads it starts, a client library's included, stay there).

Faults, each with ``inject()`` / ``heal()`` returning ``time.monotonic()`` (for ``History.fault`` / ``heal``):

* ``Cut(topo, a, b)``: nothing from a node of ``a`` reaches one of ``b`` nor back (a silent partition: packets
  are dropped on arrival by an ``ip rule ... blackhole`` in the receiving node; only timeouts notice);
  ``one_way=True``: only ``a`` → ``b`` is dropped (asymmetric: ``b``'s packets still reach ``a``);
* ``Flap(topo, a, b, period_s)``: the same cut, on for ``period_s`` and off for ``period_s``, until healed;
* ``Netem(topo, node, loss=..., delay_ms=..., direction="out")``: ``tc netem`` on what the node sends (``out``)
  or receives (``in``): random loss, delay. Needs the kernel's netem (``netem_unavailable()`` says why not).

``unavailable()`` says why namespaces cannot be used here (not root, no ``ip``, ``ip netns add`` refused), or
None; a test skips with that reason.
"""

import contextlib
import ctypes
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
import threading
import time

__all__ = ["Topology", "NodePlan", "Cut", "Flap", "Netem", "unavailable", "netem_unavailable", "MAX_NODES"]

#: A topology has at most this many nodes (addresses .10 to .209 of its /24).
MAX_NODES = 200
#: The private range every topology takes its /24 from.
SUPERNET = ipaddress.ip_network("10.241.0.0/16")
FIRST_HOST = 10
#: A node's name: short enough for an interface name (``v-<node>``, at most 15 bytes).
NODE_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
#: Rules the faults add sit at these preferences (below the main table's 32766).
RULE_PREF = 1000
#: Each node's lookup of its local table moves here, behind them.
LOCAL_PREF = 2000
#: A flapping link's half period, seconds (low, high).
FLAP_PERIOD_S = (0.05, 30.0)
CLONE_NEWNET = 0x40000000
_counter = itertools.count(1)
_probed = {}


def _ip(*args, ns=None, check=True):
    """``ip <args>`` (``tc <args>`` when args start with "tc"), inside namespace ``ns`` when given."""
    args = list(args) if args[0] in ("ip", "tc") else ["ip"] + list(args)
    cmd = (["ip", "netns", "exec", ns] if ns else []) + args
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), proc.returncode, proc.stderr.decode().strip()))
    return proc


class NodePlan:
    """The names and addresses of one run's topology (pure: nothing is created).

    ``run``: a short token unique to this run (default: the pid and a counter); ``subnet``: the third octet of
    ``10.241.<subnet>.0/24`` (default: drawn from ``run``; any is safe, the /24 is behind the run's own bridge)."""

    def __init__(self, nodes, run=None, subnet=None):
        nodes = list(nodes)
        if not nodes or len(nodes) > MAX_NODES:
            raise ValueError("a topology has 1..%d nodes, got %d" % (MAX_NODES, len(nodes)))
        bad = [n for n in nodes if not isinstance(n, str) or not NODE_RE.match(n) or n == "br"]
        if bad or len(set(nodes)) != len(nodes):
            raise ValueError("node names must be distinct, [a-z][a-z0-9]{0,11} and not 'br', got %r" % (nodes,))
        self.run = run or "%d-%d" % (os.getpid(), next(_counter))
        if not re.match(r"^[A-Za-z0-9-]{1,24}$", self.run):
            raise ValueError("run must be 1..24 of [A-Za-z0-9-], got %r" % (self.run,))
        if subnet is None:
            subnet = sum(ord(ch) for ch in self.run) % 256
        if not isinstance(subnet, int) or isinstance(subnet, bool) or not 0 <= subnet <= 255:
            raise ValueError("subnet must be the third octet 0..255, got %r" % (subnet,))
        self.network = ipaddress.ip_network("10.241.%d.0/24" % subnet)
        assert self.network.subnet_of(SUPERNET)
        self.nodes = nodes
        self.bridge_ns = "mq%s-br" % self.run
        self.namespaces = {n: "mq%s-%s" % (self.run, n) for n in nodes}
        self.addresses = {n: str(self.network.network_address + FIRST_HOST + i) for i, n in enumerate(nodes)}
        self.bridge_ends = {n: "v-" + n for n in nodes}

    def node_of(self, address):
        for node, addr in self.addresses.items():
            if addr == address:
                return node
        raise KeyError(address)


def unavailable():
    """Why network namespaces cannot be used here, or None."""
    if "netns" not in _probed:
        _probed["netns"] = _probe_netns()
    return _probed["netns"]


def _probe_netns():
    if os.geteuid() != 0:
        return "network namespaces need root (this runs as uid %d)" % os.geteuid()
    if not shutil.which("ip"):
        return "iproute2's ip is not installed"
    name = "mq%d-probe" % os.getpid()
    proc = _ip("netns", "add", name, check=False)
    if proc.returncode != 0:
        return "ip netns add refused: %s" % proc.stderr.decode().strip()
    try:
        for args in (("link", "add", "p0", "type", "veth", "peer", "name", "p1"),
                     ("link", "add", "b0", "type", "bridge")):
            proc = _ip(*args, ns=name, check=False)
            if proc.returncode != 0:
                return "%s refused in a namespace: %s" % (" ".join(args), proc.stderr.decode().strip())
    finally:
        _ip("netns", "del", name, check=False)
    return None


def netem_unavailable():
    """Why ``tc ... netem`` cannot be used here (no tc, the kernel lacks sch_netem), or None."""
    if "netem" not in _probed:
        why = unavailable()
        if why is None and not shutil.which("tc"):
            why = "tc (iproute2) is not installed"
        if why is None:
            name = "mq%d-probe-netem" % os.getpid()
            _ip("netns", "add", name)
            try:
                _ip("link", "add", "p0", "type", "veth", "peer", "name", "p1", ns=name)
                proc = _ip("tc", "qdisc", "add", "dev", "p0", "root", "netem", "loss", "1%", ns=name, check=False)
                if proc.returncode != 0:
                    why = "tc netem is not available in this kernel (sch_netem: %s)" % proc.stderr.decode().strip()
            finally:
                _ip("netns", "del", name, check=False)
        _probed["netem"] = why
    return _probed["netem"]


_libc = None


def _setns(fd):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "setns: %s" % os.strerror(err))


class Topology(NodePlan):
    """The namespaces, bridge and veth pairs of a ``NodePlan``, made by ``start()`` and deleted by ``close()``."""

    def __init__(self, nodes, run=None, subnet=None):
        super().__init__(nodes, run, subnet)
        self.made = []  # namespaces created, in order
        self.faults = []  # every fault made on this topology, healed at close

    def start(self):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        try:
            self._make_ns(self.bridge_ns)
            _ip("link", "add", "br0", "type", "bridge", ns=self.bridge_ns)
            _ip("link", "set", "br0", "up", ns=self.bridge_ns)
            for node in self.nodes:
                ns, end = self.namespaces[node], self.bridge_ends[node]
                self._make_ns(ns)
                _ip("link", "add", end, "type", "veth", "peer", "name", "eth0", "netns", ns, ns=self.bridge_ns)
                _ip("link", "set", end, "master", "br0", ns=self.bridge_ns)
                _ip("link", "set", end, "up", ns=self.bridge_ns)
                _ip("addr", "add", "%s/%d" % (self.addresses[node], self.network.prefixlen), "dev", "eth0", ns=ns)
                _ip("link", "set", "eth0", "up", ns=ns)
                # the local table's rule moves behind the faults' rules (it is the first one, at 0, by default:
                # a packet for a local address would never reach them)
                _ip("rule", "add", "pref", str(LOCAL_PREF), "lookup", "local", ns=ns)
                _ip("rule", "del", "pref", "0", "lookup", "local", ns=ns)
        except BaseException:
            self.close()
            raise
        return self

    def _make_ns(self, ns):
        _ip("netns", "add", ns)
        self.made.append(ns)
        _ip("link", "set", "lo", "up", ns=ns)

    def close(self):
        """Heal every fault, then delete every namespace made (processes still in one keep it alive, unnamed)."""
        for fault in reversed(self.faults):
            try:
                fault.heal()
            except Exception:
                pass
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def prefix(self, node):
        """The command prefix that runs a process inside ``node``."""
        return ["ip", "netns", "exec", self.namespaces[node]]

    def exec(self, node, *args, check=True):
        return _ip(*args, ns=self.namespaces[node], check=check)

    @contextlib.contextmanager
    def inside(self, node):
        """Move the calling thread into ``node`` for the block (threads started meanwhile stay there)."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open("/var/run/netns/" + self.namespaces[node], os.O_RDONLY)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                yield self.addresses[node]
            finally:
                _setns(own)
        finally:
            os.close(own)

    # -- the primitives the faults use ------------------------------------------------------------------------

    def drop(self, src, dst):
        """Drop, on arrival in ``dst``, every packet from ``src`` (idempotent)."""
        self.undrop(src, dst)
        self.exec(dst, "ip", "rule", "add", "from", self.addresses[src], "to", self.addresses[dst], "blackhole",
                  "pref", str(RULE_PREF))

    def undrop(self, src, dst):
        while self.exec(dst, "ip", "rule", "del", "from", self.addresses[src], "to", self.addresses[dst],
                        "blackhole", "pref", str(RULE_PREF), check=False).returncode == 0:
            pass

    def dropped(self, dst):
        """The nodes whose packets ``dst`` drops now."""
        text = self.exec(dst, "ip", "rule", "show", "pref", str(RULE_PREF)).stdout.decode()
        return sorted(self.node_of(m) for m in re.findall(r"from ([0-9.]+) to [0-9.]+ blackhole", text))


def _nodes(topo, names, what):
    names = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in topo.namespaces]
    if not names or unknown:
        raise ValueError("%s: nodes of the topology (%s), got %r" % (what, ", ".join(topo.nodes), names))
    return names


class Cut:
    """A partition between the nodes of ``a`` and those of ``b``; ``one_way``: only ``a`` → ``b`` is dropped."""

    def __init__(self, topo, a, b, one_way=False):
        self.topo, self.one_way = topo, one_way
        self.a, self.b = _nodes(topo, a, "cut"), _nodes(topo, b, "cut")
        if set(self.a) & set(self.b):
            raise ValueError("cut: a node on both sides: %s" % sorted(set(self.a) & set(self.b)))
        self.active = False
        topo.faults.append(self)

    def pairs(self):
        """(src, dst) whose packets are dropped while cut."""
        out = [(x, y) for x in self.a for y in self.b]
        return out if self.one_way else out + [(y, x) for x in self.a for y in self.b]

    def inject(self):
        for src, dst in self.pairs():
            self.topo.drop(src, dst)
        self.active = True
        return time.monotonic()

    def heal(self):
        for src, dst in self.pairs():
            self.topo.undrop(src, dst)
        self.active = False
        return time.monotonic()

    def __str__(self):
        return "%s %s %s" % ("+".join(self.a), "->" if self.one_way else "<->", "+".join(self.b))


class Flap:
    """``Cut(topo, a, b, one_way)`` switched on and off every ``period_s`` by a thread until ``heal()``;
    ``flips`` counts the switches."""

    def __init__(self, topo, a, b, period_s, one_way=False):
        if isinstance(period_s, bool) or not isinstance(period_s, (int, float)) or \
                not FLAP_PERIOD_S[0] <= period_s <= FLAP_PERIOD_S[1]:
            raise ValueError("flap period_s must be in [%s, %s] seconds, got %r" % (FLAP_PERIOD_S + (period_s,)))
        self.cut = Cut(topo, a, b, one_way)
        topo.faults.remove(self.cut)
        topo.faults.append(self)
        self.period_s, self.flips = float(period_s), 0
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()

    def inject(self):
        """Cut now, then heal and cut again every ``period_s``; returns the first cut's time."""
        self._stop.clear()
        with self._lock:
            t = self.cut.inject()
            self.flips += 1
        self._thread = threading.Thread(target=self._run, name="netns-flap", daemon=True)
        self._thread.start()
        return t

    def _run(self):
        while not self._stop.wait(self.period_s):
            with self._lock:
                if self._stop.is_set():
                    return
                (self.cut.heal if self.cut.active else self.cut.inject)()
                self.flips += 1

    def heal(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            return self.cut.heal()

    def __str__(self):
        return "%s flapping every %.2f s" % (self.cut, self.period_s)


class Netem:
    """``tc qdisc ... netem`` on what ``node`` sends (``direction="out"``: its eth0) or receives (``"in"``: the
    bridge's end of its veth): ``loss`` percent at random, ``delay_ms`` (with ``jitter_ms``)."""

    def __init__(self, topo, node, loss=0.0, delay_ms=0, jitter_ms=0, direction="out"):
        if direction not in ("out", "in"):
            raise ValueError("netem direction must be 'out' or 'in', got %r" % (direction,))
        if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss <= 100:
            raise ValueError("netem loss must be a percentage 0..100, got %r" % (loss,))
        for name, value in (("delay_ms", delay_ms), ("jitter_ms", jitter_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 60_000:
                raise ValueError("netem %s must be an int 0..60000, got %r" % (name, value))
        self.topo, self.node = topo, _nodes(topo, node, "netem")[0]
        self.loss, self.delay_ms, self.jitter_ms, self.direction = loss, delay_ms, jitter_ms, direction
        self.active = False
        topo.faults.append(self)

    def spec(self):
        """The netem arguments (pure)."""
        args = []
        if self.delay_ms:
            args += ["delay", "%dms" % self.delay_ms] + (["%dms" % self.jitter_ms] if self.jitter_ms else [])
        if self.loss:
            args += ["loss", "%g%%" % self.loss]
        return args or ["loss", "0%"]

    def _where(self):
        if self.direction == "out":
            return self.topo.namespaces[self.node], "eth0"
        return self.topo.bridge_ns, self.topo.bridge_ends[self.node]

    def inject(self):
        ns, dev = self._where()
        _ip("tc", "qdisc", "replace", "dev", dev, "root", "netem", *self.spec(), ns=ns)
        self.active = True
        return time.monotonic()

    def heal(self):
        if self.active:
            ns, dev = self._where()
            _ip("tc", "qdisc", "del", "dev", dev, "root", ns=ns, check=False)
            self.active = False
        return time.monotonic()

    def __str__(self):
        return "netem %s on %s's %s traffic" % (" ".join(self.spec()), self.node,
                                                "outgoing" if self.direction == "out" else "incoming")
