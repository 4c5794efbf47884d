"""The history checker under real network partitions (issue 41 point 6): network namespaces and veth pairs.

Every process has a namespace of its own (tests/harness/netns.py): ZooKeeper (``zk``), each member of an
``ha: auto`` group of broker id 7 (``m0``..), and the clients (``c``: this test's own thread moves there, so the
producers and the consumer group of the workload, and every ``stats`` the test reads, cross the bridge too).
Each binds its namespace's address; nothing listens on the host's interfaces. The groups: ``sync`` of 3 members,
``async`` of 2 or 3 (drawn from the seed).

A ``FaultPlan`` of ``NETNS_KINDS`` (``each=True``: every kind once per cycle, in an order drawn from the seed)
drives the rounds; each round on a healthy group:

* ``isolate_master``: the master cut from ZooKeeper and from its slaves, not from its clients (past the session
  timeout another member is elected; an ``async`` master refuses writes within ``replication.max_isolation_ms``);
* ``cut_slave``: one slave cut from the master only (it still hears ZooKeeper and the clients);
* ``flap_link``: the master's link to one slave, or to ZooKeeper, cut and healed every 0.2-1 s;
* ``one_way_cut``: what the master sends its slaves dropped, what they send it delivered (or the other way round);
* ``asymmetric_loss``: 10-30 % loss and up to 40 ms delay on what the master sends (``tc netem``; its own test,
  skipped with the reason where the kernel has no netem).

Healed, the group must elect one master followed by every member and acknowledge again. At the end every member
catches up and ``check()`` judges the history: acknowledged-but-lost (none in ``sync``; in ``async`` within the
lag read before each fault, an isolated master's window reaching ``max_isolation_ms`` past its cut),
duplicates (reported), order per partition, no position holding two messages on two members (the logs are
copies of one another) and every acknowledged message delivered; then the consumer group (offsets kept in the
brokers) closes and every member's offset table must equal the master's (``check_offsets``).

Every member's commit log must then be byte-identical to the master's up to its end (``differing_logs``), and the
XA branches prepared before the faults (one committed after each round on the master of the moment) must be as
their answers said on the final master (``check_branches``).

``METAQ_CHECKER_SEED`` replays a plan; ``METAQ_CHECKER_ROUNDS`` sets the rounds (default: each kind twice).
"""

import random
import time
from typing import NamedTuple

import pytest

from tests.harness import netns
from tests.harness.broker import wait_for
from tests.harness.faults import NETEM_KINDS, NETNS_KINDS, FaultPlan, rounds_from_env
from tests.harness.ha import SESSION_MS, Group, GroupRun
from tests.harness.history import (ACK_SLACK_S, Ack, Fault, History, check, check_branches, check_offsets,
                                   logs_to_json)
from tests.harness.tx import ok, recovered, tput, tx
from metaq.transactions.wire import XAER_NOTA, parse_xa_error
from tests.harness.replication import commitlog, stats
from tests.harness.workload import Workload, read_logs, read_offsets
from tests.harness.zookeeper import ZooKeeperProcess

pytestmark = [pytest.mark.fault, pytest.mark.slow]

TOPIC = "t-part"
#: The XA branches' messages (one each, its key as the body), and how many branches a run prepares before its faults:
#: one is committed after each round on whichever member is master then, the rest stay prepared to the end.
TX_TOPIC = "t-part-tx"
BRANCHES = 6
GROUP = "g-history"
#: async flushes (and so ships) every FLUSH_MS.
FLUSH_MS = 100
#: ``replication.max_isolation_ms`` (the default in ``ha: auto`` + ``async``), and what a reply read by this test
#: may trail the broker's decision by on a loaded machine.
MAX_ISOLATION_S = 1.0
REPLY_SLACK_S = 0.5
HEALTHY_S = 90.0
PROGRESS_ACKS = 20
#: Offsets copied to the slaves converge within this once the group has closed.
OFFSETS_S = 30.0
WAITS = (0.5, 1.5)
#: The default run takes each kind this many times.
DEFAULT_CYCLES = 2
SESSION_S = SESSION_MS / 1000.0


