"""A WebSocket client's control frames with no MQTT bytes between (``WsStream``, ``WS_CONTROL_FRAMES_WITHOUT_DATA``):
a flood of them ends the stream; a receive-only client's keep-alive pings, each more than ``WS_CONTROL_QUIET_S``
after the one before, never do."""

import time

from metaq.serving import limits as serving_limits
from tests.harness.websocket import upgraded_stream

PING = b"\x89\x80\0\0\0\0"  # a masked PING with no payload (a zero key)


def test_keep_alive_pings_apart_never_end_the_stream_a_run_of_them_does(monkeypatch):
    monkeypatch.setattr(serving_limits, "WS_CONTROL_QUIET_S", 0.02)
    ws, _theirs = upgraded_stream()
    for _ in range(serving_limits.WS_CONTROL_FRAMES_WITHOUT_DATA * 2):
        time.sleep(0.03)  # further apart than the quiet time: each starts the count again
        ws._frames_in(PING)
    assert not ws._eof
    ws, _theirs = upgraded_stream()
    for _ in range(serving_limits.WS_CONTROL_FRAMES_WITHOUT_DATA):
        ws._frames_in(PING)
    assert not ws._eof  # at the limit
    ws._frames_in(PING)
    assert ws._eof  # one past it, within the quiet time of each other
