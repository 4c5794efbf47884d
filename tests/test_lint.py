"""ruff over the whole repository, with ruff.toml's rules (line length 120, the default rules, W, bugbear, complexity
15): make test runs it. And the named limits' doc comments state contracts: the measurements behind a bound are in
bench/README.md ("Design measurements behind the code"), not in the limits modules (metaq/limits.py and each
package's limits.py).

A unit test: it starts ruff as a process and opens no socket. ruff is in setup.py's ``test`` extra; without it the
test is skipped, saying so.
"""

import importlib.util
import os
import re
import subprocess
import sys
import tomllib

import pytest

from metaq import limits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff is not installed (setup.py's test extra: pip install -e '.[test]')")
def test_ruff_finds_nothing():
    # --no-cache: nothing written into the tree (.ruff_cache); the whole run takes well under a second
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, "ruff check . (ruff.toml's rules) found:\n%s%s" % (result.stdout, result.stderr)
    # a noqa comment that names no rule is only a warning to ruff, and it silences nothing
    assert "Invalid `# noqa` directive" not in result.stderr, result.stderr


def test_the_rules_keep_bugbear_and_a_complexity_bound():
    """ruff.toml selects bugbear and C901 with a bound; a function past it is split, or says why on its def line."""
    with open(os.path.join(ROOT, "ruff.toml"), "rb") as f:
        config = tomllib.load(f)
    assert {"B", "C901"} <= set(config["lint"]["select"])
    assert config["lint"]["mccabe"]["max-complexity"] == 15


#: What reads as a measured figure in a comment: a duration in µs, a duration or size said to be about so much, what
#: something held before its bound, a figure "measured".
MEASURED = re.compile(r"\d ?(µs|us)\b|(about|~) ?[\d.,]+ ?(ms|KB|MB|GB)\b|\bheld (the loop )?(about |~)?[\d.,]+ ?"
                      r"(ms|s|KB|MB|GB)\b|\bmeasured\b", re.IGNORECASE)


def test_the_limits_doc_comments_hold_no_measured_figures():
    """Each ``#:`` comment in a limits module (metaq/limits.py and every package's, ``limits.modules``) says what
    the limit bounds and why; the figures that decided it are in bench/README.md."""
    found = []
    for name in limits.modules():
        path = os.path.join(ROOT, *name.split(".")) + ".py"
        with open(path, encoding="utf-8") as f:
            found += ["%s:%d: %s" % (os.path.relpath(path, ROOT), n, line.strip()) for n, line in enumerate(f, 1)
                      if line.lstrip().startswith("#:") and MEASURED.search(line)]
    assert found == [], "measured figures in the limits modules' doc comments (move them to bench/README.md):\n" + \
        "\n".join(found)


def test_the_measured_figure_check_finds_one():
    assert MEASURED.search("#: each holds a UNIQ_KEY, about 5 us of Python each")
    assert MEASURED.search("#: a scan held the loop ~200 ms in one go")
    assert not MEASURED.search("#: Seconds a call waits (RocketMQ's proxy: 60 s), 16 bytes a record")
