"""``metaq-admin group-settings``: per-group settings (docs/concepts.md "Per-group settings").

    metaq-admin --brokers meta://127.0.0.1:8123 group-settings list
    metaq-admin --brokers meta://127.0.0.1:8123 group-settings show billing
    metaq-admin --brokers meta://127.0.0.1:8123 group-settings set billing --max-retries 3 --consumption-enabled false
    metaq-admin --brokers meta://127.0.0.1:8123 group-settings delete billing

Each request goes to every broker of the view (``--zk``: every registered master; ``--brokers``) as the text
extension ``group_settings <action> <group> <settings> <opaque>`` (groups/wire.py); slaves take their master's table.
A broker's refusal exits 3 with its reason (a bad value names the setting, nothing changed).
"""

import json

from metaq import errors
from metaq.client.admin.tools import EXIT_OK, EXIT_REFUSED, AdminExit
from metaq.client.replies import reply_error
from metaq.groups.wire import GroupSettingsCommand

__all__ = ["add_parser", "run", "COLUMNS"]

#: Seconds a change may take at the broker (the table's fsync).
CHANGE_TIMEOUT_S = 30.0
COLUMNS = ["broker", "group", "max_retries", "consumption_enabled", "broadcast_allowed", "read_from_slave_when_slow",
           "fifo"]
#: (option, setting) of ``set``.
OPTIONS = (("--max-retries", "max_retries"), ("--consumption-enabled", "consumption_enabled"),
           ("--broadcast-allowed", "broadcast_allowed"), ("--read-from-slave-when-slow", "read_from_slave_when_slow"),
           ("--fifo", "fifo"))


def add_parser(sub):
    s = sub.add_parser("group-settings", help="per consumer group: max retries, consumption enabled, broadcast "
                       "allowed, the slave a slow pull reads from, FIFO (docs/concepts.md 'Per-group settings')")
    act = s.add_subparsers(dest="group_action", metavar="ACTION", required=True)
    act.add_parser("list", help="every group with settings")
    s = act.add_parser("show", help="one group's settings (the defaults when it has none)")
    s.add_argument("group")
    s = act.add_parser("set", help="change some of a group's settings (admin)")
    s.add_argument("group")
    s.add_argument("--max-retries", metavar="N", help="redeliveries after the first before a dead letter (none: "
                   "the broker's default)")
    s.add_argument("--consumption-enabled", metavar="BOOL", help="false: every read as this group is refused")
    s.add_argument("--broadcast-allowed", metavar="BOOL", help="false: RocketMQ consumers in BROADCASTING mode are "
                   "refused")
    s.add_argument("--read-from-slave-when-slow", metavar="ID", help="the slave id a slow pull is told to read "
                   "from (none: the master)")
    s = act.add_parser("delete", help="remove a group's settings: it behaves as a group without any (admin)")
    s.add_argument("group")


def _settings(args):
    return tuple((key, getattr(args, key)) for _opt, key in OPTIONS if getattr(args, key, None) is not None)


def run(view, args, render):
    action = args.group_action
    settings = _settings(args) if action == "set" else ()
    if action == "set" and not settings:
        raise AdminExit("group-settings set %s: give at least one of %s" % (args.group, ", ".join(
            o for o, _k in OPTIONS)), 2)
    event = GroupSettingsCommand(action, getattr(args, "group", None), settings, 0)
    rows = []
    for bid in sorted(view.brokers):
        url = view.brokers[bid]
        try:
            reply = view.conn(url).call(event, timeout=max(view.timeout, CHANGE_TIMEOUT_S))
        except (errors.MetaqError, ValueError) as exc:
            view.problems.append("%s: %s" % (url, exc))
            continue
        if reply.code != 200:
            hint = " (this needs a user with the admin role)" if reply.code == errors.Forbidden.code else ""
            raise AdminExit("broker %d refused group-settings %s: %s%s" % (bid, action, reply_error(reply), hint),
                            EXIT_REFUSED)
        answer = json.loads(bytes(reply.body).decode("utf-8"))
        for row in answer if isinstance(answer, list) else [answer]:
            if not getattr(args, "json", False):  # a table shows a false setting as "false", not blank
                row = {k: ("true" if v else "false") if isinstance(v, bool) else v for k, v in row.items()}
            rows.append(dict(row, broker=bid))
    render(rows, COLUMNS + (["deleted"] if action == "delete" else []))
    return EXIT_OK
