"""Write the flag table of docs/configuration.md ("Flags"): every ``metaq-server`` flag, from its parser.

The flags, their values and what each does come from ``metaq.server.__main__.build_parser`` (the parser the broker
reads its command line with); the setting each one overrides from ``overrides_from`` (what the broker does with
it), so the table cannot drift from the command line. Run it after changing either:

    python tools/server_flags.py            # rewrite the table in docs/configuration.md
    python tools/server_flags.py --check    # exit 1 if the committed table differs from the generated one
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PAGE = os.path.join(ROOT, "docs", "configuration.md")
BEGIN = "<!-- the table below is written by tools/server_flags.py from metaq-server's parser: edit that, not this -->"
END = "<!-- end of the table written by tools/server_flags.py -->"


def _cell(text):
    """``text`` as one table cell: ``|`` escaped, ``<N>`` kept as text (not an HTML tag), on one line."""
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _settings(server, action):
    """The dotted settings ``action``'s flag overrides: those ``overrides_from`` fills when only it is given."""
    parser = server.build_parser()
    given = argparse.Namespace(**{a.dest: None for a in parser._actions})  # noqa: SLF001 (argparse's own list)
    setattr(given, action.dest, "X" if action.nargs != 0 else True)
    return [dotted for dotted, value in server.overrides_from(given).items() if value is not None]


def render():
    """The Markdown table: flag, its value, the setting it overrides, what it does."""
    from metaq.server import __main__ as server  # monkey-patches this process (a tool's own, harmless)

    rows = ["| flag | value | overrides | what it does |", "|---|---|---|---|"]
    for action in server.build_parser()._actions:  # noqa: SLF001 (argparse's own list)
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if action.choices:
            value = "|".join(str(c) for c in action.choices)
        elif action.nargs == 0:
            value = ""
        else:
            value = action.metavar or action.dest.upper()
        settings = ", ".join("`%s`" % s for s in _settings(server, action)) if action.dest != "help" else ""
        rows.append("| %s | %s | %s | %s |" % (", ".join("`%s`" % o for o in action.option_strings),
                                               "`%s`" % _cell(value) if value else "", settings, _cell(action.help)))
    return "\n".join(rows) + "\n"


def page_with(table, text):
    """``text`` (the page) with the part between the markers replaced by ``table``."""
    head, sep, rest = text.partition(BEGIN + "\n")
    if not sep or END not in rest:
        raise SystemExit("%s has no %r ... %r markers" % (PAGE, BEGIN, END))
    return head + BEGIN + "\n\n" + table + "\n" + rest[rest.index(END):]  # blank lines: a table, not HTML


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md's table is out of date")
    args = p.parse_args(argv)
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    wanted = page_with(render(), text)
    if args.check:
        if wanted != text:
            print("docs/configuration.md's flag table is out of date: run python tools/server_flags.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
