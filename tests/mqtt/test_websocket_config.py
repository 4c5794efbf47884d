"""The WebSocket settings of the MQTT port (docs/mqtt.md "Over WebSocket"): each wrong one refused in words."""

import pytest

from metaq.serving import limits as serving_limits
from metaq.errors import ConfigError
from metaq.server.config import load_config

TLS = {"security.tls.mode": "on", "security.tls.cert": "c.pem", "security.tls.key": "k.pem"}


def test_websocket_settings_are_checked():
    cfg = load_config(None, {"mqtt.port": 1883, "mqtt.ws_port": 8083})
    assert (cfg.mqtt.ws_port, cfg.mqtt.ws_path, cfg.mqtt.ws_allowed_origins) == (8083, "/mqtt", [])
    with pytest.raises(ConfigError, match="set mqtt.port too"):
        load_config(None, {"mqtt.ws_port": 8083})
    with pytest.raises(ConfigError, match="mqtt.wss_port is WebSocket over TLS: set security.tls"):
        load_config(None, {"mqtt.port": 1883, "mqtt.wss_port": 8084})
    assert load_config(None, dict(TLS, **{"mqtt.port": 1883, "mqtt.wss_port": 8084})).mqtt.wss_port == 8084
    with pytest.raises(ConfigError, match="each listener needs its own port"):
        load_config(None, {"mqtt.port": 1883, "mqtt.ws_port": 1883})
    with pytest.raises(ConfigError, match="ws_path"):
        load_config(None, {"mqtt.port": 1883, "mqtt.ws_port": 8083, "mqtt.ws_path": "mqtt"})
    most = ["https://h%d.example" % i for i in range(serving_limits.WS_MAX_ALLOWED_ORIGINS)]
    assert len(load_config(None, {"mqtt.port": 1883, "mqtt.ws_allowed_origins": most}).mqtt.ws_allowed_origins) \
        == serving_limits.WS_MAX_ALLOWED_ORIGINS
    with pytest.raises(ConfigError, match="ws_allowed_origins"):
        load_config(None, {"mqtt.port": 1883, "mqtt.ws_allowed_origins": most + ["https://one.more"]})


def test_ws_with_users_off_loopback_is_refused_unless_insecure(tmp_path):
    authed = dict(TLS, **{"security.acl_file": str(tmp_path / "acl.yaml"), "broker.host": "0.0.0.0",
                          "mqtt.port": 8883, "mqtt.ws_port": 8083})
    with pytest.raises(ConfigError, match="mqtt.ws_port listens on 0.0.0.0, not a loopback address, with "
                                          "authentication on: ws:// is never TLS"):
        load_config(None, authed)
    assert load_config(None, dict(authed, **{"security.insecure": True})).mqtt.ws_port == 8083
    assert load_config(None, dict(authed, **{"mqtt.ws_port": None, "mqtt.wss_port": 8084})).mqtt.wss_port == 8084

