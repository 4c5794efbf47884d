"""RocketMQ 5's Telemetry stream, once its call signed in: the Settings exchange (a producer's topics registered for
the check-back, ``producers.py``; a consumer's FIFO and delivery attempts kept, ``consumers.py``; each answered with
the proxy's policies), an admin's questions answered (``clientcommands.py``), and the stream seen and closed for
the renewer (``renewer.py``). Its refusals are out of band: GrpcError ends the stream.
"""

from metaq.groups import policy as group_policy
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.calls import client_of, status
from metaq.rmq5.consumers import CONSUMER_ATTEMPTS
from metaq.rmq5.wire import GrpcError, Status

#: What a producer's settings get back (the proxy's defaults): its retry policy.
PRODUCER_ATTEMPTS = 3
#: What a consumer's settings get back (the proxy's defaults).
RECEIVE_BATCH = 32
LONG_POLLING_S = 20
CONSUMER_BACKOFF_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)


class Telemetry:
    """The stream's commands, given what they use: the store (the groups' settings), ``max_body`` (what a
    producer's Settings are told), the renewer and the admin's ``clientcommands.ClientCommands`` (None: not
    told), the ``consumers.ConsumerClients`` table and the ``producers.ProducerStreams``."""

    def __init__(self, store, max_body, renewer, clients, consumers, producers):
        self.store = store
        self.max_body = max_body
        self.renewer = renewer
        self.clients = clients
        self.consumers = consumers
        self.producers = producers

    def command(self, call, command):
        """The answer (a TelemetryCommand, serialized) to one parsed ``command`` of ``call``'s stream, or None
        (nothing to answer); GrpcError ends the stream (the proxy's out-of-band codes)."""
        which = command.WhichOneof("command")
        client = client_of(call)
        if self.renewer is not None:
            self.renewer.stream_seen(client, call)
        if self.clients is not None:
            self.clients.stream_seen(client, call)
            if which in ("thread_stack_trace", "verify_message_result"):
                self.clients.answer(call, command)  # an admin's question answered (clientcommands.py)
        if which != "settings":
            return None
        settings = command.settings
        answer = pb.Settings()
        answer.CopyFrom(settings)
        answer.metric.on = False
        if settings.WhichOneof("pub_sub") == "publishing":
            if client.id and call.push is not None:  # asked about its topics' half messages (check_round)
                self.producers.publish(client, call, settings.publishing.topics)
            policy = answer.backoff_policy
            policy.Clear()
            policy.max_attempts = PRODUCER_ATTEMPTS
            policy.exponential_backoff.initial.FromMilliseconds(10)
            policy.exponential_backoff.max.FromSeconds(1)
            policy.exponential_backoff.multiplier = 2.0
            answer.publishing.max_body_size = self.max_body
            answer.publishing.validate_message_type = True
        elif settings.WhichOneof("pub_sub") == "subscription":
            attempts = settings.backoff_policy.max_attempts
            attempts = CONSUMER_ATTEMPTS if attempts <= 0 else attempts
            group = settings.subscription.group.name  # its settings' max_retries + 1 win (groups/policy.py)
            group_settings = self.store.groups.get(group) if group else None
            attempts = group_policy.max_attempts(group_settings, attempts)
            asked = settings.subscription.fifo
            if client.id:
                self.consumers.remember(client, asked, attempts)
            policy = answer.backoff_policy
            policy.Clear()
            policy.max_attempts = attempts
            for s in CONSUMER_BACKOFF_S:
                policy.customized_backoff.next.add().FromSeconds(s)
            answer.subscription.fifo = group_policy.fifo(group_settings, asked)
            answer.subscription.receive_batch_size = RECEIVE_BATCH
            answer.subscription.long_polling_timeout.FromSeconds(LONG_POLLING_S)
        else:
            raise GrpcError(Status.INVALID_ARGUMENT, "BAD_REQUEST: settings with neither publishing nor "
                            "subscription")
        return pb.TelemetryCommand(status=status("OK"), settings=answer).SerializeToString()

    def closed(self, call):
        """``call``'s Telemetry stream ended: it is no longer asked about half messages, nor by an admin; its
        client's last stream closed, what it holds is no longer renewed (``renewer.py``)."""
        client = client_of(call)
        if self.clients is not None:
            self.clients.stream_closed(client, call)
        if self.renewer is not None:
            self.renewer.stream_closed(client, call)
        self.producers.unpublish(client, call)
