"""ruff over the whole repository, with ruff.toml's rules (line length 120, the default rules, W, bugbear, complexity
15): make test runs it.

A unit test: it starts ruff as a process and opens no socket. ruff is in setup.py's ``test`` extra; without it the
test is skipped, saying so.
"""

import importlib.util
import os
import subprocess
import sys
import tomllib

import pytest

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
