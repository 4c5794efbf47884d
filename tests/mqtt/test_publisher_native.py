"""The MQTT publisher's path names what runs (issue 68): its orchestration is Python (compiled where built), called by
name, never a function bound onto an object at run time; the C it keeps splits bytes into plain values."""

import ast
import pathlib

from metaq.mqtt.limits import MQTT_MAX_PACKET_BYTES
from metaq.mqtt import plainturn, wire
from metaq.mqtt.port import MqttPort
from metaq.mqtt.wire import MQTT_5, Publish, PubAck, encode
from tests.mqtt.test_plain_publishes import PARTITIONS, _plans

MQTT = pathlib.Path(wire.__file__).parent
PUBLISHER = ["port.py", "publishes.py", "acks.py", "plainturn.py"]
PLAIN = (str, bytes, int, bool, type(None))


#: The C functions the publisher's modules may choose: bytes in, plain values out.
BYTES_ONLY = {"mqtt_burst_frames"}


def _calls(name):
    """``(function name, first argument's constant or None)`` of each call in module ``name``."""
    out = set()
    for node in ast.walk(ast.parse((MQTT / name).read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            first = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            out.add((node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id, first))
    return out


def test_the_publishers_modules_bind_no_function_onto_an_object_and_choose_no_c_orchestration():
    for name in PUBLISHER:
        calls = _calls(name)
        assert not {c for c in calls if c[0] == "partial"}, name
        assert {c[1] for c in calls if c[0] == "load"} <= BYTES_ONLY, name


def test_the_direct_delivery_of_a_burst_is_a_method_of_the_port():
    assert callable(MqttPort.__dict__.get("deliver_now"))


def _plain(value):
    return all(_plain(v) for v in value) if isinstance(value, (tuple, list)) else isinstance(value, PLAIN)


def test_the_c_split_of_a_packet_and_of_a_read_gives_plain_values():
    """``wire.split`` and ``wire.read_publishes`` (C where built) give tuples of plain values, which the Python that
    calls them makes into packets and the burst's entries."""
    known = {b"a/b": "a/b"}
    data = encode(Publish("a/b", b"x", 1, packet_id=5), MQTT_5) + encode(PubAck(5, 0x10), MQTT_5)
    fields, _, end = wire.split(data, 0, MQTT_MAX_PACKET_BYTES, MQTT_5, known)
    assert _plain(fields) and wire.packet_of(fields) == Publish("a/b", b"x", 1, packet_id=5)
    fields, _, _ = wire.split(data, end, MQTT_MAX_PACKET_BYTES, MQTT_5, known)
    assert _plain(fields) and wire.packet_of(fields) == PubAck(5, 0x10)
    split, pos, qos1, nbytes, pubacks = wire.read_publishes(data[:end], 0, True, MQTT_MAX_PACKET_BYTES, _plans(),
                                                            dict(PARTITIONS), 10, 10, 1 << 20)
    assert _plain(split) and (pos, qos1, pubacks) == (end, 1, wire.encode_pubacks_py([5]))
    assert [e[4] for e in plainturn.entries_of(split)] == [Publish("a/b", b"x", 1, packet_id=5)]
