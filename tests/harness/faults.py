"""Fault injectors over real processes (issue 17 point 5), and the reproducible plan that draws them.

Every injector acts on its own target's PID (never on a process name) and has ``inject()`` and ``heal()``
returning the ``time.monotonic()`` at which it acted (for ``History.fault`` / ``History.heal``); the two
that can leave a test's world broken have a ``close()`` for its teardown (a paused process continued,
a proxy's threads and sockets gone):

* ``KillBroker(broker)``: kill -9 of a ``metaq.client.local.BrokerProcess``; ``heal()`` starts it again
  (same config and data dir; set ``broker.extra_args`` first to restart it as someone's slave).
* ``StopBroker(broker)``: a clean stop (SIGTERM, waiting for the exit; ``inject()`` returns when the signal
  was sent); ``heal()`` starts it again.
* ``PauseProcess(target)``: SIGSTOP of anything with a ``proc`` (``BrokerProcess``, ``ZooKeeperProcess``);
  ``inject(seconds)`` sends SIGCONT by itself after that long (a timer), ``heal()`` at once.
* ``LinkProxy(target)``: a threaded TCP proxy on 127.0.0.1 that a slave's ``slave_of`` points at
  (``proxy.address``). ``cut()`` drops every relayed connection and refuses new ones (accepted and closed
  at once: the slave sees its link go down); ``cut(blackhole=True)`` instead keeps them open and discards
  what crosses (a silent partition: only timeouts notice); ``heal()`` forwards again (held connections
  are closed then, so both ends reconnect on a clean stream).
* ``RestartZooKeeper(zk)``: stops (or with ``kill=True`` kills -9) a ``ZooKeeperProcess``; ``heal()``
  starts it again on the same port and data dir.

``FaultPlan(seed, rounds, kinds)`` draws ``rounds`` steps (kind, how long the fault lasts, how long the
load runs before it) from ``random.Random(seed)``, of ``KINDS`` (issue 17 point 5's faults) unless ``kinds``
says otherwise (``ALL_KINDS`` adds ``stop_master``, a clean stop; ``NETNS_KINDS`` are the partitions of
tests/harness/netns.py, issue 41 point 6); ``each=True`` takes every kind once per ``len(kinds)`` rounds (in an
order drawn from the seed) instead of drawing each round's kind; ``METAQ_CHECKER_SEED`` in the environment
overrides the seed, and ``plan.message(text)`` / ``with plan.reported():`` put the seed in every failure message.
``rounds_from_env(default)`` reads ``METAQ_CHECKER_ROUNDS``, the longer run's round count.
"""

import contextlib
import os
import random
import select
import signal
import socket
import threading
import time
from typing import NamedTuple

__all__ = ["KillBroker", "StopBroker", "PauseProcess", "LinkProxy", "RestartZooKeeper", "FaultPlan", "Step",
           "KINDS", "ALL_KINDS", "NETNS_KINDS", "NETEM_KINDS", "SEED_ENV", "ROUNDS_ENV", "rounds_from_env"]

SEED_ENV = "METAQ_CHECKER_SEED"
ROUNDS_ENV = "METAQ_CHECKER_ROUNDS"
#: The faults of issue 17 point 5.
KINDS = ("kill_master", "pause_master", "cut_link", "kill_slave", "restart_zk")
#: What a plan may draw besides: a clean stop of the master (issue 17 point 7 times its handover).
ALL_KINDS = KINDS + ("stop_master",)
#: The partitions made with network namespaces (issue 41 point 6): the master cut from ZooKeeper and its slaves
#: but not from its clients; a slave cut from the master only; the master's link to a slave flapping; the
#: master's packets to its slaves dropped, theirs to it delivered (one way); random loss and delay on what the
#: master sends (``tc netem``, where the kernel has it).
NETNS_KINDS = ("isolate_master", "cut_slave", "flap_link", "one_way_cut", "asymmetric_loss")
#: Those that need netem.
NETEM_KINDS = ("asymmetric_loss",)
#: How long each kind of fault lasts before it is healed, seconds (low, high); a plan may override them.
DEFAULT_DURATIONS = {"kill_master": (0.5, 3.0), "pause_master": (1.0, 8.0), "cut_link": (0.5, 4.0),
                     "kill_slave": (0.5, 3.0), "restart_zk": (0.5, 3.0), "stop_master": (0.5, 3.0),
                     "isolate_master": (2.0, 8.0), "cut_slave": (1.0, 5.0), "flap_link": (2.0, 6.0),
                     "one_way_cut": (1.0, 5.0), "asymmetric_loss": (2.0, 6.0)}