def skip_unless_netns():
    why = netns.unavailable()
    if why:
        pytest.skip("network namespaces unavailable: " + why)


def picked(slaves, pick):
    """The slave a round's ``pick`` (a fraction drawn in [0, 1], rounded to 3 places so 1.0 can occur) names."""
    return slaves[min(len(slaves) - 1, int(pick * len(slaves)))]


class Choice(NamedTuple):
    """A round's own draws (from the plan's seed): which slave, the flap's half period and peer (ZooKeeper or a
    slave), the one-way cut's direction, netem's loss and delay."""

    pick: float
    period_s: float
    flap_zk: bool
    to_master: bool
    loss: int
    delay_ms: int


class NetRun(GroupRun):
    """An ``ha: auto`` group, its ZooKeeper and its clients, each in a namespace of one topology."""

    healthy_s, progress_acks = HEALTHY_S, PROGRESS_ACKS

    def __init__(self, broker_factory, tmp_path, mode, n, plan, session_ms=SESSION_MS, **replication):
        """``replication``: more ``replication:`` settings of every member (e.g. ``max_isolation_ms=0``)."""
        self.broker_factory, self.tmp_path, self.mode, self.n, self.plan = broker_factory, tmp_path, mode, n, plan
        self.session_ms, self.replication = session_ms, replication
        self.name = "%s, %d members" % (mode, n)
        sub = random.Random("netns-%d" % plan.seed)
        self.choices = [Choice(round(sub.random(), 3), round(sub.uniform(0.2, 1.0), 2), sub.random() < 0.5,
                               sub.random() < 0.5, sub.randint(10, 30), sub.randint(0, 40)) for _ in plan]
        self.topo = netns.Topology(["zk"] + ["m%d" % i for i in range(n)] + ["c"])
        self.history = History()
        self.log = []
        self.zk = self.group = self.load = None
        self._inside = None

    def open(self):
        self.topo.start()
        self._inside = self.topo.inside("c")
        self._inside.__enter__()
        self.zk = ZooKeeperProcess(self.tmp_path / "zk", host=self.topo.addresses["zk"],
                                   prefix=self.topo.prefix("zk")).start()
        self.group = Group(self.broker_factory, self.tmp_path, self.zk.connect, n=self.n, mode=self.mode,
                           start=False, sections={"store": {"flush_interval_ms": FLUSH_MS},
                                     # the ports listen on a namespace's address, not loopback: only the
                                     # run's own namespaces can reach it
                                     "security": {"insecure": True}}, **self.replication)
        for i, member in enumerate(self.group.members):
            node = "m%d" % i
            address = self.topo.addresses[node]
            member.config["broker"]["host"] = member.host = address
            member.config["replication"]["advertised_address"] = "%s:%d" % (address, self.group.replication_port(i))
            member.prefix = self.topo.prefix(node)
            member.config["zk"]["session_timeout_ms"] = self.session_ms
            member.start()
        self.load = Workload(self.history, self.zk.connect, TOPIC, producers=3, consumers=2, group=GROUP,
                             workdir=self.tmp_path, broker_id=7, pace_s=0.01, offset_store="broker")
        return self

    def close(self):
        """Everything stopped by its own PID, the thread back in its namespace, the namespaces deleted."""
        try:
            if self.load is not None:
                self.load.close()
            for member in (self.group.members if self.group else []):
                member.kill()
            if self.zk is not None:
                self.zk.kill()
        finally:
            if self._inside is not None:
                self._inside.__exit__(None, None, None)
                self._inside = None
            self.topo.close()

    def lag(self, master):
        on_slaves = [int(stats(b)["total_messages"]) for i, b in enumerate(self.members) if i != master]
        lag_t = time.monotonic()
        return max(0, int(stats(self.members[master])["total_messages"]) - min(on_slaves)), lag_t

    def fault_of(self, kind, master, choice):
        """The injector of ``kind`` in this round, and the detail the history records with it."""
        m = "m%d" % master
        slaves = ["m%d" % i for i in range(self.n) if i != master]
        slave = picked(slaves, choice.pick)
        if kind == "isolate_master":
            # an async master acknowledges until it has heard from nobody for max_isolation_ms
            window = MAX_ISOLATION_S + REPLY_SLACK_S if self.mode == "async" else ACK_SLACK_S
            return netns.Cut(self.topo, [m], ["zk"] + slaves), {"window_s": window}
        if kind == "cut_slave":
            return netns.Cut(self.topo, [slave], [m]), {}
        if kind == "flap_link":
            return netns.Flap(self.topo, [m], ["zk" if choice.flap_zk else slave], choice.period_s), {}
        if kind == "one_way_cut":
            if choice.to_master:  # the master hears nothing from its slaves; they still hear it
                return netns.Cut(self.topo, slaves, [m], one_way=True), {}
            return netns.Cut(self.topo, [m], slaves, one_way=True), {}
        if kind == "asymmetric_loss":
            return netns.Netem(self.topo, m, loss=choice.loss, delay_ms=choice.delay_ms, direction="out"), {}
        raise ValueError("not a partition kind: %r" % (kind,))

    def round(self, step, choice):
        master = self.healthy()
        time.sleep(step.wait)
        fault, detail = self.fault_of(step.kind, master, choice)
        lag, lag_t = self.lag(master)
        t = fault.inject()
        self.history.fault(step.kind, t, lag_messages=lag, lag_t=lag_t, target="m%d" % master, round=step.round,
                           what=str(fault), **detail)
        time.sleep(step.seconds)
        healed = fault.heal()
        after = self.healed(step, healed)
        acks = [a.t for a in self.history.events(Ack) if t - 1.0 < a.t <= healed]
        self.say("%s: m%d master; %s (lag %d); %d acknowledged during it; healed, m%d master" % (
            step, master, fault, lag, len(acks), after))

    def caught_up(self):
        master = self.healthy()
        try:
            wait_for(lambda: len({stats(b)["log_end_position"] for b in self.members}) == 1, HEALTHY_S,
                     lambda: "every member at the master's log end: %s" % (
                         [stats(b)["log_end_position"] for b in self.members]))
        except AssertionError as exc:
            self.fail(str(exc))
        return master


