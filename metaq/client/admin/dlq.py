"""``metaq-admin dlq list GROUP`` and ``dlq resend GROUP [--id ID ...]``: a RocketMQ consumer group's dead letters
(docs/operating.md "Admin commands"; the broker's side is ``admin/service.py``).

``list`` asks every broker (text ``dlq_list``) for the records of ``%DLQ%<GROUP>``: position, id (the
``ORIGIN_MESSAGE_ID`` the consumer saw), original topic, tags, keys, deliveries, stored time, a body preview and
whether it was resent. ``resend`` (text ``dlq_resend``) puts every dead letter not resent yet, or those named by
``--id`` (an id or a ``b-p-o``/``p-o`` position), back on its original topic; a second resend skips them (the
broker's resent journal). An id no broker has exits 3.
"""

from metaq import errors, limits
from metaq.admin import limits as admin_limits
from metaq.admin import wire
from metaq.client.admin.tools import EXIT_OK, AdminExit, ask_broker, ask_brokers, refused_by

__all__ = ["add_parser", "run", "id_batches"]

#: Bytes of ids one ``dlq_resend`` line carries at most (the line itself is bounded by ``limits.MAX_LINE_BYTES``).
IDS_PER_LINE_BYTES = limits.MAX_LINE_BYTES - limits.MAX_NAME_BYTES - 64


def add_parser(sub):
    s = sub.add_parser("dlq", help="a RocketMQ consumer group's dead letters: list them, resend them")
    dlq = s.add_subparsers(dest="dlq_action", metavar="ACTION", required=True)
    s = dlq.add_parser("list", help="the group's dead letters (%%DLQ%%GROUP), oldest first")
    s.add_argument("group")
    s.add_argument("--max", type=int, default=100, help="at most this many per broker (default 100, at most %d)"
                   % admin_limits.MAX_DLQ_LIST)
    s = dlq.add_parser("resend", help="put dead letters back on their original topic (all not resent yet, or --id)")
    s.add_argument("group")
    s.add_argument("--id", dest="ids", action="append", metavar="ID",
                   help="only this dead letter: its id or position (p-o; b-p-o with several brokers); repeatable")


def id_batches(ids, budget=IDS_PER_LINE_BYTES):
    """``ids`` in comma-joined groups of at most ``budget`` bytes each (one ``dlq_resend`` line each)."""
    batches, batch, size = [], [], 0
    for i in ids:
        n = len(i.encode("utf-8")) + 1
        if n > budget:
            raise AdminExit("id %r is too long" % i[:64], 2)
        if batch and size + n > budget:
            batches.append(tuple(batch))
            batch, size = [], 0
        batch.append(i)
        size += n
    if batch:
        batches.append(tuple(batch))
    return batches


def _refused(bid, reply):
    hint = " (this needs a user with the admin role)" if reply.code == errors.Forbidden.code \
        and b"admin" not in reply.body else ""
    return refused_by(bid, reply) + hint


def _call(view, bid, event):
    """The JSON body of a 200, None for a 404 (no dead letters there) or an unreachable broker; AdminExit for other
    refusals (``tools.ask_broker``)."""
    reply = ask_broker(view, bid, event, max(view.timeout, 30.0), _refused)
    return None if reply is None else wire.decode_body(reply.body)


def _local(view, bid, name):
    """A ``--id`` as broker ``bid`` knows it (``b-p-o`` → ``p-o`` on broker b, None elsewhere)."""
    parts = name.split("-")
    if len(parts) == 3 and all(p.isdigit() for p in parts):
        return "%s-%s" % (parts[1], parts[2]) if int(parts[0]) == bid else None
    return name


def run(view, args, render):
    if args.dlq_action == "list":
        rows, found = [], False
        event = wire.DlqList(args.group, max(1, min(args.max, admin_limits.MAX_DLQ_LIST)), 0)
        for bid, reply in ask_brokers(view, event, max(view.timeout, 30.0), _refused):
            body = wire.decode_body(reply.body)
            found = True
            for d in body["dead_letters"]:
                rows.append(dict(d, broker=bid, position="%d-%s" % (bid, d["position"])))
        if not found and not view.problems:
            raise AdminExit("no broker has dead letters of group %s (no topic %%DLQ%%%s)" % (args.group, args.group))
        render(rows, ["position", "id", "topic", "tags", "keys", "reconsume_times", "stored_ms", "body_bytes", "body",
                      "resent"])
        return EXIT_OK
    rows, not_found, found = [], None, False
    for bid in sorted(view.brokers):
        names = None if args.ids is None else [n for n in (_local(view, bid, i) for i in args.ids) if n]
        batches = [None] if names is None else id_batches(names)
        for batch in batches:
            body = _call(view, bid, wire.DlqResend(args.group, batch, 0))
            if body is None:
                continue
            found = True
            for r in body["resent"]:
                rows.append({"position": "%d-%s" % (bid, r["position"]), "id": r["id"], "status": "resent",
                             "topic": r["topic"], "partition": "%d-%d" % (bid, r["partition"]), "offset": r["offset"]})
            missing = set()
            for s in body["skipped"]:
                if s["position"] is None:
                    missing.add(s["id"])
                else:
                    rows.append({"position": "%d-%s" % (bid, s["position"]), "id": s["id"],
                                 "status": "skipped: " + s["reason"]})
            not_found = missing if not_found is None else not_found & missing
    if not found and not view.problems:
        raise AdminExit("no broker has dead letters of group %s (no topic %%DLQ%%%s)" % (args.group, args.group))
    render(rows, ["position", "id", "status", "topic", "partition", "offset"])
    if not_found:
        raise AdminExit("no dead letter of group %s has id %s" % (args.group, ", ".join(sorted(not_found))))
    return EXIT_OK
