"""The deliveries waiting on a publisher's burst served from its turn (``direct.serve_waiting``, ``MqttPort
.deliver_now``), compiled where built, held equal to its source run uncompiled on seeded scenarios (which
deliveries are called, in which order, with what; which are left caught up; what is kept decoded), at the limit of
deliveries a burst serves and past it, and with paths that take their delivery out of ``waiting`` as they run."""

import random
import types

import pytest

from metaq.mqtt import limits as mqtt_limits
from metaq import native
from metaq.mqtt import direct
from metaq.store.batch import BurstRun
from tests.mqtt.test_direct_publishes import SOURCE


class Path(direct.DirectPath):
    """A delivery's path of the type ``serve_waiting`` declares (``DirectPath``): ``send`` answers as its delivery
    scripts it."""

    def __init__(self, delivery):
        self.delivery = delivery

    def send(self, key, kruns, staged, client_id):
        return self.delivery.send(key, kruns, staged, client_id)


class Delivery:
    """A waiting delivery as the port lists it, its own ``path`` (a ``Path``): ``send`` answers as scripted (True:
    caught up, False: left to its greenlet, None: the general path decides), recorded in ``log``; ``leave`` takes it
    out of ``waiting`` first."""

    def __init__(self, name, answer, log, waiting=None, leave=()):
        self.name, self.answer, self.log, self.waiting, self.leave = name, answer, log, waiting, leave
        self.out = "out-" + name
        self.event = "event-" + name
        self.path = Path(self)

    def send(self, key, kruns, staged, client_id):
        self.log.append(("path", self.name, key, [r.first_frame for r in kruns], staged, client_id))
        for k in self.leave:
            ds = self.waiting.get(k)
            if ds is not None:
                ds.pop(self, None)
                if not ds:
                    del self.waiting[k]
        return self.answer


def scenario(seed):
    """A seeded burst over a few partitions, deliveries waiting on some, a fan-out reader on some."""
    rnd = random.Random(seed)
    log = []
    waiting = {}
    keys = [("t%d" % rnd.randrange(3), rnd.randrange(2)) for _ in range(rnd.randrange(1, 5))]
    runs = [BurstRun(k, 1, 10, 100 + i, i, i, 1000 + i) for i, k in enumerate(keys)]
    names = iter(range(1000))
    for k in set(keys) | {("other", 0)}:
        for _ in range(rnd.randrange(0, 4)):
            d = Delivery(str(next(names)), rnd.choice([True, False, None]), log, waiting)
            if rnd.random() < 0.3:
                d.leave = [k]
            waiting.setdefault(k, {})[d] = None
    readers = {k: "reader" for k in set(keys) if rnd.random() < 0.3}

    def deliver(out, key, kruns, staged, client_id, now, made):
        made.setdefault(key, "made")
        log.append(("deliver", out, key, len(kruns), now))
        return rnd.random() < 0.5

    def keep_decoded(key, kruns, staged, client_id, now, made):
        log.append(("keep", key, len(kruns), sorted(made)))

    most = rnd.choice([1, 2, 3, mqtt_limits.MQTT_DIRECT_DELIVERIES])
    return waiting, readers, keep_decoded, deliver, most, set(keys), "staged", runs, "pub", 7, log, rnd


def run(fn, seed):
    waiting, readers, keep, deliver, most, keys, staged, runs, client_id, now, log, _rnd = scenario(seed)
    out = fn(waiting, readers, keep, deliver, most, keys, staged, runs, client_id, now)
    left = {k: [d.name for d in ds] for k, ds in waiting.items()}
    return out, log, left


def test_the_compiled_step_serves_the_waiting_deliveries_as_its_source_does():
    """The same calls in the same order (paths, the general path with ``made``, the decoded kept), the same
    deliveries left caught up, the same ``waiting`` after paths that left it, on 400 seeded bursts."""
    for seed in range(400):
        assert run(direct.serve_waiting, seed) == run(SOURCE.serve_waiting, seed), seed