#: How long the load runs before each fault, seconds (low, high).
DEFAULT_WAITS = (1.0, 3.0)
#: A plan has at most this many rounds; a pause lasts at most this long.
MAX_ROUNDS = 1000
MAX_PAUSE_S = 300.0
#: A LinkProxy relays at most this many connections at once (more are accepted and closed).
MAX_PROXY_CONNECTIONS = 64
_RELAY_CHUNK = 65536


def _alive(target, what):
    proc = getattr(target, "proc", None)
    if proc is None or proc.poll() is not None:
        raise RuntimeError("%s: %r is not running" % (what, target))
    return proc


class KillBroker:
    """kill -9 of one broker by its PID; ``heal()`` restarts it."""

    def __init__(self, broker):
        self.broker = broker

    def inject(self):
        _alive(self.broker, "kill -9")
        self.broker.kill()  # SIGKILL to its own PID, then waits for it
        return time.monotonic()

    def heal(self, timeout=30.0):
        self.broker.start(timeout)
        return time.monotonic()


class StopBroker(KillBroker):
    """A clean stop (SIGTERM to its PID, then its exit awaited); ``heal()`` restarts it."""

    def __init__(self, broker, timeout=60.0):
        super().__init__(broker)
        self.timeout = timeout

    def inject(self):
        """The time SIGTERM was sent (the stop's own work, a handover included, comes after it)."""
        proc = _alive(self.broker, "SIGTERM")
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(self.timeout)
        return t


