"""The check-back's decisions (``metaq.transactions.policy``, pure): what is due, when to give up, the round's limit."""

from typing import NamedTuple

from metaq.transactions import limits as transactions_limits
from metaq.transactions.policy import immunity_ms, is_due, plan_round

TIMEOUT = 6_000


class H(NamedTuple):
    number: int
    stored_ms: int
    checks: int = 0
    immunity_ms: int = -1


def test_a_message_is_due_once_the_timeout_has_passed_since_it_was_stored():
    assert not is_due(1000, -1, 1000 + TIMEOUT - 1, TIMEOUT)
    assert is_due(1000, -1, 1000 + TIMEOUT, TIMEOUT)
    assert plan_round([H(1, 1000)], 1000 + TIMEOUT - 1, TIMEOUT, 15).check == []
    assert plan_round([H(1, 1000)], 1000 + TIMEOUT, TIMEOUT, 15).check == [1]


def test_check_immunity_replaces_the_timeout_for_its_message():
    assert immunity_ms(None) == -1 and immunity_ms("-1") == -1 and immunity_ms("soon") == -1
    assert immunity_ms("30") == 30_000
    assert immunity_ms(str(10 ** 12)) == transactions_limits.MAX_CHECK_IMMUNITY_S * 1000  # capped
    halves = [H(1, 0, immunity_ms=30_000), H(2, 0, immunity_ms=1_000), H(3, 0)]
    assert plan_round(halves, 6_000, TIMEOUT, 15).check == [2, 3]
    assert plan_round(halves, 30_000, TIMEOUT, 15).check == [1, 2, 3]


def test_checked_up_to_the_maximum_then_given_up():
    assert plan_round([H(1, 0, checks=14)], TIMEOUT, TIMEOUT, 15) == ([1], [], 0)
    assert plan_round([H(1, 0, checks=15)], TIMEOUT, TIMEOUT, 15) == ([], [1], 0)
    assert plan_round([H(1, 0, checks=0)], TIMEOUT, TIMEOUT, 0) == ([], [1], 0)  # max 0: never asked
    assert plan_round([H(1, 0, checks=15)], TIMEOUT - 1, TIMEOUT, 15) == ([], [], 0)  # not due: not yet


def test_a_round_acts_on_at_most_its_limit_oldest_first_and_leaves_the_rest():
    halves = [H(n, 1000 - n, checks=n % 2 * 15) for n in range(1, 6)]  # stored newest first
    at = plan_round(halves, 10 ** 6, TIMEOUT, 15, limit=5)
    assert (sorted(at.check + at.give_up), at.deferred) == ([1, 2, 3, 4, 5], 0)
    past = plan_round(halves, 10 ** 6, TIMEOUT, 15, limit=4)
    assert (past.check, past.give_up, past.deferred) == ([4, 2], [5, 3], 1)  # number 1, the newest, waits
    assert plan_round([H(n, 0) for n in range(transactions_limits.MAX_CHECKS_PER_ROUND + 1)], TIMEOUT, TIMEOUT,
                      15).deferred == 1
