"""``metaq-admin clients stack <client-id>`` and ``metaq-admin clients verify <client-id> <message-id> --topic T``:
ask a connected RocketMQ 5 client for its thread stacks, or to consume one stored message directly
(docs/rocketmq5.md "Asking a connected client"; the broker's side is ``rmq5/clientcommands.py``). With
authentication on, an id that clients of several users have is refused with the users named: ``user/id`` names one.

The client is connected to one broker: every broker of the view is asked (text ``client_command``, the admin
permission) until one has it; the first answer is printed (``--json``: the broker's body). Exit 0 when the client
answered OK, 3 when it answered with another status (the verify failed) or a broker refused, 3 when no broker has
the client (each broker's reason), 1 when a broker could not be reached and none had it.
"""

import json

from metaq.rmq5 import limits as rmq5_limits
from metaq.client.admin.tools import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, AdminExit, ask_brokers
from metaq.admin.wire import ClientCommand, decode_body
from metaq.client.replies import reply_error

__all__ = ["add_parser", "run"]


def add_parser(sub):
    s = sub.add_parser("clients", help="ask a connected RocketMQ 5 (gRPC) client: its thread stacks, or to consume "
                       "one message directly")
    actions = s.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_text in (("stack", "the client's thread stacks"),
                            ("verify", "the client consumes the message directly and says how it went")):
        a = actions.add_parser(name, help=help_text)
        a.add_argument("client", help="the client's id (its x-mq-client-id), or user/id when clients of several "
                       "users have that id")
        if name == "verify":
            a.add_argument("message_id", help="the message's id (the client's message id)")
            a.add_argument("--topic", required=True, help="the message's topic")
        a.add_argument("--wait", type=float, default=rmq5_limits.GRPC_CLIENT_COMMAND_TIMEOUT_MS / 1000.0,
                       help="seconds to wait for the client's answer (default %%(default)s, at most %d)"
                       % (rmq5_limits.GRPC_CLIENT_COMMAND_MAX_TIMEOUT_MS // 1000))


def event_of(args):
    """The ``ClientCommand`` the arguments ask for; AdminExit (usage) for a wait out of range."""
    wait_ms = int(args.wait * 1000)
    if not 1 <= wait_ms <= rmq5_limits.GRPC_CLIENT_COMMAND_MAX_TIMEOUT_MS:
        raise AdminExit("clients: --wait %s: more than 0 and at most %d s" % (
            args.wait, rmq5_limits.GRPC_CLIENT_COMMAND_MAX_TIMEOUT_MS // 1000), EXIT_USAGE)
    if args.action == "verify":
        return ClientCommand("verify", args.client, args.topic, args.message_id, wait_ms, 0)
    return ClientCommand("stack", args.client, None, None, wait_ms, 0)


def run(view, args, json_out):
    """Ask the brokers of ``view`` in turn; print the first answer. Returns the exit code."""
    event = event_of(args)
    missing = []
    for bid, reply in ask_brokers(view, event, view.timeout + event.timeout_ms / 1000.0, _refused, missing):
        body = dict(decode_body(reply.body), broker=bid)
        print(json.dumps(body, indent=2, sort_keys=True) if json_out else _text(body), flush=True)
        return EXIT_OK if body["status"] == "OK" else EXIT_REFUSED
    if view.problems:
        return EXIT_OK  # the unreachable brokers are reported (exit 1)
    raise AdminExit("no broker has client %s: %s" % (event.client, "; ".join(missing)), EXIT_REFUSED)


def _refused(bid, reply):
    return "broker %d: %s" % (bid, reply_error(reply))


def _text(body):
    name = "%s/%s" % (body["user"], body["client"]) if body.get("user") else body["client"]
    head = "client %s on broker %d: %s%s" % (name, body["broker"], body["status"],
                                             " (%s)" % body["message"] if body["message"] else "")
    if body["kind"] == "stack":
        return head + "\n" + body["thread_stack_trace"]
    return head + "\nmessage %s of %s: %s" % (body["message_id"], body["topic"], body["result"] or "no result")
