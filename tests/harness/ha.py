"""Groups of brokers with one broker id electing their master through ZooKeeper (``replication.ha: auto``)."""

import os
import time

from metaq.client.local import free_port, small_config
from tests.harness.broker import wait_for
from tests.harness.replication import caught_up, master_config, stats

SESSION_MS = 4000  # the shortest session ZooKeeper allows with the harness's 2 s tick


def member_config(workdir, member, zk, mode="sync", sections=None, **replication):
    """``sections``: more config sections (e.g. ``{"remoting": {"port": P}}``)."""
    return small_config(os.path.join(str(workdir), "data"),
                        replication=dict({"ha": "auto", "port": free_port(), "slave_id": member, "mode": mode,
                                          "sync_timeout_ms": 3000}, **replication),
                        zk={"connect": zk, "session_timeout_ms": SESSION_MS, "connection_timeout_ms": 5000},
                        **(sections or {}))


class Group:
    """``members[i]`` is member id i (a BrokerProcess); all share broker id 7. ``remoting=True`` gives each member
    a RocketMQ remoting port of its own (fixed: it survives restarts); ``sections``: more config sections for
    every member."""

    def __init__(self, broker_factory, tmp_path, zk, n=3, mode="sync", start=True, remoting=False, sections=None,
                 **replication):
        self.mode = mode
        self.members = []
        for i in range(n):
            wd = tmp_path / ("m%d" % i)
            more = dict(sections or {})
            if remoting:
                more["remoting"] = dict(more.get("remoting", {}), port=free_port())
            self.members.append(broker_factory(member_config(wd, i, zk, mode, more, **replication), workdir=wd,
                                               start=False))
        if start:
            for b in self.members:
                b.start()

    def roles(self):
        out = {}
        for i, b in enumerate(self.members):
            try:
                out[i] = stats(b)["replication_role"]
            except (OSError, AssertionError, KeyError):
                out[i] = "down"
        return out

    def master(self, timeout=20.0, exclude=()):
        """The one member that reports itself master (and leading), waiting up to ``timeout``."""
        return wait_for(lambda: (lambda m: None if m is None else (m,))(self._single_leader(exclude)), timeout,
                        lambda: "one elected master; roles %s" % self.roles())[0]

    def _single_leader(self, exclude=()):
        """The member that reports itself master and leading, when exactly one does (None otherwise)."""
        found = []
        for i, b in enumerate(self.members):
            if i in exclude:
                continue
            try:
                st = stats(b)
            except (OSError, AssertionError):
                continue
            if st["replication_role"] == "master" and st["replication_leading"] == "true":
                found.append(i)
        return found[0] if len(found) == 1 else None

    def following(self, master, members, timeout=20.0):
        """Wait until every one of ``members`` follows ``master`` with its link up."""
        wait_for(lambda: self._follow(master, members), timeout, lambda: "members %s following %s; roles %s" % (
            members, self.replication_address(master), self.roles()))

    def _follow(self, master, members):
        """True when every one of ``members`` follows ``master`` with its link up now."""
        want = self.replication_address(master)
        for i in members:
            try:
                st = stats(self.members[i])
            except (OSError, AssertionError):
                return False
            if st["replication_role"] != "slave" or st.get("replication_master") != want or \
                    st.get("replication_link") != "connected":
                return False
        return True

    def healthy(self, timeout=20.0):
        """The master, once one is elected and followed by every member (``sync``: all in its in-sync set), waited
        for up to ``timeout``; AssertionError naming what did not come. Which member leads is asked again at each
        look, with its followers: just after a partition heals, a deposed master may still believe it leads for a
        moment before it hears of its successor, and the group heals under the successor."""
        last = {}

        def check():
            master = self._single_leader()
            if master is None:
                return None
            members = [i for i in range(len(self.members)) if i != master]
            last["seen"] = (master, members)
            if not self._follow(master, members):
                return None
            if self.mode == "sync" and self.insync(master) != ",".join(str(i) for i in range(len(self.members))):
                return None
            return (master,)

        def what():
            master, members = last.get("seen", (None, None))
            if master is None:
                return "one elected master; roles %s" % self.roles()
            return "members %s following %s (m%d)%s; roles %s" % (
                members, self.replication_address(master), master,
                "" if self.mode != "sync" else ", all in its in-sync set (%s)" % self.insync(master), self.roles())
        return wait_for(check, timeout, what)[0]

    def replication_port(self, i):
        return self.members[i].config["replication"]["port"]

    def remoting(self, i):
        """Member ``i``'s RocketMQ address (``127.0.0.1:port``), as its routes and name server list give it."""
        return "127.0.0.1:%d" % self.members[i].config["remoting"]["port"]

    def namesrv(self):
        """Every member as a RocketMQ client's name server list (``a:p;b:p;c:p``)."""
        return ";".join(self.remoting(i) for i in range(len(self.members)))

    def replication_address(self, i):
        """Where the others copy from when member ``i`` leads: its ``advertised_address``, else its own port."""
        rep = self.members[i].config["replication"]
        return rep.get("advertised_address") or "127.0.0.1:%d" % rep["port"]

    def insync(self, i):
        return stats(self.members[i])["replication_insync"]


