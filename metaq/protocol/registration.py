"""The ports a broker member publishes in ZooKeeper beside MetaQ's own nodes (ours, not MetaQ's): their node names
and JSON, written by ``server/registry.py``, read by ``server/routes.py`` (RocketMQ routes) and ``metaq-admin
brokers`` (a device fleet's provisioning, an operator). Sans-IO: names and bytes only.

Under ``<root>/brokers/ids/<id>/``, ephemeral, one node per member and kind, ``<kind>-master`` for the master and
``<kind>-slave<N>`` for replication slave N (the member's role, as ``master`` / ``slave<N>`` say its text url):

    rocketmq-master  {"name": broker name, "remoting": "ip:port" or null, "grpc": "host:port" or null}
    mqtt-master      {"address": "host:port", "tls": "off" | "on" | "permissive"}
    http-master      {"address": "host:port", "tls": "off" | "on" | "permissive"}

``tls`` is ``security.tls.mode``, which every listener shares: the MQTT port is MQTT over TLS when ``on`` (the HTTP
port HTTPS), takes both when ``permissive``; there is no second port of a kind. A member without the port writes no
node of that kind.
"""

import json

ROCKETMQ, MQTT, HTTP = "rocketmq", "mqtt", "http"
KINDS = (ROCKETMQ, MQTT, HTTP)
#: The kinds whose node is ``listener_data``: one port, its address and TLS mode.
LISTENERS = (MQTT, HTTP)
TLS_MODES = ("off", "on", "permissive")
#: Why a master with an MQTT port and ZooKeeper is no member of the MQTT cluster (``mqtt_membership``).
NO_REPLICATION_PORT = "off (no replication port)"


def mqtt_membership(mqtt_port, zk_connect, replication_port):
    """Whether a master with these settings is a member of the MQTT cluster: ``"on"`` (its ``replication`` node names
    its replication port, where the other masters follow it, ``mqttcluster/members.py``), or why not:
    ``NO_REPLICATION_PORT`` (no master can follow it: what its MQTT clients publish reaches only its own
    subscribers); None without an MQTT port or ZooKeeper (no cluster to speak of). What ``stats`` (``mqtt_cluster``),
    ``metaq-admin cluster``, the broker's start warning and ``fab check`` say."""
    if not mqtt_port or not zk_connect:
        return None
    return "on" if replication_port else NO_REPLICATION_PORT


def member_node(kind, slave_id):
    """The node of ``kind`` of a member registered as master (``slave_id`` None) or as slave ``slave_id``."""
    return "%s-master" % kind if slave_id is None else "%s-slave%d" % (kind, slave_id)


def member_of(child):
    """``(kind, slave_id)`` of a child of ``ids/<id>`` that is such a node (``slave_id`` None for the master's),
    else None."""
    kind, sep, role = child.partition("-")
    if not sep or kind not in KINDS:
        return None
    if role == "master":
        return kind, None
    if role.startswith("slave") and role[5:].isdigit() and role[5:].isascii():
        return kind, int(role[5:])
    return None


def _dump(value):
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def rocketmq_data(name, remoting, grpc):
    return _dump({"name": name, "remoting": remoting, "grpc": grpc})


def listener_data(address, tls):
    """A ``LISTENERS`` node's JSON: the port's address as others dial it, and the TLS mode it speaks."""
    if tls not in TLS_MODES:
        raise ValueError("tls is one of %s, not %r" % (", ".join(TLS_MODES), tls))
    return _dump({"address": address, "tls": tls})


def load(data):
    """A node's JSON object, or None when it is not one (a node written by something else)."""
    try:
        value = json.loads(bytes(data).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def address(value):
    """A published address (a non-empty string), else None."""
    return value if isinstance(value, str) and value else None
