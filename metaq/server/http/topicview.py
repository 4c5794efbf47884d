"""The dashboard's live topic page (``/dashboard/topics``): a topic filter watched and published to over MQTT from
the browser, through the MQTT port's WebSocket listener (docs/operating.md "A topic, live over MQTT").

The broker renders the page with where its WebSocket listeners are (ports and path, ``WebSocketPorts``) and the
page's limits (``limits.DASHBOARD_*``); the script then connects to the host name the page was loaded from:
``ws://`` for a page over http, ``wss://`` (``mqtt.wss_port``) for one over https. ``static/mqtt.js`` is the MQTT
3.1.1 client (our own: a broker installed from a wheel has no Node to bundle a third party's), ``static/topics.js``
the page. The MQTT connection is the user's own: the name and secret typed into the page go in its CONNECT only
and are kept nowhere else, so the broker's login and permissions decide as for any client. The page's
Content-Security-Policy lets it load only its own scripts and connect only to those listeners of its host.
"""

import dataclasses
import html
import os
import re
from typing import Optional

from metaq.server.http import limits as http_limits
from metaq.protocol.httpreply import READ, Response

_STATIC = os.path.join(os.path.dirname(__file__), "static")
#: A Host header this page writes into its Content-Security-Policy: a name or an address, with or without a port.
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253})(:[0-9]{1,5})?$")


@dataclasses.dataclass(frozen=True)
class WebSocketPorts:
    """Where the MQTT port's WebSocket listeners are (``mqtt.ws_port``, ``mqtt.wss_port``, ``mqtt.ws_path``); a
    port is None when off. ``max_keep_alive_s``: the port's bound on a client's Keep Alive (``mqtt.max_keep_alive_s``,
    0: none), which the page's asks within (``keep_alive_s``)."""

    ws_port: Optional[int] = None
    wss_port: Optional[int] = None
    path: str = "/mqtt"
    max_keep_alive_s: int = 0


def keep_alive_s(bound):
    """The Keep Alive the page's client asks: ``DASHBOARD_KEEPALIVE_S``, or the MQTT port's bound (``bound``, 0: none)
    when that is lower, since the port refuses an MQTT 3.1.1 CONNECT that asks more."""
    return min(http_limits.DASHBOARD_KEEPALIVE_S, bound) if bound else http_limits.DASHBOARD_KEEPALIVE_S


def _read(name):
    with open(os.path.join(_STATIC, name), "rb") as f:
        return f.read()


def policy(host_header, ports):
    """The page's Content-Security-Policy: its own scripts and style only, and WebSocket connections only to
    ``ports`` on the host the browser named (``host_header``; none when it is not a plain host)."""
    found = _HOST.match(host_header or "")
    connect = ["'self'"]
    if found is not None:
        host = found.group(1)
        connect += ["%s://%s:%d" % (scheme, host, port)
                    for scheme, port in (("ws", ports.ws_port), ("wss", ports.wss_port)) if port]
    return ("default-src 'self'; connect-src %s; object-src 'none'; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'"
            % " ".join(connect))


class TopicPage:
    """The page and its two scripts; ``ports`` a WebSocketPorts (all None: the page says MQTT over WebSocket is
    off)."""

    def __init__(self, ports):
        self.ports = ports
        self.client = _read("mqtt.js")
        self.script = _read("topics.js")

    def page(self, request):
        session = request.session
        user = getattr(session, "user", None) or ""
        p = self.ports
        attrs = {"ws-port": p.ws_port or "", "wss-port": p.wss_port or "", "ws-path": p.path,
                 "max-messages": http_limits.DASHBOARD_MAX_MESSAGES,
                 "max-packet": http_limits.DASHBOARD_MAX_PACKET_BYTES,
                 "shown-payload": http_limits.DASHBOARD_SHOWN_PAYLOAD_BYTES,
                 "max-inflight": http_limits.DASHBOARD_MAX_INFLIGHT, "keepalive": keep_alive_s(p.max_keep_alive_s)}
        data = " ".join('data-%s="%s"' % (k, html.escape(str(v), quote=True)) for k, v in attrs.items())
        body = _PAGE % {"data": data, "user": html.escape(user, quote=True)}
        return Response(200, body, "text/html; charset=utf-8",
                        [("Content-Security-Policy", policy(request.environ.get("HTTP_HOST"), p))])

    def client_js(self, request):
        return Response(200, self.client, "text/javascript; charset=utf-8")

    def page_js(self, request):
        return Response(200, self.script, "text/javascript; charset=utf-8")


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>metaq: a topic, live over MQTT</title>
<link rel="stylesheet" href="/dashboard.css">
</head>
<body %(data)s>
<h1>metaq: a topic, live over MQTT</h1>
<p><a href="/dashboard">the dashboard</a></p>
<p id="endpoint">MQTT over WebSocket: …</p>
<form id="login" autocomplete="off">
<label>user <input id="user" name="user" value="%(user)s" autocomplete="off"></label>
<label>secret <input id="secret" name="secret" type="password" autocomplete="off"></label>
<button id="connect" type="submit">connect</button>
<button id="disconnect" type="button" disabled>disconnect</button>
</form>
<p id="state">not connected</p>
<section><h2>Watch</h2>
<form id="watch"><label>topic filter <input id="filter" value="#"></label>
<label>QoS <select id="sub-qos"><option>0</option><option selected>1</option></select></label>
<button id="subscribe" type="submit" disabled>subscribe</button></form>
<ul id="subscriptions"></ul>
<table id="messages"><thead><tr><th>#</th><th>topic</th><th>QoS</th><th>retained</th><th>payload</th></tr></thead>
<tbody></tbody></table></section>
<section><h2>Publish</h2>
<form id="publish"><label>topic <input id="pub-topic"></label>
<label>payload <textarea id="pub-payload" rows="2"></textarea></label>
<label>QoS <select id="pub-qos"><option>0</option><option selected>1</option></select></label>
<label><input id="pub-retain" type="checkbox"> retained</label>
<button id="send" type="submit" disabled>publish</button></form>
<ul id="published"></ul></section>
<script src="/dashboard/mqtt.js"></script>
<script src="/dashboard/topics.js"></script>
</body>
</html>
"""


def add_routes(router, page):
    router.add("GET", "/dashboard/topics", READ, page.page)
    router.add("GET", "/dashboard/mqtt.js", READ, page.client_js)
    router.add("GET", "/dashboard/topics.js", READ, page.page_js)
