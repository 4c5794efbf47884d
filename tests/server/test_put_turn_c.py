"""The C helper's steps after a burst's append (``metaq/_putturn.c``) against their Python twins, seeded: the async
flush policy of ``MessageStore.should_flush``, the wake of ``BrokerWrites.visible`` (``putpath.visible_py``) and
``PartitionWaiters.notify``, state included."""

import random
from types import SimpleNamespace

import pytest

from metaq.server.putpath import ACK_NOW, visible_py
from metaq.store.store import MessageStore

try:
    from metaq import _speedups as c
except ImportError:
    c = None

needs_c = pytest.mark.skipif(c is None, reason="metaq._speedups was not built")


def _store(rnd):
    written = rnd.randrange(0, 1000)
    return SimpleNamespace(_pos=SimpleNamespace(written=written, flushed=rnd.choice((written, rnd.randrange(0, 1000))),
                                                unflushed_msgs=rnd.randrange(0, 20)),
                           _async=rnd.random() < 0.8, _last_flush_ms=rnd.randrange(0, 1000),
                           config=SimpleNamespace(flush_every_messages=rnd.randrange(1, 20),
                                                  flush_interval_ms=rnd.randrange(1, 300)))


@needs_c
@pytest.mark.parametrize("seed", range(8))
def test_c_should_flush_answers_and_moves_the_last_flush_as_its_twin(seed):
    rnd = random.Random(seed)
    for _ in range(500):
        state = rnd.getstate()
        ours = _store(rnd)
        rnd.setstate(state)
        twin = _store(rnd)
        now = rnd.randrange(0, 1500)
        assert c.store_should_flush(ours, now) is MessageStore.should_flush(twin, now)
        assert ours == twin  # the last flush's time moved alike


def _wake_of(rnd, calls, fail):
    def notify(keys, quiet, settle):
        calls.append(("notify", keys, quiet, settle))

    def should_flush(now):
        calls.append(("should_flush", now))
        return rnd.random() < 0.5

    def wake():
        calls.append(("wake",))

    def deliver(*args):
        calls.append(("deliver", args))
        if fail:
            raise OSError("the delivery failed")
        return {"k": {"ev"}}

    return notify, should_flush, wake, deliver


@needs_c
@pytest.mark.parametrize("seed", range(8))
def test_c_visible_wakes_delivers_and_flushes_as_its_twin(seed):
    rnd = random.Random(seed)
    for _ in range(200):
        shape, fail, answers = rnd.randrange(4), rnd.random() < 0.1, rnd.randrange(1 << 30)
        results = []
        for visible in (c.put_visible, visible_py):
            calls = []
            state = random.Random(answers)  # the same answers of should_flush for both
            notify, should_flush, wake, deliver = _wake_of(state, calls, fail)
            tail = ((), ({"q": set()},), (None, deliver), (None, deliver, ("a", 1)))[shape]
            try:
                out = visible(notify, should_flush, wake, (("t", 0),), 5, *tail)
            except OSError as exc:
                out = str(exc)
            results.append((out, calls))
        assert results[0] == results[1]
        assert results[0][0] == (ACK_NOW if not (fail and shape >= 2) else "the delivery failed")


class _Ev:
    """An Event stand-in that records its wake."""

    def __init__(self, name, woken):
        self.name, self.woken = name, woken

    def set(self):
        self.woken.append(self.name)

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return self.name == other.name

    def __repr__(self):
        return self.name


def _waiters(rnd, woken):
    from metaq.server.longpoll import NEW_PARTITION, PartitionWaiters
    w = PartitionWaiters()
    keys = [("t", p) for p in range(4)] + [NEW_PARTITION]
    for key in rnd.sample(keys, rnd.randrange(len(keys) + 1)):
        w._waits[key] = {_Ev("%s%d-%d" % (key[0], key[1], k), woken) for k in range(rnd.randrange(1, 4))}
    w._made = rnd.random() < 0.3
    return w, keys


@needs_c
@pytest.mark.parametrize("seed", range(8))
def test_c_notify_wakes_and_leaves_the_waits_as_its_twin(seed, monkeypatch):
    """Waits of each key, the quiet ones a delivery served (all of a key's, some, none, an empty set), a partition
    made since the last wake, ``settle``'s yield only when one was woken; the waits left in the map alike."""
    import gevent

    from metaq.server import longpoll
    rnd = random.Random(seed)
    for _ in range(300):
        state = rnd.getstate()
        results = []
        for twin in (False, True):
            rnd.setstate(state)
            woken, slept = [], []
            w, keys = _waiters(rnd, woken)
            named = rnd.sample(keys[:4], rnd.randrange(5))
            quiet = None
            if rnd.random() < 0.6:
                quiet = {}
                for key in named:
                    held = sorted(w._waits.get(key, ()), key=repr)
                    quiet[key] = set(rnd.sample(held, rnd.randrange(len(held) + 1))) if held else set()
            settle = rnd.random() < 0.5
            monkeypatch.setattr(gevent, "sleep", slept.append)
            if twin:
                out = longpoll.PartitionWaiters.notify(w, tuple(named), quiet, settle)
            else:
                out = c.waiters_notify(w, slept.append, longpoll.NEW_PARTITION, tuple(named), quiet, settle)
            results.append((out, sorted(woken), slept, {k: sorted(map(repr, v)) for k, v in w._waits.items()},
                            w._made))
        assert results[0] == results[1]
