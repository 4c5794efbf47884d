"""The workload's arguments (tests/harness/workload.py) are checked before anything connects (unit tier)."""

import pytest

from tests.harness.history import History
from tests.harness.workload import Workload


@pytest.mark.parametrize("kwargs, match", [
    ({"producers": -1}, r"producers must be an int in 0..32, got -1"),
    ({"producers": 33}, r"producers must be an int in 0..32, got 33"),
    ({"consumers": "2"}, r"consumers must be an int in 0..32, got '2'"),
    ({"max_messages": 0}, r"max_messages must be in 1..200000, got 0"),
    ({"max_messages": 10 ** 9}, r"max_messages must be in 1..200000"),
    ({"pace_s": -0.1}, r"pace_s must be a number of seconds >= 0, got -0.1"),
])
def test_bad_workload_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Workload(History(), "127.0.0.1:1", "t-hist", **kwargs)


def test_a_workload_that_never_started_closes_cleanly():
    load = Workload(History(), "127.0.0.1:1", "t-hist")
    load.close()
    assert load.errors == [] and load.acks() == 0
