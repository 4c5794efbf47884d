"""The gRPC port's consumer clients table: each consumer client's Settings as its receives use them (FIFO, maximum
delivery attempts), at most ``limits.GRPC_MAX_CONSUMER_CLIENTS`` clients and, per user, its ``consumer_clients``
quota, so one user's many client ids never push out another user's live Settings. Written by Telemetry's Settings,
read by QueryAssignment and ReceiveMessage, freed by NotifyClientTermination.
"""

import time
from collections import OrderedDict
from typing import NamedTuple

from metaq import errors
from metaq.rmq5 import limits as rmq5_limits
from metaq.rmq5.calls import client_of
from metaq.rmq5.wire import GrpcError, Status

#: What a consumer's settings get back (the proxy's defaults): its delivery attempts when it names none.
CONSUMER_ATTEMPTS = 17


class Consumer(NamedTuple):
    """A consumer client's Settings as its receives use them: it asked for order (``fifo``; its group's setting may
    ask too), and a message is delivered at most ``max_attempts`` times before its dead letter."""

    fifo: bool
    max_attempts: int


DEFAULT_CONSUMER = Consumer(False, CONSUMER_ATTEMPTS)


class ConsumerClients:
    """The table (see the module doc), given the guard whose quotas bound each user's share (None: no users)."""

    def __init__(self, guard):
        self.guard = guard
        self._consumers = OrderedDict()  # ClientKey -> Consumer: its Settings, at most GRPC_MAX_CONSUMER_CLIENTS
        self._by_user = {}  # user ("" without) -> OrderedDict(ClientKey -> when last heard, monotonic s)

    def __contains__(self, client):
        return client in self._consumers

    def clients(self):
        """The ``ClientKey`` of every client whose Settings are kept, heard from longest ago first."""
        return list(self._consumers)

    def settings_of(self, call):
        """The ``Consumer`` settings of the call's client (its Telemetry Settings), the defaults when it sent
        none (a client may receive without Settings, apache/rocketmq#5728). A known client is heard from now."""
        client = client_of(call)
        found = self._consumers.get(client)
        if found is None:
            return DEFAULT_CONSUMER
        self._heard(client, time.monotonic())
        return found

    def _heard(self, client, now):
        self._consumers.move_to_end(client)
        mine = self._by_user[client.user]
        mine[client] = now
        mine.move_to_end(client)

    def remember(self, client, fifo, max_attempts, now=None):
        """Keep the settings of ``client`` (a ``ClientKey``); a new client first gets room (``_room_for``, which
        may refuse it RESOURCE_EXHAUSTED: its Settings then ends its stream and nothing of it is kept)."""
        now = time.monotonic() if now is None else now
        if client not in self._consumers:
            self._room_for(client, now)
            self._by_user.setdefault(client.user, OrderedDict())
        self._consumers[client] = Consumer(fifo, max_attempts)
        self._heard(client, now)

    def _room_for(self, client, now):
        """Make room for a new consumer client, the one decision on the table's bounds. A user holds at most its
        ``consumer_clients`` quota and the broker ``limits.GRPC_MAX_CONSUMER_CLIENTS``: past either the client
        heard from longest ago (the user's own, or anyone's for the broker's bound) is forgotten when it is idle
        (``limits.GRPC_CLIENT_IDLE_MS``: taken for ended), else the new one is refused RESOURCE_EXHAUSTED, so one
        user's many client ids never push out another user's live Settings. With authentication off there is one
        tenant: the broker's bound forgets the oldest client, idle or not (it sends its Settings again)."""
        idle_before = now - rmq5_limits.GRPC_CLIENT_IDLE_MS / 1000.0
        user = client.user
        mine = self._by_user.get(user)
        if user and self.guard is not None and mine:
            try:
                self.guard.quotas.check(user, "consumer_clients", len(mine))
            except errors.QuotaExceeded as exc:
                oldest, heard = next(iter(mine.items()))
                if heard > idle_before:
                    raise GrpcError(Status.RESOURCE_EXHAUSTED, "TOO_MANY_REQUESTS: %s" % exc) from None
                self.forget(oldest)
        if len(self._consumers) < rmq5_limits.GRPC_MAX_CONSUMER_CLIENTS:
            return
        oldest = next(iter(self._consumers))
        if user and self._by_user[oldest.user][oldest] > idle_before:
            raise GrpcError(Status.RESOURCE_EXHAUSTED, "TOO_MANY_REQUESTS: the gRPC port keeps the Settings of %d "
                            "consumer clients (limits.GRPC_MAX_CONSUMER_CLIENTS), none idle; client %s refused"
                            % (rmq5_limits.GRPC_MAX_CONSUMER_CLIENTS, client.id))
        self.forget(oldest)

    def forget(self, client):
        """Forget ``client``'s Settings (it ended, or it is taken for ended): its place is free again."""
        self._consumers.pop(client, None)
        mine = self._by_user.get(client.user)
        if mine is not None:
            mine.pop(client, None)
            if not mine:
                del self._by_user[client.user]

    def held(self):
        """``{user: consumer clients whose Settings are kept}`` (``stats quotas``; None: no user)."""
        return {user or None: len(mine) for user, mine in self._by_user.items()}
