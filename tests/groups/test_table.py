"""The group settings table and the one decision (groups/table.py, groups/policy.py): values checked with nothing
changed on a refusal, the file written atomically and read back, at most MAX_GROUP_SETTINGS groups, the table in the
replication TOPICS frame."""

import json

import pytest

from metaq import limits
from metaq.groups import limits as groups_limits
from metaq.errors import ClientError, ConsumptionDisabled, NotFound, StoreError
from metaq.groups import policy
from metaq.groups.table import GroupSettings, GroupTable, TABLE_FORMAT
from metaq.protocol import replication_topics as codec


def full_state(n):
    return {"format": TABLE_FORMAT, "version": 5, "groups": {"g%d" % i: {"max_retries": 1} for i in range(n)}}


def test_a_set_is_saved_atomically_and_read_back(tmp_path):
    t = GroupTable(str(tmp_path))
    s = t.set("billing", {"max_retries": "3", "consumption_enabled": "false"})
    assert (s.max_retries, s.consumption_enabled, s.broadcast_allowed, s.read_from_slave_when_slow) == \
        (3, False, True, None)
    t.set("billing", {"read_from_slave_when_slow": "1"})  # the others stay
    back = GroupTable(str(tmp_path)).load()
    assert back.get("billing") == GroupSettings("billing", 3, False, True, 1) and back.version == 2
    assert not list(tmp_path.glob("*.tmp"))
    t.delete("billing")
    assert GroupTable(str(tmp_path)).load().get("billing") is None
    with pytest.raises(NotFound):
        t.delete("billing")


@pytest.mark.parametrize("values, says", [
    ({"max_retries": "-1"}, "max_retries must be 0..%d" % groups_limits.MAX_GROUP_RETRIES),
    ({"max_retries": str(groups_limits.MAX_GROUP_RETRIES + 1)},
     "max_retries must be 0..%d" % groups_limits.MAX_GROUP_RETRIES),
    ({"max_retries": "2.5"}, "max_retries must be a whole number"),
    ({"consumption_enabled": "maybe"}, "consumption_enabled must be true or false"),
    ({"read_from_slave_when_slow": "0"}, "read_from_slave_when_slow must be 1..%d" % limits.MAX_BROKER_ID),
    ({"colour": "red"}, "unknown group setting colour"),
    ({}, "give at least one setting"),
])
def test_bad_values_are_refused_and_nothing_changes(tmp_path, values, says):
    t = GroupTable(str(tmp_path))
    t.set("billing", {"max_retries": "7"})
    with pytest.raises(ClientError, match=says):
        t.set("billing", dict(values, broadcast_allowed="false") if values else values)
    assert t.get("billing") == GroupSettings("billing", 7) and t.version == 1
    assert GroupTable(str(tmp_path)).load().get("billing") == GroupSettings("billing", 7)


def test_max_retries_at_its_limit_is_taken(tmp_path):
    assert GroupTable(str(tmp_path)).set("g", {"max_retries": groups_limits.MAX_GROUP_RETRIES}).max_retries == \
        groups_limits.MAX_GROUP_RETRIES


def test_the_table_holds_max_group_settings_groups_and_refuses_one_more(tmp_path):
    t = GroupTable(str(tmp_path))
    t.apply_json(full_state(groups_limits.MAX_GROUP_SETTINGS - 1))
    t.set("last", {"max_retries": 2})  # at the limit
    assert len(t.entries) == groups_limits.MAX_GROUP_SETTINGS
    with pytest.raises(ClientError, match="limits.MAX_GROUP_SETTINGS"):
        t.set("one-more", {"max_retries": 2})
    assert t.get("one-more") is None and len(t.entries) == groups_limits.MAX_GROUP_SETTINGS
    t.set("g0", {"max_retries": 5})  # a group already there may still change
    assert t.get("g0").max_retries == 5
    assert len(GroupTable(str(tmp_path)).load().entries) == groups_limits.MAX_GROUP_SETTINGS
    with pytest.raises(ValueError, match="MAX_GROUP_SETTINGS"):
        GroupTable(str(tmp_path)).apply_json(full_state(groups_limits.MAX_GROUP_SETTINGS + 1))


def test_a_table_file_that_cannot_be_read_names_itself(tmp_path):
    (tmp_path / "groups.json").write_text('{"format": 1, "version": 1, "groups": {"g": {"max_retries": -4}}}')
    with pytest.raises(StoreError, match="groups.json cannot be read: max_retries"):
        GroupTable(str(tmp_path)).load()


def test_the_decision():
    assert policy.decide(None, "g") == (None, None, None)  # no entry: as before the table
    off = GroupSettings("g", 3, consumption_enabled=False)
    assert "subscription group no permission, g" in policy.decide(off, "g").refusal
    with pytest.raises(ConsumptionDisabled, match="consumption_enabled=false"):
        policy.require(off, "g")
    narrow = GroupSettings("g", broadcast_allowed=False)
    assert policy.decide(narrow, "g").refusal is None
    assert "can not consume by broadcast way" in policy.decide(narrow, "g", broadcasting=True).refusal
    assert policy.max_attempts(GroupSettings("g", 3), 16) == 4 and policy.max_attempts(None, 16) == 16
    assert policy.max_attempts(GroupSettings("g"), 16) == 16
    assert policy.max_reconsume_times(GroupSettings("g", 3), None, 16) == 3
    assert policy.max_reconsume_times(GroupSettings("g", 3), 5, 16) == 5  # the request's own wins
    assert policy.max_reconsume_times(None, None, 16) == 16
    slow = GroupSettings("g", read_from_slave_when_slow=2)
    assert policy.suggest_broker(slow, 101, 100) == 2 and policy.suggest_broker(slow, 100, 100) == 0
    assert policy.suggest_broker(None, 10 ** 12, 0) == 0
    assert not policy.fifo(None, False) and policy.fifo(None, True)  # what the client asked, without an entry
    assert policy.fifo(GroupSettings("g", fifo=True), False)  # the group's setting, whatever the client asked
    assert not policy.fifo(GroupSettings("g"), False)


def test_the_topics_frame_carries_the_group_table_and_a_slave_takes_it(tmp_path):
    master = GroupTable(str(tmp_path / "m"))
    master.set("billing", {"consumption_enabled": "0"})
    topics = {"format": 1, "version": 1, "topics": {}, "deleted": {}}
    event = codec.decode(codec.encode(topics, (), master.to_json()).table)
    assert event.groups == master.to_json() and event.owners == ()
    assert codec.decode(codec.encode(topics).table).groups is None
    slave = GroupTable(str(tmp_path / "s"))
    slave.replace(event.groups)
    assert GroupTable(str(tmp_path / "s")).load().get("billing") == master.get("billing")
    slave.replace(None)  # a master without group settings
    assert slave.entries == {} and GroupTable(str(tmp_path / "s")).load().entries == {}
    with pytest.raises(Exception, match="group settings table"):
        codec.decode(json.dumps(dict(topics, groups=[1])).encode())


def test_a_failed_write_changes_nothing(tmp_path):
    t = GroupTable(str(tmp_path))
    t.set("billing", {"max_retries": 2})

    def disk_full(fn):
        raise OSError(28, "No space left on device")
    t.run_blocking = disk_full
    with pytest.raises(OSError):
        t.set("billing", {"consumption_enabled": "false"})
    with pytest.raises(OSError):
        t.delete("billing")
    assert t.get("billing") == GroupSettings("billing", 2) and t.version == 1
    assert GroupTable(str(tmp_path)).load().get("billing") == GroupSettings("billing", 2)
