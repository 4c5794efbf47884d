"""Range assignment (reference §5.3): MetaQ's examples and its invariants, no network."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.client.balance import java_sorted, range_assign, range_assignment, range_share


def test_metaq_example_three_consumers_over_ten_partitions():
    parts = [str(i) for i in range(10)]
    consumers = ["c1", "c2", "c3"]
    # single-digit strings sort like numbers, so this is DefaultStrategyUnitTest's answer
    assert range_assign(consumers, parts, "c1") == ["0", "1", "2", "3"]
    assert range_assign(consumers, parts, "c2") == ["4", "5", "6"]
    assert range_assign(consumers, parts, "c3") == ["7", "8", "9"]


def test_partitions_sort_as_strings_so_0_10_comes_before_0_2():
    parts = ["0-%d" % p for p in range(12)]
    assert java_sorted(parts)[:4] == ["0-0", "0-1", "0-10", "0-11"]
    assert range_assign(["a", "b"], parts, "a") == ["0-0", "0-1", "0-10", "0-11", "0-2", "0-3"]
    assert range_assign(["a", "b"], parts, "b") == ["0-4", "0-5", "0-6", "0-7", "0-8", "0-9"]


def test_two_brokers_of_four_partitions_over_three_consumers():
    parts = ["%d-%d" % (b, p) for b in (1, 2) for p in range(4)]
    shares = range_assignment(["g_c", "g_a", "g_b"], parts)
    assert shares == {"g_a": ["1-0", "1-1", "1-2"], "g_b": ["1-3", "2-0", "2-1"], "g_c": ["2-2", "2-3"]}


def test_more_consumers_than_partitions_leaves_the_last_ones_idle():
    consumers = ["c%d" % i for i in range(5)]
    assert [range_assign(consumers, ["0-0", "0-1"], c) for c in consumers] == [["0-0"], ["0-1"], [], [], []]


def test_unknown_consumer_and_empty_lists_own_nothing():
    assert range_assign(["a", "b"], ["0-0"], "z") == []
    assert range_assign([], ["0-0"], "a") == []
    assert range_assign(["a"], [], "a") == []


def test_consumer_ids_sort_as_java_strings():
    # Java compares UTF-16 code units: U+FF21 (one unit 0xFF21) sorts after U+1F600 (surrogates 0xD83D...)
    assert java_sorted(["\uff21", "\U0001f600"]) == ["\U0001f600", "\uff21"]
    assert java_sorted(["b", "B", "a", "a"]) == ["B", "a", "b"]


def test_range_share_rejects_a_bad_index():
    with pytest.raises(ValueError):
        range_share(3, 3, 10)
    assert range_share(0, 3, 10) == (0, 4)
    assert range_share(2, 3, 10) == (7, 3)


consumer_lists = st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=12, unique=True)
partition_lists = st.lists(
    st.tuples(st.integers(0, 20), st.integers(0, 40)).map(lambda t: "%d-%d" % t), max_size=60, unique=True)


@settings(max_examples=100, deadline=None)
@given(consumer_lists, partition_lists)
def test_every_partition_is_owned_by_exactly_one_consumer(consumers, parts):
    owned = [p for c in consumers for p in range_assign(consumers, parts, c)]
    assert sorted(owned) == sorted(parts)


@settings(max_examples=100, deadline=None)
@given(consumer_lists, partition_lists)
def test_shares_differ_by_at_most_one_and_earlier_consumers_get_more(consumers, parts):
    sizes = [len(range_assign(consumers, parts, c)) for c in java_sorted(consumers)]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


@settings(max_examples=100, deadline=None)
@given(consumer_lists, partition_lists, st.randoms(use_true_random=False))
def test_assignment_does_not_depend_on_input_order_or_duplicates(consumers, parts, rnd):
    shuffled_c, shuffled_p = consumers[:] + consumers[:1], parts[:] + parts[:2]
    rnd.shuffle(shuffled_c)
    rnd.shuffle(shuffled_p)
    for c in consumers:
        assert range_assign(consumers, parts, c) == range_assign(shuffled_c, shuffled_p, c)


@settings(max_examples=100, deadline=None)
@given(consumer_lists, partition_lists)
def test_each_share_is_a_contiguous_run_of_the_sorted_partitions(consumers, parts):
    ordered = java_sorted(parts)
    joined = [p for c in java_sorted(consumers) for p in range_assign(consumers, parts, c)]
    assert joined == ordered


def test_a_thousand_partitions_are_fast():
    parts = ["%d-%d" % (b, p) for b in range(10) for p in range(100)]
    consumers = ["g_%s" % random.random() for _ in range(50)]
    assert sum(len(range_assign(consumers, parts, c)) for c in consumers) == 1000
