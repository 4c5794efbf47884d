"""Which topic names are the broker's own (metaq.topics.names), and which are legal (``limits.validate_topic``)."""

import pytest

from metaq import limits
from metaq.errors import InvalidTopic
from metaq.topics.names import INTERNAL, is_internal, level_owner


def test_the_brokers_own_names_are_internal():
    assert set(INTERNAL) == {"SCHEDULE_TOPIC_XXXX", "%TIMER%", "%TX%", "%POP%", "%MQTT%", "RMQ_SYS_TRACE_TOPIC",
                             "%MQTTIN%"}
    for name in ("SCHEDULE_TOPIC_XXXX", "%TIMER%", "%TX%", "%POP%", "%MQTT%", "RMQ_SYS_TRACE_TOPIC", "%MQTTIN%",
                 "%RETRY%billing", "%DLQ%billing", "%RESENT%billing", "orders%P2"):
        assert is_internal(name), name


def test_a_users_names_are_not():
    for name in ("orders", "test", "SCHEDULE_TOPIC", "TIMER", "orders%P", "orders%Px", "RETRY_billing"):
        assert not is_internal(name), name


def test_a_level_names_its_owner():
    assert level_owner("orders%P2") == "orders"
    assert level_owner("orders") is None and level_owner("%TIMER%") is None


def test_a_name_stays_legal_or_illegal_however_often_it_is_asked():
    longest = "t" * limits.MAX_NAME_BYTES
    for _ in range(3):  # the second and third asks are answered as the first
        assert limits.validate_topic("orders.v2-%x_1") == "orders.v2-%x_1"
        assert limits.validate_group(longest) == longest
        for bad in ("", ".", "..", "a/b", "a b", longest + "t", "é", b"orders", None, ["orders"]):
            with pytest.raises(InvalidTopic):
                limits.validate_topic(bad)
            with pytest.raises(InvalidTopic, match="group"):
                limits.validate_group(bad)


def test_as_many_legal_names_as_a_client_likes_are_told_legal():
    names = ["topic-%d" % i for i in range(3 * limits._LEGAL_NAMES_KEPT)]
    assert [limits.validate_topic(n) for n in names] == names
    assert [limits.validate_group(n) for n in reversed(names)] == names[::-1]
    assert len(limits._legal_names) <= limits._LEGAL_NAMES_KEPT  # the names kept stay bounded
