"""The sink's rows -> messages, with a recording producer in place of the brokers (no Spark, no network)."""

from concurrent.futures import Future

import pytest

from metaq.client.message import Partition, SendResult
from metaq.spark.sink import SinkError, SinkOptions, check_columns, write_rows

OPTS = SinkOptions({"brokers": "meta://127.0.0.1:1", "topic": "orders"})
PARTS = [Partition(7, 0), Partition(7, 1)]


class RecordingProducer:
    """What write_rows needs of a Producer: partitions, send_async, close; each send succeeds."""

    made = []

    def __init__(self, **kwargs):
        self.kwargs, self.sent, self.closed = kwargs, [], False
        RecordingProducer.made.append(self)

    def partitions(self, topic):
        return list(PARTS)

    def send_async(self, message):
        message.encode()  # what the real one refuses at once (a property with \x01/\x02 ...)
        self.sent.append(message)
        future = Future()
        future.set_result(SendResult(True, message.key, len(self.sent) - 1))
        return future

    def close(self):
        self.closed = True


@pytest.fixture(autouse=True)
def _fresh():
    RecordingProducer.made = []


def write(rows, opts=OPTS):
    return write_rows(iter(rows), opts, 42, producer_factory=RecordingProducer)


def test_rows_become_messages_in_order_on_the_chosen_partitions():
    stats = write([{"value": "a"}, {"value": b"b", "partition": "7-1"}, {"value": bytearray(b"c"), "key": "k"}])
    (producer,) = RecordingProducer.made
    assert [m.body for m in producer.sent] == [b"a", b"b", b"c"] and producer.closed
    assert producer.sent[1].key == Partition(7, 1) and producer.sent[2].properties == {"KEYS": "k"}
    assert stats == {"rows": 3, "duplicates": 0, "producer_id": 42}


def test_an_empty_task_opens_no_producer():
    """After a shuffle most of the (default 200) tasks of a micro-batch are empty: no connection for them."""
    assert write([]) == {"rows": 0, "duplicates": 0, "producer_id": 42}
    assert RecordingProducer.made == []


@pytest.mark.parametrize("value", [5, 3.5, True, ["a"]])
def test_a_value_neither_binary_nor_text_fails_naming_the_row(value):
    with pytest.raises(SinkError, match="row 1 of this task: 'value' must be binary or a string"):
        write([{"value": b"ok"}, {"value": value}])


def test_a_boolean_partition_is_not_taken_for_an_index():
    with pytest.raises(SinkError, match="row 0 of this task: .*partition"):
        write([{"value": b"x", "partition": True}])


def test_an_attribute_holding_the_property_separator_is_refused_not_stored_cut():
    """Read back, 'a\\x02b' would be the attribute 'a' (the \\x02 marks properties): refuse the row instead."""
    with pytest.raises(SinkError, match="row 0 of this task.*attribute"):
        write([{"value": b"x", "attribute": "a\x02b"}])
    with pytest.raises(SinkError, match="row 0 of this task"):
        write([{"value": b"x", "properties": {"p": "a\x01b"}}])


@pytest.mark.parametrize("types, problem", [
    ({"value": "bigint"}, "'value' must be binary or string, not bigint"),
    ({"value": "binary", "topic": "int"}, "'topic' must be string, not int"),
    ({"value": "binary", "attribute": "binary"}, "'attribute' must be string, not binary"),
    ({"value": "binary", "partition": "double"}, "'partition' must be"),
    ({"value": "binary", "properties": "map<string,int>"}, "'properties' must be map<string,string>"),
])
def test_column_types_the_sink_cannot_write_are_refused_when_the_write_is_planned(types, problem):
    with pytest.raises(ValueError, match=problem):
        check_columns(list(types), OPTS, types)


def test_column_types_the_sink_writes():
    check_columns(["value", "topic", "key", "partition", "attribute", "properties"], OPTS,
                  {"value": "string", "topic": "string", "key": "string", "partition": "int", "attribute": "string",
                   "properties": "map<string,string>"})
    check_columns(["value", "partition"], OPTS, {"value": "binary", "partition": "bigint"})
    check_columns(["value", "partition"], OPTS, {"value": "binary", "partition": "string"})
