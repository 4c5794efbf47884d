"""``metaq-admin trace ID [--topic T]`` and ``metaq-admin trace --key KEY --topic T``: where is my message
(docs/operating.md "Where is my message"; the broker's side is ``trace/service.py``).

Every broker is asked (text ``trace``); each answers about the messages it stores. The id is checked here first
(``trace/records.parse_message_id``): a malformed one exits 2 without asking. Shown per message: where it is
stored, its ids, keys, tags and properties, the groups' committed offsets (past it or not), its POP state per
group, its retries and dead letters, and the RocketMQ message-trace records about it; ``--json`` prints the
brokers' answers as one list (each message with ``broker``). No broker having it exits 3 with each broker's reason;
a broker refusing (403: the user may not read the topic) exits 3 with the refusal.
"""

import json
from datetime import datetime, timezone

from metaq import errors
from metaq.trace import limits as trace_limits
from metaq.protocol.properties import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY
from metaq.client.admin.tools import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, AdminExit, ask_brokers
from metaq.trace.records import parse_message_id
from metaq.trace.wire import TraceQuery, decode_body

__all__ = ["add_parser", "run"]


def add_parser(sub):
    s = sub.add_parser("trace", help="where is my message: where it is stored, which groups consumed it, its POP "
                       "state, retries, dead letters and trace records")
    s.add_argument("id", nargs="?", help="the message id: a metaq id (with --topic), a RocketMQ offset id, or a "
                   "RocketMQ client's msgId (with --topic)")
    s.add_argument("--key", help="instead of an id: the messages of --topic carrying this key (newest first)")
    s.add_argument("--topic", help="the message's topic")
    s.add_argument("--max", type=int, default=trace_limits.TRACE_MAX_RESULTS,
                   help="at most this many messages per broker (default and most: %d)" % trace_limits.TRACE_MAX_RESULTS)


def query_of(args):
    """The ``TraceQuery`` the arguments ask for; AdminExit (usage, exit 2) for a malformed request."""
    if (args.id is None) == (args.key is None):
        raise AdminExit("trace: give a message id, or --key KEY with --topic", EXIT_USAGE)
    if not 1 <= args.max <= trace_limits.TRACE_MAX_RESULTS:
        raise AdminExit("trace: --max %d: 1 to %d (limits.TRACE_MAX_RESULTS)"
                        % (args.max, trace_limits.TRACE_MAX_RESULTS),
                        EXIT_USAGE)
    if args.key is not None:
        if args.topic is None:
            raise AdminExit("trace: --key needs --topic (keys are indexed per topic)", EXIT_USAGE)
        if not args.key or any(c.isspace() for c in args.key):
            raise AdminExit("trace: a key has no spaces", EXIT_USAGE)
        return TraceQuery("key", args.key, args.topic, args.max, 0)
    try:
        ref = parse_message_id(args.id)
    except errors.ClientError as exc:
        raise AdminExit("trace: %s" % exc, EXIT_USAGE) from None
    if ref.kind == "metaq" and args.topic is None:
        raise AdminExit("trace: a metaq id is found within its topic: add --topic", EXIT_USAGE)
    return TraceQuery("id", ref.text, args.topic, args.max, 0)


def run(view, args, json_out, render_table):
    """Ask every broker of ``view`` and print the answers (``--json``: one list); returns the exit code."""
    query = query_of(args)
    messages, missing = [], []
    for bid, reply in ask_brokers(view, query, max(view.timeout, 30.0), missing=missing):
        body = decode_body(reply.body)
        for m in body["messages"]:
            messages.append(dict(m, broker=bid, more=body["more"]))
    if not messages:
        if view.problems:
            return EXIT_OK  # the unreachable brokers are reported (exit 1)
        raise AdminExit("no broker has %s %s%s%s" % ("a message with key" if query.kind == "key" else "message",
                                                     query.value, " in topic %s" % query.topic if query.topic else "",
                                                     "".join("\n  " + m for m in missing)), EXIT_REFUSED)
    if json_out:
        print(json.dumps(messages, indent=2), flush=True)
    else:
        shown = [render_message(m, i + 1, len(messages), render_table) for i, m in enumerate(messages)]
        print("\n\n".join(shown), flush=True)
    return EXIT_OK


def _when(ms):
    if ms is None:
        return "-"
    return "%s (%d)" % (datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
                        ms)


def render_message(m, number, total, render_table):
    """One message's trace as sections of text (what ``metaq-admin trace`` prints without ``--json``);
    ``render_table(rows, columns)``: metaq-admin's table layout."""

    def _table(rows, columns):
        return "\n".join("  " + line for line in render_table(rows, columns).splitlines())

    lines = ["message %d of %d (broker %d)%s" % (number, total, m["broker"],
                                                 ": more messages match, raise --max or narrow the query"
                                                 if m.get("more") and number == total else "")]
    stored = [("topic", m["topic"]), ("partition", m["partition"]), ("offset", m["offset"]),
              ("position", m["position"]), ("size", m["size"]), ("stored", _when(m["store_ms"])),
              ("born", _when(m["born_ms"])), ("born host", m["born_host"] or "-"), ("metaq id", m["msg_id"]),
              ("offset id", m["offset_msg_id"] or "-"), ("msgId (UNIQ_KEY)", m["uniq_key"] or "-"),
              ("tags", m["tags"] or "-"), ("keys", m["keys"] or "-"), ("reconsume times", m["reconsume_times"]),
              ("body bytes", m["body_bytes"])]
    lines.append("stored:")
    lines.extend("  %-17s %s" % (k, v) for k, v in stored)
    shown = {k: v for k, v in m["properties"].items() if k not in (PROP_TAGS, PROP_KEYS, PROP_UNIQ_KEY)}
    if shown:
        lines.append("  %-17s %s" % ("properties", " ".join("%s=%s" % kv for kv in sorted(shown.items()))))
    lines.append("consumer groups (broker-kept offsets):")
    lines.append(_table([dict(c, consumed="yes" if c["consumed"] else "no") for c in m["consumers"]],
                        ["group", "offset", "consumed"]))
    lines.append("POP (per-message acknowledgement):")
    lines.append(_table([dict(p, invisible_until=_when(p["invisible_until_ms"]) if p["invisible_until_ms"] else None,
                              redelivered="yes" if p["redelivered"] else "no") for p in m["pop"]],
                        ["group", "state", "attempt", "invisible_until", "redelivered"]))
    lines.append("retries:")
    lines.append(_table(m["retries"], ["group", "topic", "partition", "offset", "reconsume_times", "store_ms"]))
    lines.append("dead letters:")
    lines.append(_table(m["dead_letters"], ["group", "topic", "partition", "offset", "reconsume_times", "store_ms"]))
    if not m["copies_complete"]:
        lines.append("  (the retry and dead-letter topics were read only in part: limits.TRACE_MAX_COPY_SCAN)")
    lines.append("trace records (%s):" % "RMQ_SYS_TRACE_TOPIC")
    lines.append(_table([dict(t, when=_when(t.get("timestamp_ms"))) for t in m["traces"]],
                        ["type", "when", "group", "success", "cost_ms", "retry_times", "keys"]))
    if not m["traces_complete"]:
        lines.append("  (more trace records than shown: limits.TRACE_MAX_RECORDS)")
    return "\n".join(lines)
