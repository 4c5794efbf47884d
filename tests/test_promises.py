"""docs/promises.md indexes every guarantee of README.md with the test that keeps it (issue 23 point 8).

These tests keep the index in step with the README and the test suite:

* every ``##``/``###``/``####`` heading of README.md is a section of docs/promises.md (with at least one
  promise row) or is listed under "Sections that promise nothing";
* every ``tests/<file>.py::<test>`` the index names exists (``::Class::test`` too; a parametrized id's
  ``[...]`` is ignored);
* every section of the index is still a README heading.

A section is named by its heading path: the README headings above it and its own text, joined by " › ",
e.g. ``Replication (master → slave) › Limits`` (the README has two "Limits" headings).
"""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
INDEX = os.path.join(ROOT, "docs", "promises.md")
SEP = " › "
GAPS = "Promises without a test"
NOTHING = "Sections that promise nothing"
SPECIAL = (GAPS, NOTHING)

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{2,4}) (.+?)\s*$")
TEST_REF = re.compile(r"`(tests/[^`\s]+?\.py)::([^`\s]+)`")


def _lines_outside_fences(path):
    """``(line number, line)`` of a Markdown file, fenced code blocks left out."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield number, line


def readme_headings():
    """``{heading path: README line}`` for every ``##``, ``###`` and ``####`` heading."""
    found, trail = {}, []
    for number, line in _lines_outside_fences(README):
        m = HEADING.match(line)
        if m:
            level = len(m.group(1))
            trail = trail[:level - 2] + [m.group(2)]
            found.setdefault(SEP.join(trail), number)
    return found


def index_sections():
    """``{section: {"line": n, "rows": [(line, text)], "items": [(line, text)]}}`` of docs/promises.md's ``##``
    sections: the table rows under each (header and separator left out) and its bullet items."""
    sections, current = {}, None
    for number, line in _lines_outside_fences(INDEX):
        if line.startswith("## "):
            current = line[3:].strip()
            assert current not in sections, ("docs/promises.md line %d: section %r is written twice; merge the two"
                                             % (number, current))
            sections[current] = {"line": number, "rows": [], "items": []}
        elif current is None:
            continue
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] == "promise" or set("".join(cells)) <= set("-: "):
                continue
            sections[current]["rows"].append((number, line))
        elif line.startswith("* "):
            sections[current]["items"].append((number, line[2:].strip()))
    return sections


def _test_names(path, cache={}):
    """Names of the test functions of a file: ``test_x`` and ``Class::test_x``."""
    if path not in cache:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                names.update("%s::%s" % (node.name, m.name) for m in node.body
                             if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)))
        cache[path] = names
    return cache[path]


def test_every_readme_heading_is_indexed():
    sections = index_sections()
    nothing = {text for _, text in sections.get(NOTHING, {"items": []})["items"]}
    problems = []
    for path, line in readme_headings().items():
        if path in sections and sections[path]["rows"]:
            continue
        if path in sections:
            problems.append('"## %s" (docs/promises.md line %d) has no promise row: add '
                            '"| <promise> | `tests/<file>.py::<test>` |" lines under it, or move the heading to '
                            '"%s"' % (path, sections[path]["line"], NOTHING))
        elif path not in nothing:
            problems.append('README.md line %d: the heading "%s" is in no section of docs/promises.md. Add\n'
                            '    ## %s\n\n    | promise | test(s) |\n    |---|---|\n'
                            '    | <what it guarantees> | `tests/<file>.py::<test_that_asserts_it>` |\n'
                            '  to docs/promises.md (a promise no test keeps goes under "## %s"), or, if it is '
                            'only how-to, reference or measurements, add "* %s" under "## %s"'
                            % (line, path, path, GAPS, path, NOTHING))
    assert not problems, "\n".join(problems)


def test_every_indexed_test_exists():
    problems = []
    refs = 0
    for number, line in _lines_outside_fences(INDEX):
        for path, name in TEST_REF.findall(line):
            refs += 1
            name = re.sub(r"\[.*\]$", "", name)
            full = os.path.normpath(os.path.join(ROOT, path))
            if not full.startswith(os.path.join(ROOT, "tests") + os.sep) or os.path.normpath(path) != path:
                problems.append("docs/promises.md line %d: %s is not a plain path under tests/" % (number, path))
            elif not os.path.isfile(full):
                problems.append("docs/promises.md line %d names %s::%s, but %s does not exist: point the row at the "
                                "file the test lives in now" % (number, path, name, path))
            elif name not in _test_names(path):
                problems.append("docs/promises.md line %d names %s::%s, but %s has no test function %s (renamed or "
                                "removed?): name the test that now keeps that promise, or move the promise to "
                                '"## %s"' % (number, path, name, path, name, GAPS))
    assert refs, "docs/promises.md names no test at all: the pattern `tests/<file>.py::<test>` found nothing"
    assert not problems, "\n".join(problems)


def test_every_indexed_section_is_still_a_readme_heading():
    headings = readme_headings()
    sections = index_sections()
    problems = []
    for section, info in sections.items():
        if section not in SPECIAL and section not in headings:
            problems.append('docs/promises.md line %d: "## %s" is no README heading any more: rename the section to '
                            "the README heading's path (headings above it and its own text joined by \"%s\") or "
                            "remove it" % (info["line"], section, SEP))
    for number, item in sections.get(NOTHING, {"items": []})["items"]:
        if item not in headings:
            problems.append('docs/promises.md line %d: "%s" under "%s" is no README heading any more: fix or '
                            "remove the line" % (number, item, NOTHING))
        elif item in sections:
            problems.append('docs/promises.md line %d: "%s" is both a section with promises and listed under "%s": '
                            "keep one" % (number, item, NOTHING))
    for special in SPECIAL:
        if special not in sections:
            problems.append('docs/promises.md has no "## %s" section: keep it, even when it is empty' % special)
    assert not problems, "\n".join(problems)
