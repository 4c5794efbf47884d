"""docs/promises.md indexes every guarantee of the documentation with the test that keeps it (issue 23 point 8).

These tests keep the index in step with the pages and the test suite:

* every heading (``#`` to ``####``) of a user page (every page of mkdocs.yml's navigation but the index itself,
  the generated configuration reference, the architecture and the RocketMQ request codes) is a section of
  docs/promises.md (with at least one promise row) or is listed under "Sections that promise nothing";
* every ``tests/<file>.py::<test>`` the index names exists (``::Class::test`` too; a parametrized id's
  ``[...]`` is ignored);
* every section of the index still links to a heading of its page.

A section of the index is a link to its heading, ``## [Page › Heading](page.md#anchor)``; the anchor is the
one mkdocs gives the heading (Python-Markdown's toc extension, as mkdocs.yml configures it), so
``mkdocs build --strict`` checks the same links.
"""

import ast
import functools
import os
import re

import markdown
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
INDEX = os.path.join(DOCS, "promises.md")
GAPS = "Promises without a test"
NOTHING = "Sections that promise nothing"
README_SECTION = "The README's quickstart"
SPECIAL = (GAPS, NOTHING, README_SECTION)
#: Pages whose headings need no section here: the home page (the README's overview again), this index, a page
#: generated from the schema, the code's layout and a reference table of RocketMQ's request codes.
NOT_INDEXED = ("index.md", "promises.md", "configuration-reference.md", "architecture.md", "rocketmq-codes.md")

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"^\[(?P<text>.+)\]\((?P<target>[\w.-]+\.md#[\w-]+)\)$")
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


def _markdown():
    """A Markdown converter configured as mkdocs.yml configures mkdocs's (the same anchors)."""
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    extensions, configs = [], {}
    for item in config.get("markdown_extensions", []):
        name, options = next(iter(item.items())) if isinstance(item, dict) else (item, None)
        extensions.append(name)
        if options:
            configs[name] = options
    return markdown.Markdown(extensions=extensions, extension_configs=configs)


def user_pages():
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        text = f.read()
    return [p for p in re.findall(r":\s*([\w.-]+\.md)\s*$", text, re.M) if p not in NOT_INDEXED]


@functools.cache
def page_headings(page):
    """``{"page.md#anchor": heading text}`` for every heading of ``page`` (``#`` to ``####``)."""
    md = _markdown()
    with open(os.path.join(DOCS, page), encoding="utf-8") as f:
        md.convert(f.read())
    found = {}

    def walk(tokens):
        for t in tokens:
            if t["level"] <= 4:
                found["%s#%s" % (page, t["id"])] = re.sub(r"<[^>]+>", "", t["name"])
            walk(t["children"])
    walk(md.toc_tokens)
    return found


def all_headings():
    found = {}
    for page in user_pages():
        found.update(page_headings(page))
    return found


def index_sections():
    """``{key: {"line": n, "rows": [(line, text)], "items": [(line, target)]}}`` of docs/promises.md's ``##``
    sections, keyed by their link target (``page.md#anchor``) or, for the special ones, their title; the
    table rows under each (header and separator left out) and the targets of its bullet items."""
    sections, current = {}, None
    for number, line in _lines_outside_fences(INDEX):
        if line.startswith("## "):
            title = line[3:].strip()
            m = LINK.match(title)
            if m:
                current = m.group("target")
            else:
                assert title in SPECIAL, ('docs/promises.md line %d: "## %s" is no link to a heading: write it '
                                          '"## [Page › Heading](page.md#anchor)"' % (number, title))
                current = title
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
            m = LINK.match(line[2:].strip())
            sections[current]["items"].append((number, m.group("target") if m else line[2:].strip()))
    return sections


@functools.cache
def _test_names(path):
    """Names of the test functions of a file: ``test_x`` and ``Class::test_x``."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update("%s::%s" % (node.name, m.name) for m in node.body
                         if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return names


def test_every_heading_of_the_user_pages_is_indexed():
    sections = index_sections()
    nothing = {target for _, target in sections.get(NOTHING, {"items": []})["items"]}
    problems = []
    for target, text in all_headings().items():
        if target in sections and sections[target]["rows"]:
            continue
        if target in sections:
            problems.append('"## [...](%s)" (docs/promises.md line %d) has no promise row: add '
                            '"| <promise> | `tests/<file>.py::<test>` |" lines under it, or move the heading to '
                            '"%s"' % (target, sections[target]["line"], NOTHING))
        elif target not in nothing:
            problems.append('docs/%s: the heading "%s" is in no section of docs/promises.md. Add\n'
                            '    ## [<page> › %s](%s)\n\n    | promise | test(s) |\n    |---|---|\n'
                            '    | <what it guarantees> | `tests/<file>.py::<test_that_asserts_it>` |\n'
                            '  to docs/promises.md (a promise no test keeps goes under "## %s"), or, if it is '
                            'only how-to, reference or measurements, add "* [<page> › %s](%s)" under "## %s"'
                            % (target.split("#")[0], text, text, target, GAPS, text, target, NOTHING))
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


def test_every_indexed_section_is_still_a_heading():
    headings = all_headings()
    sections = index_sections()
    problems = []
    for section, info in sections.items():
        if section not in SPECIAL and section not in headings:
            problems.append('docs/promises.md line %d: "%s" is no heading of a user page any more: point the '
                            "section at the heading's page and anchor, or remove it" % (info["line"], section))
    for number, item in sections.get(NOTHING, {"items": []})["items"]:
        if item not in headings:
            problems.append('docs/promises.md line %d: "%s" under "%s" is no heading of a user page any more: fix '
                            "or remove the line" % (number, item, NOTHING))
        elif item in sections:
            problems.append('docs/promises.md line %d: "%s" is both a section with promises and listed under "%s": '
                            "keep one" % (number, item, NOTHING))
    for special in SPECIAL:
        if special not in sections:
            problems.append('docs/promises.md has no "## %s" section: keep it, even when it is empty' % special)
    assert not problems, "\n".join(problems)


def test_the_index_reads_anchors_as_mkdocs_writes_them():
    """The anchors come from mkdocs's own converter settings: a heading with code and punctuation in it."""
    headings = page_headings("replication.md")
    assert headings["replication.md#automatic-failover-ha-auto"] == "Automatic failover: ha: auto"
    assert "quickstart.md#first-run" in all_headings()