class PauseProcess:
    """SIGSTOP of one process by its PID, SIGCONT after ``seconds`` (a timer) or on ``heal()``."""

    def __init__(self, target):
        self.target = target
        self.paused = False
        self._timer = None
        self._lock = threading.Lock()
        self.resumed = threading.Event()

    def inject(self, seconds=None):
        """Stop the process; with ``seconds``, a timer continues it after that long. Returns the time."""
        if seconds is not None and not 0 < seconds <= MAX_PAUSE_S:
            raise ValueError("pause seconds must be in (0, %s], got %r" % (MAX_PAUSE_S, seconds))
        proc = _alive(self.target, "SIGSTOP")
        with self._lock:
            if self.paused:
                raise RuntimeError("SIGSTOP: %r is already paused" % (self.target,))
            os.kill(proc.pid, signal.SIGSTOP)
            self.paused = True
            self.resumed.clear()
            if seconds is not None:
                self._timer = threading.Timer(seconds, self.heal)
                self._timer.daemon = True
                self._timer.start()
        return time.monotonic()

    def heal(self):
        """SIGCONT (if paused); returns the time. Safe to call twice, or from the timer and a test at once."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self.paused:
                proc = self.target.proc
                if proc is not None and proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
                self.paused = False
                self.resumed.set()
        return time.monotonic()

    def wait_resumed(self, timeout):
        return self.resumed.wait(timeout)

    close = heal


class RestartZooKeeper:
    """Stop (or kill -9) one ZooKeeper server by its PID; ``heal()`` starts it on the same port and data."""

    def __init__(self, zk):
        self.zk = zk

    def inject(self, kill=False):
        _alive(self.zk, "ZooKeeper restart")
        (self.zk.kill if kill else self.zk.stop)()
        return time.monotonic()

    def heal(self, timeout=30.0):
        self.zk.start(timeout)
        return time.monotonic()


class LinkProxy:
    """A TCP proxy in this process (threads): ``127.0.0.1:<port>`` → ``target`` (host, port), with ``cut``/``heal``.

    ``relayed`` counts connections forwarded, ``refused`` those accepted and closed (cut, or past
    ``MAX_PROXY_CONNECTIONS``), ``held`` those kept open and silent (blackhole). ``rate`` (bytes a second, None =
    as fast as it goes; may be changed at any time) throttles what is forwarded: a slow link."""

    rate = None

    def __init__(self, target, port=0):
        self.target = tuple(target)
        self.listener = socket.create_server(("127.0.0.1", port))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.relayed = self.refused = self.held = 0
        self.state = "open"  # open | cut | blackhole
        self._lock = threading.Lock()
        self._pairs = set()  # (client, upstream) being relayed or held
        self._stop = threading.Event()
        self._threads = []
        self._thread = threading.Thread(target=self._accept_loop, name="link-proxy", daemon=True)

    @property
    def address(self):
        """``127.0.0.1:<port>``: what a slave's ``slave_of`` is given."""
        return "127.0.0.1:%d" % self.port

    def start(self):
        self._thread.start()
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def cut(self, blackhole=False):
        """Drop every connection and refuse new ones; ``blackhole``: keep them open, forward nothing."""
        with self._lock:
            self.state = "blackhole" if blackhole else "cut"
            pairs = list(self._pairs)
        if not blackhole:
            for pair in pairs:
                self._close(pair)
        return time.monotonic()

    def heal(self):
        """Forward again; connections held by a blackhole are closed (their streams lost bytes)."""
        with self._lock:
            was, self.state = self.state, "open"
            pairs = list(self._pairs)
        if was == "blackhole":
            for pair in pairs:
                self._close(pair)
        return time.monotonic()

    def close(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.listener.close()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._close(pair)
        for t in self._threads:
            t.join(5)

    def connections(self):
        with self._lock:
            return len(self._pairs)

    def _close(self, pair):
        with self._lock:
            self._pairs.discard(pair)
        for s in pair:
            if s is None:
                continue
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                state, full = self.state, len(self._pairs) >= MAX_PROXY_CONNECTIONS
            if state == "cut" or full:
                self.refused += 1
                self._close((client, None))
                continue
            self._threads = [t for t in self._threads if t.is_alive()]
            t = threading.Thread(target=self._serve, args=(client,), name="link-proxy-relay", daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, client):
        upstream = None
        with self._lock:
            state = self.state
        if state == "cut":
            self.refused += 1
            self._close((client, None))
            return
        if state == "open":
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                self._close((client, None))  # the target is down: the client sees it as a refused link
                return
            self.relayed += 1
        else:
            self.held += 1
        pair = (client, upstream)
        with self._lock:
            self._pairs.add(pair)
        try:
            self._relay(pair)
        finally:
            self._close(pair)

    def _relay(self, pair):
        """Both directions in this thread; in a blackhole what arrives is read and dropped."""
        peer = {pair[0]: pair[1], pair[1]: pair[0]}
        socks = [s for s in pair if s is not None]
        while not self._stop.is_set():
            with self._lock:
                if pair not in self._pairs:
                    return
                state = self.state
            if state == "cut":
                return
            try:
                ready = select.select(socks, [], [], 0.2)[0]
            except (OSError, ValueError):
                return
            for s in ready:
                try:
                    data = s.recv(_RELAY_CHUNK)
                except OSError:
                    return
                if not data:
                    return
                with self._lock:  # a cut made while select waited applies to what it returned
                    state = self.state
                if state == "open" and peer[s] is not None:
                    try:
                        peer[s].sendall(data)
                    except OSError:
                        return
                    rate = self.rate
                    if rate:
                        time.sleep(len(data) / rate)


class Step(NamedTuple):
    """One round of a plan: after ``wait`` s of load, inject ``kind`` for ``seconds`` s, then heal."""

    round: int
    kind: str
    seconds: float
    wait: float

    def __str__(self):
        return "round %d: %s for %.2f s after %.2f s of load" % (self.round, self.kind, self.seconds, self.wait)


def rounds_from_env(default):
    """``METAQ_CHECKER_ROUNDS`` as an int in 1..MAX_ROUNDS when set (ValueError naming it otherwise), else
    ``default``."""
    text = os.environ.get(ROUNDS_ENV, "").strip()
    if not text:
        return default
    if not text.isdigit() or not 1 <= int(text) <= MAX_ROUNDS:
        raise ValueError("%s must be a number of rounds in 1..%d, got %r" % (ROUNDS_ENV, MAX_ROUNDS, text))
    return int(text)


def seed_from_env(default=None):
    """``METAQ_CHECKER_SEED`` as an int when set (ValueError naming it when it is not one), else ``default``."""
    text = os.environ.get(SEED_ENV, "").strip()
    if not text:
        return default
    try:
        return int(text, 0)
    except ValueError:
        raise ValueError("%s must be an integer seed, got %r" % (SEED_ENV, text)) from None


class FaultPlan:
    """``rounds`` faults of ``kinds`` drawn from ``random.Random(seed)``: the same seed, the same plan.

    ``seed`` None: a fresh random one (printed, and in every failure message); the environment's
    ``METAQ_CHECKER_SEED`` overrides either. ``durations``: {kind: (low, high)} over ``DEFAULT_DURATIONS``;
    ``waits``: (low, high) over ``DEFAULT_WAITS``; ``each``: every kind once in each ``len(kinds)`` rounds."""

    def __init__(self, seed=None, rounds=5, kinds=KINDS, durations=None, waits=DEFAULT_WAITS, each=False):
        seed = seed_from_env(seed)
        if seed is None:
            seed = random.SystemRandom().randrange(1 << 32)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError("seed must be an int, got %r" % (seed,))
        if not isinstance(rounds, int) or isinstance(rounds, bool) or not 1 <= rounds <= MAX_ROUNDS:
            raise ValueError("rounds must be an int in 1..%d, got %r" % (MAX_ROUNDS, rounds))
        kinds = tuple(kinds) if not isinstance(kinds, str) else (kinds,)
        known = ALL_KINDS + NETNS_KINDS
        unknown = [k for k in kinds if k not in known]
        if not kinds or unknown or len(set(kinds)) != len(kinds):
            raise ValueError("kinds must be distinct names among %s, got %r" % (", ".join(known), kinds))
        spans = dict(DEFAULT_DURATIONS)
        spans.update(durations or {})
        spans["waits"] = waits
        for name, span in spans.items():
            if name != "waits" and name not in known:
                raise ValueError("durations: unknown kind %r (kinds: %s)" % (name, ", ".join(known)))
            numbers = isinstance(span, (tuple, list)) and len(span) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in span)
            if not numbers or not 0 <= span[0] <= span[1] <= MAX_PAUSE_S:
                raise ValueError("%s must be (low, high) seconds with 0 <= low <= high <= %s, got %r"
                                 % (name, MAX_PAUSE_S, span))
        self.seed, self.rounds, self.kinds = seed, rounds, kinds
        rng = random.Random(seed)
        self.steps = []
        cycle = []
        for i in range(rounds):
            if each:
                if not cycle:
                    cycle = list(kinds)
                    rng.shuffle(cycle)
                kind = cycle.pop()
            else:
                kind = rng.choice(kinds)
            self.steps.append(Step(i + 1, kind, round(rng.uniform(*spans[kind]), 2), round(rng.uniform(*waits), 2)))

    def __iter__(self):
        return iter(self.steps)

    def __len__(self):
        return len(self.steps)

    def describe(self):
        return "fault plan %s=%d, %d rounds:\n%s" % (SEED_ENV, self.seed, self.rounds,
                                                      "\n".join("  " + str(s) for s in self.steps))

    def message(self, text):
        """``text`` with the seed that reproduces the run (``METAQ_CHECKER_SEED=<seed>``)."""
        return "%s\n[reproduce with %s=%d]" % (text, SEED_ENV, self.seed)

    @contextlib.contextmanager
    def reported(self):
        """Re-raise an AssertionError from the block with the seed in its message."""
        try:
            yield self
        except AssertionError as exc:
            raise AssertionError(self.message(str(exc))) from exc
