"""Which topic names are the broker's own (metaq.topics.names)."""

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