class GroupRun:
    """What a fault run over a ``Group`` shares: the subclass sets ``group``, ``plan`` (a ``FaultPlan``: its
    ``message`` says how to run it again), ``name``, ``log`` (what each round did), ``history``, ``load`` (its
    producers), ``healthy_s`` and ``progress_acks``."""

    @property
    def members(self):
        return self.group.members

    def say(self, text):
        self.log.append(text)
        print(text)

    def fail(self, text):
        raise AssertionError(self.plan.message("%s\n%s\nrounds so far:\n  %s" % (self.name, text,
                                                                                 "\n  ".join(self.log))))

    def healthy(self):
        """The master, once one is elected and followed by every member (sync: all in its in-sync set)."""
        try:
            return self.group.healthy(self.healthy_s)
        except AssertionError as exc:
            self.fail("the group did not heal: %s" % exc)

    def healed(self, step, at):
        """A round's fault healed at ``at``: recorded; returns the master once the group is healthy again and
        its producers got ``progress_acks`` acknowledgements since."""
        self.history.heal(at)
        master = self.healthy()
        try:
            self.load.wait_acks(self.progress_acks, self.healthy_s, since=at)
        except AssertionError as exc:
            self.fail("no progress after round %d: %s" % (step.round, exc))
        return master


def put_until_ok(broker, topic, body, timeout=30.0, partition=0):
    """Put (retrying while the broker refuses: an election under way); (msg_id, partition, offset)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with broker.client() as c:
                r = c.put(topic, body, partition)
                if getattr(r, "code", None) == 200:
                    return tuple(int(x) for x in r.body.split())
                last = r
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError("no put accepted within %.0f s: %r" % (timeout, last))


def manual_pair(broker_factory, tmp_path, zk_connect, topic, slave_replication=True):
    """``(master, slave, master's replication port, slave's or None)``: an ``ha: manual`` pair registered in ZooKeeper
    (a 4 s session), the slave caught up with one message put to ``topic``; the slave has a replication port of its
    own when ``slave_replication`` (what a promoted member serves its slaves on)."""
    rport = free_port()
    srport = free_port() if slave_replication else None
    zkcfg = {"connect": zk_connect, "session_timeout_ms": 4000}
    m = broker_factory(dict(master_config(tmp_path / "m", rport), zk=dict(zkcfg)), workdir=tmp_path / "m")
    args = ["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"]
    if srport is not None:
        args += ["--replication-port", str(srport)]
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data"), zk=dict(zkcfg)), workdir=tmp_path / "s",
                       extra_args=args)
    put_until_ok(m, topic, b"before")
    caught_up(m, s)
    return m, s, rport, srport
