"""The pure logic of the partition checks (issue 41 point 6), without a network: the topology's names and
addresses (tests/harness/netns.py), the faults' descriptions, the plan's draws of the partition kinds and the
round count from the environment (tests/harness/faults.py), and the checker's order, window and offset checks
(tests/harness/history.py)."""

import ipaddress

import pytest

from tests.harness import netns
from tests.harness.faults import (ALL_KINDS, MAX_ROUNDS, NETEM_KINDS, NETNS_KINDS, ROUNDS_ENV, SEED_ENV, FaultPlan,
                                  rounds_from_env)
from tests.harness.history import History, check, check_offsets

# -- the topology's plan -------------------------------------------------------------------------------------------


def test_every_name_carries_the_run_and_every_address_is_in_the_private_range():
    plan = netns.NodePlan(["zk", "m0", "m1", "c"], run="4242-1")
    assert plan.namespaces == {"zk": "mq4242-1-zk", "m0": "mq4242-1-m0", "m1": "mq4242-1-m1", "c": "mq4242-1-c"}
    assert plan.bridge_ns == "mq4242-1-br"
    assert len(set(plan.addresses.values())) == 4
    for address in plan.addresses.values():
        assert ipaddress.ip_address(address) in plan.network and plan.network.subnet_of(netns.SUPERNET)
    assert plan.addresses["zk"].endswith(".10") and plan.addresses["c"].endswith(".13")
    assert all(len(end) <= 15 for end in plan.bridge_ends.values())  # an interface name's limit
    assert plan.node_of(plan.addresses["m1"]) == "m1"
    assert netns.NodePlan(["a"], run="x", subnet=7).addresses == {"a": "10.241.7.10"}


def test_two_runs_of_one_process_never_share_a_name():
    a, b = netns.NodePlan(["m0"]), netns.NodePlan(["m0"])
    assert a.run != b.run and not set(a.namespaces.values()) & set(b.namespaces.values())
    assert a.bridge_ns != b.bridge_ns


def test_the_node_limit_and_the_limit_plus_one():
    names = ["n%d" % i for i in range(netns.MAX_NODES)]
    plan = netns.NodePlan(names, run="r")
    assert plan.addresses["n%d" % (netns.MAX_NODES - 1)].endswith(".%d" % (netns.FIRST_HOST + netns.MAX_NODES - 1))
    with pytest.raises(ValueError, match="1..200 nodes, got 201"):
        netns.NodePlan(names + ["extra"], run="r")


@pytest.mark.parametrize("nodes, run, subnet, match", [
    ([], None, None, "1..200 nodes, got 0"),
    (["a", "a"], None, None, "distinct"),
    (["br"], None, None, "not 'br'"),
    (["Upper"], None, None, "distinct"),
    (["a" * 13], None, None, "distinct"),
    (["a"], "has space", None, "run must be"),
    (["a"], "r", 256, "third octet 0..255, got 256"),
    (["a"], "r", -1, "third octet"),
])
def test_a_bad_plan_is_refused_naming_what(nodes, run, subnet, match):
    with pytest.raises(ValueError, match=match):
        netns.NodePlan(nodes, run=run, subnet=subnet)


def test_a_cut_drops_both_ways_or_one_and_says_which():
    topo = netns.Topology(["zk", "m0", "m1", "m2"], run="t")  # nothing is created before start()
    both = netns.Cut(topo, ["m0"], ["zk", "m1"])
    assert sorted(both.pairs()) == [("m0", "m1"), ("m0", "zk"), ("m1", "m0"), ("zk", "m0")]
    assert str(both) == "m0 <-> zk+m1"
    one = netns.Cut(topo, "m0", ["m1", "m2"], one_way=True)
    assert one.pairs() == [("m0", "m1"), ("m0", "m2")] and str(one) == "m0 -> m1+m2"
    with pytest.raises(ValueError, match="a node on both sides"):
        netns.Cut(topo, ["m0"], ["m0", "m1"])
    with pytest.raises(ValueError, match="nodes of the topology"):
        netns.Cut(topo, ["m9"], ["m1"])
    assert topo.faults == [both, one]  # close() heals them


def test_a_flap_period_at_its_limits_and_past_them():
    topo = netns.Topology(["a", "b"], run="t")
    low, high = netns.FLAP_PERIOD_S
    assert netns.Flap(topo, "a", "b", low).period_s == low and netns.Flap(topo, "a", "b", high).period_s == high
    for bad in (low / 2, high + 1, True, "1"):
        with pytest.raises(ValueError, match="flap period_s"):
            netns.Flap(topo, "a", "b", bad)
    assert str(netns.Flap(topo, "a", "b", 0.5)) == "a <-> b flapping every 0.50 s"


def test_netem_arguments_and_their_limits():
    topo = netns.Topology(["m0"], run="t")
    assert netns.Netem(topo, "m0", loss=20, delay_ms=30, jitter_ms=5).spec() == ["delay", "30ms", "5ms", "loss",
                                                                                   "20%"]
    assert netns.Netem(topo, "m0", loss=12.5).spec() == ["loss", "12.5%"]
    assert netns.Netem(topo, "m0").spec() == ["loss", "0%"]
    assert netns.Netem(topo, "m0", loss=100, delay_ms=60_000).spec()[-1] == "100%"
    assert str(netns.Netem(topo, "m0", loss=5, direction="in")) == "netem loss 5% on m0's incoming traffic"
    for kwargs, match in (({"loss": 100.5}, "loss must be a percentage"), ({"delay_ms": 60_001}, "delay_ms"),
                          ({"jitter_ms": -1}, "jitter_ms"), ({"direction": "both"}, "direction")):
        with pytest.raises(ValueError, match=match):
            netns.Netem(topo, "m0", **kwargs)