def branch_key(n):
    return "XID:1:%04x:b1:netrun" % n


def prepare_branches(run, n):
    """``n`` XA branches prepared on the master, one message each: the keys answered XA_OK."""
    master = run.group.members[run.healthy()]
    keys = []
    with master.client() as c:
        for i in range(n):
            key = branch_key(i)
            ok(tx(c, key, "BEGIN", 600, "netrun"))
            tput(c, key, TX_TOPIC, 0, key.encode())
            c.send(b"transaction %s s1 END 0\r\n" % key.encode())
            assert ok(tx(c, key, "PREPARE")) == b"0"
            keys.append(key)
    return keys


def commit_branch(run, key):
    """Commit ``key`` on whichever member is master, retrying (a 503, a connection lost) until a commit is answered
    OK (True) or the branch is unknown there (False: the check names it)."""
    deadline = time.monotonic() + HEALTHY_S
    while time.monotonic() < deadline:
        try:
            with run.group.members[run.healthy()].client() as c:
                r = tx(c, key, "COMMIT_TWO_PHASE")
        except (OSError, AssertionError) as exc:
            run.say("commit of %s: %s; again" % (key, exc))
            time.sleep(0.5)
            continue
        if r.code == 200:
            return True
        if r.code == 500 and parse_xa_error(r.body)[0] == XAER_NOTA:
            run.say("commit of %s: unknown on the master" % key)
            return False
        run.say("commit of %s: %s; again" % (key, r))
        time.sleep(0.5)
    run.fail("the commit of %s was never answered" % key)


