"""RocketMQ 5's routes and a client's life: QueryRoute (this broker, its gRPC endpoint, the topic's partitions as
queues; with ZooKeeper every other broker of the cluster holding the topic), Heartbeat and NotifyClientTermination
(the renewer told the client lives or ended; its consumer Settings forgotten when it ends).
"""

from metaq import errors
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.calls import client_of, status
from metaq.rmq5.records import Refusal

#: The message types a route's queues accept (a metaq topic has no type).
ACCEPTED = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)

_WILDCARDS = ("0.0.0.0", "::", "")


class Routes:
    """The three RPCs, given what they use: the store (partition counts, the topic table), the guard (None: no
    authentication), the broker's name and id, ``endpoint()`` (the port's ``(host, port)`` as it listens),
    ``cluster(topic)`` (``MessagingService``'s: None names this broker alone), the renewer (None: nothing is
    renewed) and the ``consumers.ConsumerClients`` table."""

    def __init__(self, store, guard, broker_name, broker_id, endpoint, cluster, renewer, consumers):
        self.store = store
        self.guard = guard
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.endpoint = endpoint
        self.cluster = cluster
        self.renewer = renewer
        self.consumers = consumers

    def rpcs(self):
        """``{rpc: (request type, handler)}``, as ``MessagingService.unary`` holds them."""
        return {"QueryRoute": (pb.QueryRouteRequest, self.query_route),
                "Heartbeat": (pb.HeartbeatRequest, self.heartbeat),
                "NotifyClientTermination": (pb.NotifyClientTerminationRequest, self.notify_client_termination)}

    def query_route(self, request, call):
        """The topic's queues on this broker (from the store, with the topic table's permission) and, with
        ZooKeeper, on every other broker of the cluster whose master has a gRPC port (read and write: their topic
        tables are their own); a broker that does not hold the topic yet with our count for it (a cluster's brokers
        share their topic settings; the first send creates it there), so a new topic spreads over the cluster.
        Each broker is named with its master's endpoint, as id 0: on a slave, our broker id's master, even for a
        topic no broker has registered yet (its first send creates it).
        With authentication on, only a topic the user may publish to or subscribe to is answered (the proxy's
        ``Permission.ANY``; ``Guard.known_to``, what a topic list shows it); any other is FORBIDDEN whether it
        exists or not, so the refusal tells nothing of the topic."""
        topic = request.topic.name
        self._may_know(call, topic)
        rows = self.cluster(topic) if self.cluster is not None else None
        route, why = [], None
        try:
            queues = self.store.partitions_of(topic)
        except (errors.UnknownTopic, errors.InvalidTopic) as exc:
            queues, why = None, exc
        if queues is not None:
            s = self.store.topics.settings_of(topic)
            readable, writable = (True, True) if s is None else (s.readable, s.writable)
            permission = pb.READ_WRITE if readable and writable else pb.READ if readable else \
                pb.WRITE if writable else pb.NONE
            own = next((r for r in rows or () if r.broker_id == self.broker_id), None)
            if own is None and rows is not None:  # a topic not registered yet: our broker id's master all the same
                own = next((r for r in self.cluster(None) or () if r.broker_id == self.broker_id), None)
            mine = self._endpoints(request.endpoints)
            master = _endpoints_of(own.grpc) if own is not None and own.grpc else mine
            if master.addresses[0].port == mine.addresses[0].port and master.addresses[0].host in (
                    mine.addresses[0].host, self.endpoint()[0]):
                master = mine  # ourselves, as the client reached us
            broker = pb.Broker(name=self.broker_name, id=0, endpoints=master)
            route += [pb.MessageQueue(topic=request.topic, id=q, permission=permission, broker=broker,
                                      accept_message_types=ACCEPTED) for q in range(queues)]
        for r in rows or ():
            count = r.queues if r.queues > 0 else queues  # not held there yet: our count (see query_route)
            if r.broker_id == self.broker_id or not r.grpc or not count:
                continue
            broker = pb.Broker(name=r.name, id=0, endpoints=_endpoints_of(r.grpc))
            route += [pb.MessageQueue(topic=request.topic, id=q, permission=pb.READ_WRITE, broker=broker,
                                      accept_message_types=ACCEPTED) for q in range(count)]
        if not route:
            raise Refusal("TOPIC_NOT_FOUND", "no route for topic %s: %s" % (topic[:256], why or "no broker holds it"))
        return pb.QueryRouteResponse(status=status("OK"), message_queues=route)

    def _may_know(self, call, topic):
        """Refuse (FORBIDDEN) a topic the call's user may neither publish to nor subscribe to; the decision is the
        guard's (``known_to``), made from the names alone, before anything of the topic is looked at."""
        guard = self.guard
        known = guard.known_to(call.session) if guard is not None else None
        if known is not None and not known(topic):
            raise Refusal("FORBIDDEN", "permission denied: user %s may neither publish to nor subscribe to topic %s"
                          % (call.user or "(none)", topic[:256]))

    def _endpoints(self, access_point):
        """This port's endpoint as routes name it: the address it is bound to, or, bound to every interface, the
        host the client reached it by (its access point) with this port."""
        host, port = self.endpoint()
        if host in _WILDCARDS and access_point.addresses:
            host = access_point.addresses[0].host
        scheme = pb.IPv4 if _is_ipv4(host) else pb.IPv6 if ":" in host else pb.DOMAIN_NAME
        return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])

    def heartbeat(self, request, call):
        if self.renewer is not None:  # the client lives: what it holds is renewed on
            self.renewer.heard(client_of(call))
        return pb.HeartbeatResponse(status=status("OK"))

    def notify_client_termination(self, request, call):
        """The client ends: the messages it holds are no longer renewed, and visible again soon (the proxy's); its
        consumer Settings are forgotten."""
        client = client_of(call)
        self.consumers.forget(client)  # its Settings too: its share of the consumer clients is free again
        if self.renewer is not None:
            self.renewer.terminated(client)
        return pb.NotifyClientTerminationResponse(status=status("OK"))


def _endpoints_of(address):
    """``host:port`` (``[v6]:port``) as an ``apache.rocketmq.v2.Endpoints``."""
    host, _sep, port = address.rpartition(":")
    host = host.strip("[]")
    scheme = pb.IPv4 if _is_ipv4(host) else pb.IPv6 if ":" in host else pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=int(port))])


def _is_ipv4(host):
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)
