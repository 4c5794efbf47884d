"""``metaq-admin timers list [--topic T] [--max N]`` and ``timers cancel ID``: the timer store's pending messages
(docs/messaging.md "Any delivery time", "Cancel"; the broker's side is ``timers/service.py``).

``list`` asks every broker (text ``timers``) for its pending timers, earliest first: id, topic, partition, due
time and size. ``cancel`` asks every broker to cancel the id (text ``cancel``): the one that has it answers
``cancelled``, or says it was ``delivered`` or ``cancelled`` before; no broker knowing it exits 3.
"""

from metaq import errors
from metaq.timers import limits as timers_limits
from metaq.client.admin.tools import EXIT_OK, EXIT_REFUSED, AdminExit
from metaq.client.replies import reply_error
from metaq.timers.wire import TimerCancelCommand, TimerList, parse_rows

__all__ = ["add_parser", "run"]


def add_parser(sub):
    s = sub.add_parser("timers", help="messages scheduled for a delivery time: list them, cancel one")
    act = s.add_subparsers(dest="timers_action", metavar="ACTION", required=True)
    s = act.add_parser("list", help="pending timers, earliest first")
    s.add_argument("--topic", default="*", help="only this topic's")
    s.add_argument("--max", type=int, default=100, help="at most this many per broker (default 100, at most %d)"
                   % timers_limits.MAX_TIMER_LIST)
    s = act.add_parser("cancel", help="cancel a scheduled message by its id (before it is due)")
    s.add_argument("id", type=int)


def _call(view, bid, event):
    url = view.brokers[bid]
    try:
        return view.conn(url).call(event, timeout=max(view.timeout, 30.0))
    except errors.MetaqError as exc:
        view.problems.append("%s: %s" % (url, exc))
        return None


def _refused(bid, reply):
    hint = " (this needs a user with the admin role)" if reply.code == errors.Forbidden.code else ""
    return AdminExit("broker %d refused: %s%s" % (bid, reply_error(reply), hint), EXIT_REFUSED)


def run(view, args, render):
    if args.timers_action == "list":
        rows = []
        for bid in sorted(view.brokers):
            reply = _call(view, bid, TimerList(args.topic, max(1, min(args.max, timers_limits.MAX_TIMER_LIST)), 0))
            if reply is None:
                continue
            if reply.code != 200:
                raise _refused(bid, reply)
            for msg_id, topic, part, due, size in parse_rows(reply.body):
                rows.append({"broker": bid, "id": msg_id, "topic": topic, "partition": part, "due_ms": due,
                             "bytes": size})
        rows.sort(key=lambda r: (r["due_ms"], r["id"]))
        render(rows, ["broker", "id", "topic", "partition", "due_ms", "bytes"])
        return EXIT_OK
    answers = []
    for bid in sorted(view.brokers):
        reply = _call(view, bid, TimerCancelCommand(args.id, 0))
        if reply is None:
            continue
        if reply.code not in (200, 404):
            raise _refused(bid, reply)
        outcome = reply.body.decode("utf-8", "replace")
        if outcome != "unknown":
            answers.append({"broker": bid, "id": args.id, "outcome": outcome})
    if not answers:
        raise AdminExit("no broker knows a scheduled message with id %d" % args.id)
    render(answers, ["broker", "id", "outcome"])
    return EXIT_OK