def branch_verdict(run, master, prepared, committed, mode):
    """``check_branches`` on the final master: its RECOVER and its TX_TOPIC messages."""
    with run.group.members[master].client() as c:
        listed = recovered(c, "netrun")
    logs = read_logs({"m": run.group.members[master]}, topics=[TX_TOPIC])["m"]
    stored = {}
    for body in logs.values():
        stored[body] = stored.get(body, 0) + 1
    return check_branches(prepared, committed, listed, stored, mode)


def differing_logs(members, master):
    """Byte-identical logs: each member's commit log up to the common end, segment by segment, against the
    master's; the violations (empty: identical)."""
    end = int(stats(members[master])["log_end_position"])
    truth = commitlog(members[master])
    out = []
    for i, member in enumerate(members):
        if i == master:
            continue
        own = commitlog(member)
        for name in sorted(set(truth) | set(own)):
            size = max(0, end - int(name))
            a, b = truth.get(name, b"")[:size], own.get(name, b"")[:size]
            if a != b:
                at = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                out.append("NOT IDENTICAL: m%d's segment %s differs from the master m%d's at byte %d (log end %d)"
                           % (i, name, master, at, end))
    return out


def default_plan(kinds):
    """Each of ``kinds`` in turn, ``DEFAULT_CYCLES`` times unless ``METAQ_CHECKER_ROUNDS`` says otherwise."""
    return FaultPlan(rounds=rounds_from_env(DEFAULT_CYCLES * len(kinds)), kinds=kinds, waits=WAITS, each=True)


def run_plan(broker_factory, tmp_path, mode, n, kinds, plan=None, **settings):
    """The run; the violations fail it. ``plan``: this one instead of each kind in turn; ``settings``: NetRun's."""
    run, verdict, _offsets, _ends = play(broker_factory, tmp_path, mode, n, kinds, plan, **settings)
    if verdict:
        run.fail("%s\n%s" % (verdict.summary(), verdict.where))
    return run, verdict


def play(broker_factory, tmp_path, mode, n, kinds, plan=None, **settings):
    """The run and its verdict, offset tables checked (their convergence within OFFSETS_S and their ends)."""
    skip_unless_netns()
    if plan is None:
        plan = default_plan(kinds)
    run = NetRun(broker_factory, tmp_path, mode, n, plan, **settings)
    print("\n%s mode, %d members, nodes %s; %s\nchoices:\n  %s" % (
        mode, n, run.topo.addresses, plan.describe(), "\n  ".join(str(c) for c in run.choices)))
    try:
        run.open()
        run.healthy()
        run.load.start()
        run.load.wait_acks(PROGRESS_ACKS * 5, HEALTHY_S)
        prepared, committed = prepare_branches(run, BRANCHES), set()
        for i, (step, choice) in enumerate(zip(plan, run.choices, strict=True)):
            run.round(step, choice)
            if i < BRANCHES - 1 and commit_branch(run, branch_key(i)):
                committed.add(branch_key(i))
        run.load.stop_producers()
        master = run.caught_up()
        branches = branch_verdict(run, master, prepared, committed, mode)
        logs = read_logs({"m%d" % i: b for i, b in enumerate(run.members)}, topics=[TOPIC])
        differ = differing_logs(run.members, master)
        held = set(logs["m%d" % master].values())
        deadline = time.monotonic() + HEALTHY_S
        while (run.history.acked_ids() & held) - run.history.delivered_ids() and time.monotonic() < deadline:
            time.sleep(0.2)
        run.load.close()  # the consumers commit and leave: their offsets are final on the master
        if run.load.errors:
            run.fail("the workload failed: %s" % run.load.errors)
        names = {"m%d" % i: b for i, b in enumerate(run.members)}
        ends = {}
        for topic, partition, offset in logs["m%d" % master]:
            ends[(topic, partition)] = max(ends.get((topic, partition), 0), offset + 1)

        def tables():
            return {name: read_offsets(b, [TOPIC]) for name, b in names.items()}
        try:  # the slaves copy the master's table about once a second
            wait_for(lambda: not check_offsets(tables(), "m%d" % master, ends), OFFSETS_S,
                     lambda: "every member's offset table the master's: %s" % check_offsets(tables(),
                                                                                          "m%d" % master, ends))
        except AssertionError as exc:
            run.fail(str(exc))
        offsets = tables()
    finally:
        run.close()
    path = run.history.dump(str(tmp_path / "history.json"))
    with open(str(tmp_path / "logs.json"), "w") as f:
        f.write(logs_to_json(logs))
    verdict = check(run.history, logs, mode, master="m%d" % master)
    verdict += differ
    verdict += branches
    verdict.where = "history: %s, logs: %s" % (path, tmp_path / "logs.json")
    print(verdict.summary())
    assert verdict.counts["faults"] == len(plan) and verdict.counts["heals"] == len(plan), verdict.summary()
    assert {s.kind for s in plan} == set(kinds) or len(plan) < len(kinds)
    if mode == "sync":
        assert not verdict.lost, plan.message(verdict.summary())
    # the group consumed everything it was given and committed it: on every member, at each partition's end
    master_table = offsets["m%d" % master]
    assert {k[2] for k in master_table} == {p for (_t, p) in ends}, master_table
    assert all(master_table[(GROUP, TOPIC, p)] == end for (_t, p), end in ends.items()), (master_table, ends)
    return run, verdict, offsets, ends


