"""The MQTT port over TLS and with users, as every port (security.tls, security.acl_file): Mosquitto's clients with
the broker's CA, a plaintext client refused (docs/mqtt.md "Turning it on")."""

from metaq.mqtt import wire
from tests.harness.acl import SECRETS, secured_config
from tests.harness.mqtt import Raw, SubscribedMosquittoSub, mosquitto_pub, with_mqtt
from tests.harness.pki import Pki


def test_mosquitto_clients_over_tls_with_a_user(broker_factory, tmp_path):
    pki = Pki(tmp_path / "pki")
    b = broker_factory(with_mqtt(secured_config(tmp_path, tls=pki.tls_config("on"))))
    tls = ("--cafile", pki.ca, "-u", "alice", "-P", SECRETS["alice"])
    sub = SubscribedMosquittoSub(b, "orders/#", 1, 1, "mqttv5", *tls)  # its SUBSCRIBE is in before the publish
    r = mosquitto_pub(b, "orders/tls", "secured", 1, "mqttv5", *tls)
    assert r.returncode == 0, r.stderr
    out, err = sub.communicate(timeout=30)
    assert out.strip() == "orders/tls secured", err
    r = mosquitto_pub(b, "orders/tls", "x", 1, "mqttv5", "--cafile", pki.ca, "-u", "alice", "-P", "wrong")
    assert r.returncode != 0
    plain = Raw(b)  # plaintext on a TLS-only port: closed before any MQTT
    plain.send(wire.Connect(wire.MQTT_5, "plain"))
    assert plain.closed()
