"""``metaq-admin topics``: the topic table (docs/concepts.md "Topics: the table, create, alter, delete").

    metaq-admin --brokers meta://127.0.0.1:8123 topics                      every topic and its settings
    metaq-admin --brokers meta://127.0.0.1:8123 topics create orders --partitions 4 --retention-hours 24
    metaq-admin --brokers meta://127.0.0.1:8123 topics alter orders --perm r
    metaq-admin --brokers meta://127.0.0.1:8123 topics delete orders --yes

Each change is sent to every broker of the view (``--zk``: every registered master; ``--brokers``) with the text
extension ``topic <action> <name> <settings> <opaque>`` (topics/wire.py); slaves take their master's
table. The exit code is 3 if a broker refused (its reason on stderr), 1 if one could not be reached.
"""

import json
import sys

from metaq import errors
from metaq.topics.wire import TopicCommand

ACTIONS = ("list", "create", "alter", "delete")
#: What each change printed says was done.
DONE = {"create": "created", "alter": "altered", "delete": "deleted"}
#: Seconds a change may take at the broker (an fsync of the table; a delete removes the topic's files).
CHANGE_TIMEOUT_S = 30.0
EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
#: Columns the table adds to the ``topics`` view.
SETTING_COLUMNS = ["perm", "ordered", "retention_hours", "retention_bytes", "priorities", "source"]


def add_parser(sub):
    s = sub.add_parser("topics", help="topics and their settings; topics create|alter|delete NAME changes the "
                       "topic table (docs/concepts.md 'Topics: the table, create, alter, delete')")
    s.add_argument("action", nargs="?", choices=ACTIONS, default="list", help="list (the default), create, alter, "
                   "delete")
    s.add_argument("name", nargs="?", help="the topic (create, alter, delete)")
    s.add_argument("--partitions", type=int, metavar="N", help="partitions (create: default 1; alter: only more)")
    s.add_argument("--perm", choices=("rw", "r", "w", "-"),
                   help="rw: read and write (default); r: puts refused; w: gets refused; -: both refused")
    s.add_argument("--ordered", action="store_true", default=None, help="an orderly topic (docs/concepts.md)")
    s.add_argument("--unordered", dest="ordered", action="store_false", help="alter: no longer ordered")
    s.add_argument("--retention-hours", metavar="H", help="keep messages H hours (fractions allowed; none: the "
                   "broker's store.retention_hours alone)")
    s.add_argument("--retention-bytes", metavar="B", help="keep the newest B bytes of the topic (none: no bound)")
    s.add_argument("--priorities", type=int, metavar="L", help="consumer priorities: L levels 2..8, 0..L-1 with L-1 "
                   "the highest (docs/messaging.md 'Priorities'; alter: only more)")
    s.add_argument("--priority-max-wait-ms", metavar="MS", help="a priority topic's starvation bound (none: the "
                   "default, limits.DEFAULT_PRIORITY_MAX_WAIT_MS)")
    s.add_argument("--yes", action="store_true", help="delete without asking")
    s.add_argument("--all", action="store_true", help="list: the broker's internal topics too (delayed delivery, "
                   "timers, groups' retry, dead-letter and resent topics, priority levels)")
    return s


def settings_of(args):
    """The settings the command line gives, as the wire takes them."""
    out = {}
    for key in ("partitions", "perm", "ordered", "retention_hours", "retention_bytes", "priorities",
                "priority_max_wait_ms"):
        value = getattr(args, key)
        if value is not None:
            out[key] = value
    return out


def call(view, url, action, name, settings):
    """``(code, parsed JSON or reason text)`` of one broker's answer; raises MetaqError if unreachable."""
    reply = view.conn(url).call(TopicCommand(action, name, tuple(settings.items()), 0),
                                timeout=max(view.timeout, CHANGE_TIMEOUT_S))
    text = bytes(reply.body).decode("utf-8", "replace")
    if reply.code != 200:
        return reply.code, text
    return 200, json.loads(text)


def table_rows(view):
    """``{topic: settings}`` from every broker's ``topic list`` (the first broker that knows a topic wins)."""
    out = {}
    for _bid, url in sorted(view.brokers.items()):
        try:
            code, rows = call(view, url, "list", None, {})
        except (errors.MetaqError, ValueError) as exc:
            view.problems.append("%s: topic list: %s" % (url, exc))
            continue
        if code != 200:
            view.problems.append("%s: topic list answered %d %s" % (url, code, rows))
            continue
        for row in rows:
            out.setdefault(row["name"], row)
    return out


def run(view, args):
    """create / alter / delete on every broker of ``view``; returns an exit code (prints what happened)."""
    if not args.name:
        print("metaq-admin: topics %s needs a topic name" % args.action, file=sys.stderr)
        return EXIT_USAGE
    settings = settings_of(args)
    if args.action == "delete":
        if settings:
            print("metaq-admin: topics delete takes no settings", file=sys.stderr)
            return EXIT_USAGE
        if not args.yes and not _confirm(args.name):
            print("metaq-admin: not deleted (give --yes to delete without asking)", file=sys.stderr)
            return EXIT_USAGE
    if not view.brokers:
        print("metaq-admin: no broker to ask", file=sys.stderr)
        return EXIT_UNREACHABLE
    status = EXIT_OK
    for bid, url in sorted(view.brokers.items()):
        try:
            code, answer = call(view, url, args.action, args.name, settings)
        except (errors.MetaqError, ValueError) as exc:
            print("metaq-admin: %s: %s" % (url, exc), file=sys.stderr)
            status = max(status, EXIT_UNREACHABLE)
            continue
        if code != 200:
            print("metaq-admin: broker %s refused topics %s %s (%d): %s" % (bid, args.action, args.name, code, answer),
                  file=sys.stderr)
            status = EXIT_REFUSED
            continue
        print("broker %s: topic %s %s: %s" % (bid, args.name, DONE[args.action], json.dumps(answer, sort_keys=True)))
    return status


def _confirm(name):
    if not sys.stdin.isatty():
        return False
    return input("delete topic %s and its index files on every broker? [y/N] " % name).strip().lower() in ("y", "yes")
