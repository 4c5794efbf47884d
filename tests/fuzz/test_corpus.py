"""The differential fuzzers' harnesses kept working: each fuzzer's seed corpus (tests/fuzz/corpus/<name>/) goes once
through its check, the C helper and the Python definition answering each input alike, and a check does fail when
the two differ. ``make fuzz`` runs the same checks on what atheris makes of these seeds."""

import os

import pytest

from metaq import speedups
from tests.fuzz import differential

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
needs_c = pytest.mark.skipif(speedups.load("scan_puts", None) is None,
                             reason="metaq.native._bytes was not built, or METAQ_PURE_PYTHON asks for the twins")


def _inputs(name):
    folder = os.path.join(CORPUS, name)
    for entry in sorted(os.listdir(folder)):
        with open(os.path.join(folder, entry), "rb") as f:
            yield entry, f.read()


def test_every_fuzzer_has_a_seed_corpus_and_every_corpus_a_fuzzer():
    assert sorted(os.listdir(CORPUS)) == sorted(differential.TARGETS)
    for name in differential.TARGETS:
        assert len(list(_inputs(name))) >= 2, name


@needs_c
@pytest.mark.parametrize("name", sorted(differential.TARGETS))
def test_the_seed_corpus_gets_the_same_answers_from_the_c_helper_and_the_python_definition(name):
    check = differential.TARGETS[name]
    differential.ANSWERED.clear()
    for _entry, data in _inputs(name):
        check(data)  # raises Difference with both answers
    assert differential.ANSWERED and all(differential.ANSWERED.values()), (
        "every seed of %s raised alike in both definitions: the harness no longer fits the functions (%s)"
        % (name, differential.ANSWERED))


@needs_c
def test_a_check_fails_on_an_answer_the_python_definition_does_not_give(monkeypatch):
    from metaq.pop import records
    monkeypatch.setattr(records, "parse_handles_py", lambda handles: [None] * len(handles))
    data = next(_inputs("pop_handles"))[1]
    with pytest.raises(differential.Difference, match="parse_handles"):
        differential.TARGETS["pop_handles"](data)


@needs_c
def test_a_check_fails_on_an_exception_the_c_helper_does_not_raise(monkeypatch):
    from metaq.store import record

    def refuses(buf, pos, end):
        raise ValueError("not a record")
    monkeypatch.setattr(record, "scan_records_py", refuses)
    with pytest.raises(differential.Difference, match="raised"):
        differential.TARGETS["records"](next(_inputs("records"))[1])
