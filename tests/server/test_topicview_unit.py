"""The topic page as rendered (metaq/server/http/topicview.py), without a broker: where it may connect (its
Content-Security-Policy), every value escaped, and scripts that write text only and keep no credentials."""

from metaq.server.http import limits as http_limits
from metaq.server.http.topicview import TopicPage, WebSocketPorts, keep_alive_s, policy

HOSTILE = '"><script>alert(1)</script>'


class _Session:
    user = HOSTILE


class _Request:
    session = _Session()
    environ = {"HTTP_HOST": "127.0.0.1:8180"}


def test_the_pages_policy_allows_its_scripts_and_the_brokers_websocket_listeners_on_the_pages_host_only():
    ports = WebSocketPorts(8083, 8084)
    assert policy("127.0.0.1:8180", ports) == ("default-src 'self'; connect-src 'self' ws://127.0.0.1:8083 "
                                               "wss://127.0.0.1:8084; object-src 'none'; base-uri 'none'; "
                                               "form-action 'none'; frame-ancestors 'none'")
    assert "connect-src 'self' ws://[::1]:8083 wss://[::1]:8084;" in policy("[::1]:8180", ports)
    assert "connect-src 'self' wss://broker.example.com:8084;" in policy("broker.example.com",
                                                                         WebSocketPorts(None, 8084))
    for host in (HOSTILE, "a b", "x;script-src *", "", None):
        assert "connect-src 'self';" in policy(host, ports), host


def test_the_page_escapes_the_user_and_the_path_and_carries_the_limits():
    page = TopicPage(WebSocketPorts(8083, None, '/m"<q>'))
    reply = page.page(_Request())
    body = reply.body.decode()
    assert HOSTILE not in body and "<q>" not in body and body.count("<script") == 2
    assert 'value="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in body
    assert 'data-ws-port="8083" data-wss-port="" data-ws-path="/m&quot;&lt;q&gt;"' in body
    assert 'data-max-messages="%d"' % http_limits.DASHBOARD_MAX_MESSAGES in body
    assert 'data-max-packet="%d"' % http_limits.DASHBOARD_MAX_PACKET_BYTES in body
    assert "ws://127.0.0.1:8083" in dict(reply.headers)["Content-Security-Policy"]


def test_the_scripts_write_text_only_and_keep_no_credentials():
    page = TopicPage(WebSocketPorts())
    for script in (page.client.decode(), page.script.decode()):
        for never in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "localStorage",
                      "sessionStorage", "document.cookie", "indexedDB", "eval("):
            assert never not in script, never
    assert "this.opts.password = null" in page.client.decode()  # dropped once the CONNECT is sent


def test_the_page_asks_its_keep_alive_or_the_ports_bound_when_lower():
    at = http_limits.DASHBOARD_KEEPALIVE_S
    assert [keep_alive_s(bound) for bound in (0, at + 1, at, at - 1, 1)] == [at, at, at, at - 1, 1]
    assert 'data-keepalive="%d"' % at in TopicPage(WebSocketPorts(8083)).page(_Request()).body.decode()
    assert 'data-keepalive="4"' in TopicPage(WebSocketPorts(8083, max_keep_alive_s=4)).page(_Request()).body.decode()
