"""Issue 42, point 2: produce and fetch rates per user (docs/security.md "Quotas"): a user over its rate is
delayed, not refused (as Kafka throttles), and another user at the same time is not. Real broker, authentication
on."""

import threading
import time

import pytest

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.text import serialize
from tests.harness.acl import DEFAULT_USERS, login, secured_config, write_acl

pytestmark = pytest.mark.integration

RATE = 200_000  # bytes a second
BODY = b"x" * 10_000
PUTS = 60  # 600 kB: two seconds past the one-second burst at RATE


def rated_users(**rates):
    users = {name: dict(entry) for name, entry in DEFAULT_USERS.items()}
    users["bob"]["topics"] = {"orders": "pub|sub"}
    users["alice"]["quotas"] = rates
    return users


def put_all(broker, user, topic="orders"):
    """``(seconds, codes)`` of PUTS pipelined puts of BODY by ``user``, every reply read."""
    with login(broker, user) as c:
        started = time.monotonic()
        c.send(b"".join(serialize(ev.Put(topic, 0, 0, BODY, i, metaq_checksum(BODY))) for i in range(PUTS)))
        codes = [c.read_event().code for _ in range(PUTS)]
        return time.monotonic() - started, codes


def read_all(broker, user, topic="orders"):
    """``(seconds, bytes)`` of reading the partition from 0, 100 kB a get, by ``user``."""
    with login(broker, user) as c:
        started, offset, got = time.monotonic(), 0, 0
        while True:
            records = c.get_records(topic, 0, offset, max_size=100_000)
            if not isinstance(records, list) or not records:
                break
            got += sum(len(r.data) for r in records)
            offset += len(records)
        return time.monotonic() - started, got


def test_a_user_over_its_produce_rate_is_delayed_and_another_is_not(broker_factory, tmp_path):
    cfg = secured_config(tmp_path)
    write_acl(tmp_path / "acl.yaml", users=rated_users(produce_bytes_per_s=RATE))
    b = broker_factory(cfg)
    timings = {}
    alice = threading.Thread(target=lambda: timings.__setitem__("alice", put_all(b, "alice")))
    alice.start()
    time.sleep(0.2)
    timings["bob"] = put_all(b, "bob")  # while alice is throttled
    alice.join(30)
    (alice_s, alice_codes), (bob_s, bob_codes) = timings["alice"], timings["bob"]
    assert alice_codes == bob_codes == [200] * PUTS  # delayed, never refused
    sent = PUTS * len(BODY)
    assert alice_s >= (sent - RATE) / RATE * 0.8, alice_s  # bounded by her rate (less the one-second burst)
    assert sent / alice_s < 1.5 * RATE
    assert bob_s < 1.0, bob_s  # bob's puts at the same time: not slowed


def test_a_user_over_its_fetch_rate_is_delayed_and_another_is_not(broker_factory, tmp_path):
    cfg = secured_config(tmp_path)
    write_acl(tmp_path / "acl.yaml", users=rated_users(fetch_bytes_per_s=RATE))
    b = broker_factory(cfg)
    _s, codes = put_all(b, "bob")
    assert codes == [200] * PUTS
    alice_s, alice_bytes = read_all(b, "alice")
    bob_s, bob_bytes = read_all(b, "bob")
    assert alice_bytes == bob_bytes == PUTS * len(BODY)
    assert alice_s >= (alice_bytes - RATE) / RATE * 0.8, alice_s
    assert bob_s < 1.0, bob_s