@pytest.mark.parametrize("fn", [direct.serve_waiting, SOURCE.serve_waiting], ids=["module", "source"])
def test_a_burst_serves_at_most_its_limit_of_deliveries_and_keeps_the_rest_decoded(fn):
    """Of 3 deliveries waiting on the partition, a limit of 2 serves the first 2 (in the order they began to wait):
    the third is left to its greenlet, and the burst's messages are kept decoded for it; at 3, all three, nothing
    kept."""
    key = ("t", 0)
    runs = [BurstRun(key, 1, 10, 100, 0, 0, 1000)]
    for most, served in ((2, ["a", "b"]), (3, ["a", "b", "c"])):
        log = []
        waiting = {key: {Delivery(n, True, log): None for n in "abc"}}
        kept = []
        out = fn(waiting, {}, lambda *a, kept=kept: kept.append(a[0]), None, most, {key}, [], runs, "pub", 0)
        assert [e[1] for e in log] == served
        assert out == {key: {"event-" + n for n in served}}
        assert kept == ([key] if most == 2 else [])


@pytest.mark.parametrize("fn", [direct.serve_waiting, SOURCE.serve_waiting], ids=["module", "source"])
def test_a_path_that_takes_the_last_delivery_out_of_waiting_leaves_nothing_dangling(fn):
    """The only delivery waiting on a partition leaves ``waiting`` inside its path (its dict is dropped with it):
    the burst still counts it served and keeps nothing decoded for a delivery no longer there."""
    key = ("t", 0)
    log = []
    waiting = {}
    d = Delivery("a", True, log, waiting, leave=[key])
    waiting[key] = {d: None}
    kept = []
    out = fn(waiting, {}, lambda *a: kept.append(a[0]), None, 8, {key}, [], [BurstRun(key, 1, 10, 100, 0, 0, 1000)],
             "pub", 0)
    assert out == {key: {"event-a"}} and waiting == {} and kept == []


@pytest.mark.parametrize("fn", [direct.serve_waiting, SOURCE.serve_waiting], ids=["module", "source"])
def test_an_error_in_a_path_reaches_the_publishers_turn(fn):
    """A delivery's path that raises is not swallowed: the publisher's turn sees it (and closes, as any)."""
    key = ("t", 0)

    class Broken(Delivery):
        def send(self, *args):
            raise RuntimeError("broken path")

    waiting = {key: {Broken("a", True, []): None}}
    with pytest.raises(RuntimeError, match="broken path"):
        fn(waiting, {}, lambda *a: None, None, 8, {key}, [], [BurstRun(key, 1, 10, 100, 0, 0, 1000)], "pub", 0)


def test_nothing_waiting_serves_nothing_and_asks_nothing():
    """No delivery waiting: an empty answer, no path or keep called (the common burst of a topic nobody waits on)."""
    for fn in (direct.serve_waiting, SOURCE.serve_waiting):
        assert fn({}, {("t", 0): "reader"}, None, None, 8, {("t", 0)}, [], [], "pub", 0) == {}


@pytest.mark.parametrize("module", [direct, SOURCE], ids=["module", "source"])
def test_the_ports_waiting_deliveries_are_served_by_one_method_compiled_where_direct_is(module):
    """``WaitingDeliveries.serve`` (what the publisher's turn hands the put path's wake) serves the deliveries listed in
    the dict it was given, at most its ``most`` a burst, as ``serve_waiting``; where the module runs compiled it is a
    C method (no interpreted step between the turn and the subscribers' writes), a Python function where the source
    runs."""
    key = ("t", 0)
    log = []
    waiting = {}
    serving = module.WaitingDeliveries(waiting, {}, lambda *a: log.append(("keep", a[0])), 1)
    for name in ("a", "b"):
        waiting.setdefault(key, {})[Delivery(name, True, log)] = None
    runs = [BurstRun(key, 1, 10, 100, 0, 0, 1000)]
    assert serving.serve({key}, "staged", runs, "pub", 7) == {key: {"event-a"}}
    assert log == [("path", "a", key, [0], "staged", "pub"), ("keep", key)]  # the limit: b is left to its greenlet
    compiled = module is direct and "metaq.mqtt.direct" in native.running()
    assert isinstance(vars(module.WaitingDeliveries)["serve"], types.FunctionType) != compiled
