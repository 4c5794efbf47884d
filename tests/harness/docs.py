"""The documentation as tests read it: README.md and the pages under docs/, their sections and code blocks.

A section is named by its heading's text (any level, ``#`` to ``####``) and runs to the next heading of the
same or a higher level; headings inside fenced code blocks do not count.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,4}) (.+?)\s*$")


def read(page):
    """The text of ``page``: ``"README.md"`` or a page of docs/ (``"quickstart.md"``)."""
    return (README if page == "README.md" else DOCS / page).read_text(encoding="utf-8")


def nav_pages():
    """The pages of docs/ in mkdocs.yml's order (every ``*.md`` the nav names)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    return re.findall(r":\s*([\w.-]+\.md)\s*$", text, re.M)


def headings(text):
    """``[(line index, level, text)]`` of the headings outside fenced code blocks."""
    found, fenced = [], False
    for i, line in enumerate(text.split("\n")):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            m = HEADING.match(line)
            if m:
                found.append((i, len(m.group(1)), m.group(2)))
    return found


def section(page, title):
    """The text of the section of ``page`` whose heading is ``title``, its heading line included."""
    text = read(page)
    lines = text.split("\n")
    marks = headings(text)
    for n, (i, level, heading) in enumerate(marks):
        if heading == title:
            end = next((j for j, lv, _ in marks[n + 1:] if lv <= level), len(lines))
            return "\n".join(lines[i:end]) + "\n"
    raise KeyError("%s has no heading %r" % (page, title))


def blocks(lang, text):
    """The code of every fenced block of ``lang`` (```sh, ```python, ...) in ``text``."""
    return re.findall(r"```%s\n(.*?)```" % lang, text, re.S)