# -- the plan's draws ----------------------------------------------------------------------------------------------

def test_each_takes_every_partition_kind_once_per_cycle_in_a_seeded_order(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    kinds = tuple(k for k in NETNS_KINDS if k not in NETEM_KINDS)
    plan = FaultPlan(seed=3, rounds=3 * len(kinds) + 1, kinds=kinds, each=True)
    cycles = [[s.kind for s in plan.steps[i:i + len(kinds)]] for i in range(0, 3 * len(kinds), len(kinds))]
    assert all(sorted(c) == sorted(kinds) for c in cycles)
    assert len({tuple(c) for c in cycles}) > 1  # each cycle in its own order
    assert plan.steps[-1].kind in kinds
    assert FaultPlan(seed=3, rounds=len(plan), kinds=kinds, each=True).steps == plan.steps
    for s in plan:
        low, high = {"isolate_master": (2.0, 8.0), "cut_slave": (1.0, 5.0), "flap_link": (2.0, 6.0),
                     "one_way_cut": (1.0, 5.0)}[s.kind]
        assert low <= s.seconds <= high
    assert set(NETNS_KINDS).isdisjoint(ALL_KINDS) and set(NETEM_KINDS) <= set(NETNS_KINDS)
    with pytest.raises(ValueError, match="kinds must be distinct names among .*isolate_master"):
        FaultPlan(seed=1, kinds=["isolate_master", "partition_everything"])


@pytest.mark.parametrize("text", ["0", "-1", "four", str(MAX_ROUNDS + 1), "2.5"])
def test_the_round_count_from_the_environment_at_its_limits(monkeypatch, text):
    monkeypatch.setenv(ROUNDS_ENV, str(MAX_ROUNDS))
    assert rounds_from_env(8) == MAX_ROUNDS
    monkeypatch.setenv(ROUNDS_ENV, text)
    with pytest.raises(ValueError, match="METAQ_CHECKER_ROUNDS must be a number of rounds in 1..1000"):
        rounds_from_env(8)
    monkeypatch.delenv(ROUNDS_ENV)
    assert rounds_from_env(8) == 8


# -- the checker's new checks --------------------------------------------------------------------------------------

def test_order_per_partition_a_later_acknowledgement_at_an_earlier_position_is_reordered():
    def run(second_offset):
        h = History()
        h.ack("p1", "t", 0, 1, "p1-1", 1.0)
        h.ack("p1", "t", 0, second_offset, "p1-2", 2.0)
        h.ack("p2", "t", 0, 0 if second_offset == 2 else 2, "p2-1", 1.5)  # another producer: no order with p1
        log = {}
        for a in h.events():
            log[a[1:4]] = a.msg_id
            h.deliver("c1", a.topic, a.partition, a.offset, a.msg_id, 3.0)
        return check(h, {"m": log}, "sync")

    assert run(2) == []
    swapped = run(0)
    assert swapped == ["REORDERED t-0: p1-2 acknowledged to p1 at t-0@0 t+1.000s is held at t-0@0, before p1-1 "
                       "(acknowledged to p1 at t-0@1 t+0.000s) held at t-0@1"], swapped.summary()


def isolated_history(window_s):
    """A fault whose master acknowledged p1-2 0.8 s after the cut (an isolated async master), lost with it."""
    h = History()
    h.ack("p1", "t", 0, 0, "p1-1", 1.0)
    detail = {} if window_s is None else {"window_s": window_s}
    h.fault("isolate_master", 2.0, lag_messages=0, lag_t=1.9, target="m0", **detail)
    h.ack("p1", "t", 0, 1, "p1-2", 2.8)
    h.deliver("c1", "t", 0, 0, "p1-1", 3.0)
    h.heal(9.0)
    return h


def test_a_faults_own_window_counts_what_an_isolated_master_acknowledged_after_the_cut():
    logs = {"m1": {("t", 0, 0): "p1-1"}}
    bounded = check(isolated_history(1.5), logs, "async", master="m1")
    assert bounded == [] and bounded.counts["lost"] == 1, bounded.summary()
    assert "window start..t+2.500s, 1 lost, bound 1" in bounded.faults[0]
    # the same loss with the default window (0.2 s) is a loss after every fault's window
    plain = check(isolated_history(None), logs, "async", master="m1")
    assert [v for v in plain if v.startswith("LOST WITHOUT FAULT (async) p1-2")], plain.summary()


def test_offset_tables_converge_or_each_difference_is_named():
    truth = {("g", "t", 0): 10, ("g", "t", 1): 4}
    assert check_offsets({"m0": dict(truth), "m1": dict(truth)}, "m0", {("t", 0): 10, ("t", 1): 4}) == []
    out = check_offsets({"m0": dict(truth), "m1": {("g", "t", 0): 7}, "m2": dict(truth)}, "m0")
    assert out == ["OFFSETS DIFFER on m1 from the master m0: g t-0: m0 has 10, m1 has 7; g t-1: m0 has 4, m1 has none"]
    past = check_offsets({"m0": truth}, "m0", {("t", 0): 9, ("t", 1): 4})
    assert past == ["OFFSET PAST END on m0: group g committed t-0 at 10, the log ends at 9"]
    with pytest.raises(ValueError, match="master 'm9' is not in tables"):
        check_offsets({"m0": truth}, "m9")
