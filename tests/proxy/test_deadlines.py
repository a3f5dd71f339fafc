"""proxy.deadlines: a bounded cache whose entries each carry their own deadline."""

from __future__ import annotations

import pytest

from proxy.deadlines import Deadlines


def test_an_entry_is_served_until_its_deadline_and_not_at_it() -> None:
    cache: Deadlines[str, int] = Deadlines(maxsize=10)
    cache.put("a", 1, deadline=100.0, now=0.0)
    assert cache.get("a", 99.9) == 1
    assert cache.get("a", 100.0) is None
    assert cache.get("missing", 0.0) is None


def test_a_rewrite_replaces_the_value_and_the_deadline() -> None:
    cache: Deadlines[str, int] = Deadlines(maxsize=10)
    cache.put("a", 1, deadline=10.0, now=0.0)
    cache.put("a", 2, deadline=50.0, now=5.0)
    assert cache.get("a", 20.0) == 2
    assert len(cache) == 1


def test_past_maxsize_the_oldest_entry_goes_and_a_rewritten_one_counts_as_new() -> None:
    cache: Deadlines[str, int] = Deadlines(maxsize=3)
    for i, key in enumerate("abc"):
        cache.put(key, i, deadline=1000.0, now=0.0)
    cache.put("a", 9, deadline=1000.0, now=0.0)  # "a" is now the newest: "b" is the oldest
    cache.put("d", 3, deadline=1000.0, now=0.0)
    assert len(cache) == 3
    assert cache.get("b", 1.0) is None
    assert [cache.get(k, 1.0) for k in "acd"] == [9, 2, 3]


def test_expired_entries_at_the_old_end_leave_as_new_ones_come() -> None:
    cache: Deadlines[str, int] = Deadlines(maxsize=1000)
    for i in range(10):
        cache.put(f"old{i}", i, deadline=10.0, now=0.0)
    for i in range(5):  # each write drops up to SWEEP expired ones
        cache.put(f"new{i}", i, deadline=100.0, now=50.0)
    assert len(cache) == 5
    assert all(cache.get(f"new{i}", 50.0) == i for i in range(5))


def test_a_live_old_entry_stops_the_sweep_and_clear_empties_it() -> None:
    cache: Deadlines[str, int] = Deadlines(maxsize=1000)
    cache.put("long", 1, deadline=1000.0, now=0.0)
    cache.put("short", 2, deadline=10.0, now=0.0)
    cache.put("new", 3, deadline=1000.0, now=50.0)
    assert len(cache) == 3  # "short" is behind a live entry: it waits for its turn
    assert cache.get("short", 50.0) is None
    cache.clear()
    assert len(cache) == 0


def test_an_entry_put_past_its_deadline_is_not_kept() -> None:
    cache: Deadlines[str, int] = Deadlines(maxsize=10)
    cache.put("late", 1, deadline=5.0, now=10.0)
    assert len(cache) == 0 and cache.get("late", 10.0) is None
    cache.put("ok", 2, deadline=50.0, now=10.0)
    assert cache.get("ok", 10.0) == 2


def test_maxsize_must_be_positive() -> None:
    with pytest.raises(ValueError, match="maxsize"):
        Deadlines(maxsize=0)
