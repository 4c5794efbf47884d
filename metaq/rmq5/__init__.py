"""RocketMQ 5's gRPC clients: ``apache.rocketmq.v2.MessagingService`` over HTTP/2 on the connection core
(docs/rocketmq5.md).

It serves routes (every broker of a ZooKeeper cluster), heartbeats, sends (normal, FIFO message groups, delivery
times, transactional messages), EndTransaction, RecallMessage, Telemetry (the settings exchange, the check-back
of half messages, an admin's questions: thread stacks, a message consumed directly) and receiving (POP:
assignments, receives, acks, invisible durations, dead letters, over the store's PopService) and pull consumers
(offset reads and the group offsets of the consumer-offset store); lite topics are answered UNIMPLEMENTED.

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    messages.proto   our description of the protocol (package ``apache.rocketmq.v2``, the public definition's
                     messages, enums, field numbers and service), written for metaq
    messages_pb2.py  protoc's Python code of it: generated at setup (tools/protos.py), never committed
    wire.py          gRPC's framing: length-prefixed messages (``MessageReader``, a named maximum checked on the
                     prefix), ``grpc-timeout``, the trailers (``grpc-status``, percent-encoded ``grpc-message``)
    http2.py         a server's HTTP/2 connection, sans-IO (RFC 9113): frames in, events out, frames to send; a
                     small record a stream, flow control both ways, the protocol errors; a frame past
                     SETTINGS_MAX_FRAME_SIZE refused from its header, each frame shown to the port's flood budgets as
                     its header arrives; HPACK by hpack
    headercache.py   HTTP/2 header blocks coded and checked once while a connection repeats them: hpack's encoder
                     and decoder reusing a block while the dynamic table stands still, and RFC 9113's checks of a
                     request's headers run once for a list the client repeats (``CheckedHeaders``)
    records.py       a RocketMQ 5 message checked as the proxy checks it (``Refusal`` names the in-band Code) and
                     laid out as the properties a remoting send stores (tag, keys, message id, message group, time);
                     recall handles
front-end (the server layer)
    rpcs.py          MessagingService: the dispatcher of the RPCs to their groups (below), after the call's client id
                     and RocketMQ 5's credentials (the one login decision)
    calls.py         what the groups share about a call: its client (ClientKey), in-band status, pacing
                     (paced_wait), a stored message as a client is given it (message_of)
    messagebytes.py  a stored message as a client is given it, decided once (message_fields) and written as
                     protobuf bytes in one pass (encode_fields: the C helper's, or its twin), as the served paths
                     send it; the answers of SendMessage and AckMessage are written the same way
    routing.py       Routes: QueryRoute, Heartbeat, NotifyClientTermination
    sends.py         Sends: SendMessage over the put path (timed messages through the timers), RecallMessage
    receives.py      Receives: QueryAssignment, ReceiveMessage, AckMessage, ChangeInvisibleDuration,
                     ForwardMessageToDeadLetterQueue over the store's PopService
    halves.py        Halves: transactional messages' half messages, EndTransaction, their check-back
    telemetry.py     Telemetry: the Settings exchange, an admin's answers, the renewer's streams
    consumers.py     ConsumerClients: consumer clients' Settings, bounded per broker and per user
    producers.py     ProducerStreams: which client's stream publishes to which topic (whom a check-back asks)
    pulls.py         PullService: PullMessage, UpdateOffset, GetOffset, QueryOffset over the store's offset reads,
                     the consumer offsets, the broker's long-poll waiters and the guard, registered in rpcs.py's table
    port.py          the listener on the connection core and its HTTP/2 connections (``http2``): streams, flow control,
                     the named limits (streams per connection, message bytes, header bytes, control frames and new
                     streams per window), deadlines, the loop shared, GOAWAY either way (a clean end)
    clientcommands.py  an admin's questions to a connected client on its Telemetry stream (PrintThreadStackTrace-
                     Command, VerifyMessageCommand), matched to the answers by nonce, bounded and timed
``metaq-admin clients stack|verify`` is the client's (``client/admin/clients.py``).
"""
