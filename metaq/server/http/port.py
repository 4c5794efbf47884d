"""The HTTP port assembled: the route table (API, metrics, dashboard) on a listener of the connection core.

``HttpPort`` is given what it reads and does (``api.BrokerViews`` and a few callables), never the Broker.
Other parts of the broker add their routes with ``HttpPort.router.add`` (``routes.Router``): the seam for
admin operations (offset resets, topic changes, dead letters).
"""

from metaq.server.http import api, dashboard, topicview
from metaq.server.http.metrics import BrokerCollector, Metrics
from metaq.server.http.origin import BrowserCheck
from metaq.protocol.httpreply import OPEN, READ
from metaq.server.http.routes import Router
from metaq.server.http.server import HttpFrontEnd, UnsentReplies

#: The names of the broker's listeners, as ``metaq_connections{listener=...}`` labels them.
LISTENERS = ("text", "remoting", "replication", "http", "grpc")


class HttpPort:
    def __init__(self, core, views, transactions, observe_flushes, open_metrics=True, browser_check=None,
                 unsent=None, quotas=list, websocket=None):
        """``views``: api.BrokerViews; ``transactions``: () -> [TxInfo]; ``quotas``: () -> [QuotaRow] per user and
        quota (shown to admins and open scrapes only); ``observe_flushes(callback)``: the
        flusher's hook, given each round's fsync seconds; ``open_metrics``: /metrics without authentication;
        ``browser_check``: an ``origin.BrowserCheck`` (cross-site writes, DNS rebinding; default: the machine's
        names only); ``unsent``: the port's budget of replies not yet read (``server.UnsentReplies``);
        ``websocket``: the MQTT port's WebSocket listeners the topic page connects to
        (``topicview.WebSocketPorts``; None: off)."""
        self.views = views
        self.router = Router(views.guard, browser_check=browser_check or BrowserCheck())
        api.add_routes(self.router, views)
        def collector(may_see=None):
            return BrokerCollector(views.counters, views.summary, lambda: views.topic_list(may_see),
                                   lambda: views.group_list(may_see), views.roles.stats_values,
                                   lambda: {name: core.count(name) for name in LISTENERS}, transactions,
                                   quotas if may_see is None else list)

        # closed: each user's scrape shows what it may subscribe to (open: a scraper's view of every name)
        self.metrics = Metrics(collector(), None if open_metrics else views.guard, collector)
        observe_flushes(self.metrics.observe_flush)
        self.router.add("GET", "/metrics", OPEN if open_metrics else READ, self.metrics.scrape)
        dashboard.add_routes(self.router, dashboard.Dashboard(views))
        topicview.add_routes(self.router, topicview.TopicPage(websocket or topicview.WebSocketPorts(path="")))
        self.front = HttpFrontEnd(core, self.router, unsent or UnsentReplies())

    @property
    def port(self):
        return self.front.port

    def listen(self, host, port):
        return self.front.listen(host, port)