PARTITIONS = tuple(k for k in NETNS_KINDS if k not in NETEM_KINDS)


def test_sync_group_of_three_under_partitions_loses_nothing(broker_factory, tmp_path):
    run_plan(broker_factory, tmp_path, "sync", 3, PARTITIONS)


def test_async_group_under_partitions_loses_at_most_the_lag(broker_factory, tmp_path):
    plan = default_plan(PARTITIONS)
    n = random.Random("size-%d" % plan.seed).choice((2, 3))  # 2 or 3 members, drawn from the seed
    run_plan(broker_factory, tmp_path, "async", n, PARTITIONS, plan)


def test_async_group_under_asymmetric_loss_and_delay(broker_factory, tmp_path):
    skip_unless_netns()
    why = netns.netem_unavailable()
    if why:
        pytest.skip("asymmetric loss and delay need tc netem: " + why)
    run_plan(broker_factory, tmp_path, "async", 2, NETEM_KINDS)


def test_the_checker_catches_an_isolated_async_master_without_the_bound(broker_factory, tmp_path):
    """The same checks have teeth: with ``max_isolation_ms: 0`` (off) and an 8 s session, the isolated master
    acknowledges for its whole lease (4 s) after the cut, past the window the bound allows: those losses are
    violations, each named."""
    plan = FaultPlan(seed=1, rounds=1, kinds=["isolate_master"], durations={"isolate_master": (12.0, 12.0)},
                     waits=WAITS)
    run, verdict, _offsets, _ends = play(broker_factory, tmp_path, "async", 2, ["isolate_master"], plan,
                                         session_ms=8000, max_isolation_ms=0)
    late = [v for v in verdict if v.startswith("LOST WITHOUT FAULT (async)")]
    assert late and len(late) == len(verdict), verdict.summary()
    cut = run.history.events(Fault)[0].t
    lost_after = sorted(a.t - cut for a in verdict.lost.values())
    assert lost_after[-1] > MAX_ISOLATION_S + REPLY_SLACK_S, lost_after[-5:]
    assert len(late) == len([t for t in lost_after if t > MAX_ISOLATION_S + REPLY_SLACK_S]), verdict.summary()


def test_a_pick_drawn_as_1_0_names_the_last_slave_not_one_past_it():
    slaves = ["m1", "m2"]
    assert [picked(slaves, p) for p in (0.0, 0.499, 0.5, 0.999, 1.0)] == ["m1", "m1", "m2", "m2", "m2"]
    assert picked(["m0"], 1.0) == "m0"
