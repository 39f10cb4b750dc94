"""Drain figures (punctual.domain.drain): the oldest unprocessed due work and the time its backlog
takes to clear, for the materializer's walks and for delivery, overall and per tenant."""

from __future__ import annotations

from punctual.domain.drain import (
    NOT_DRAINING,
    Drain,
    QueueFigures,
    delivery_drain,
    estimate,
    largest,
    queue_drain,
    walk_drain,
)

NOW = 1_800_000_000
M = 60


def test_estimate_is_the_backlog_over_the_net_rate_rounded_up():
    assert estimate(0, processed=0, arriving=5) == 0
    assert estimate(100, processed=2, arriving=1) == 100
    assert estimate(101, processed=3, arriving=1) == 51  # 50.5 s, rounded up
    assert estimate(10, processed=1, arriving=1) == NOT_DRAINING  # not shrinking
    assert estimate(10, processed=0, arriving=0) == NOT_DRAINING  # nothing processed
    assert estimate(10**9, processed=1.5, arriving=0.5) == NOT_DRAINING  # capped at a day


def test_walk_drain_of_caught_up_shards_is_empty():
    last = NOW - NOW % M + 7 * M
    # every walk is past the last bucket the tick wanted
    drain = walk_drain([last + M, last + M], [8, 1], last)
    assert (drain.backlog, drain.oldest_due, drain.drain_seconds) == (0, None, 0)


def test_walk_drain_follows_the_slowest_shard_after_an_outage():
    last = NOW - NOW % M + 7 * M
    # shard 0 is 30 buckets behind its horizon and walked 7 this tick (6 net a minute);
    # shard 1 is 10 behind and walked 11 (10 net); shard 2 is caught up
    marks = [last - 29 * M, last - 9 * M, last + M]
    drain = walk_drain(marks, [7, 11, 1], last)
    assert drain.backlog == 30 + 10
    assert drain.oldest_due == last - 29 * M  # the oldest bucket not walked
    assert drain.drain_seconds == 300  # shard 0: 30 buckets at 6 net per minute
    assert drain.processed_per_second == 19 / M
    assert drain.arriving_per_second == 3 / M


def test_walk_drain_of_a_shard_that_walked_one_bucket_is_not_draining():
    last = NOW - NOW % M + 7 * M
    drain = walk_drain([last - 5 * M], [1], last)
    assert (drain.backlog, drain.drain_seconds) == (6, NOT_DRAINING)


def test_delivery_drain_counts_the_window_per_tenant():
    window = 300
    due = [("big", NOW - 900), ("big", NOW - 10), ("big", NOW), ("small", NOW - 60)]
    # taken: two by "big" inside the window, one exactly at its start (outside), one later
    taken = [("big", NOW - 299), ("big", NOW), ("big", NOW - 300), ("small", NOW - 100)]
    fell_due = [("big", NOW - 10), ("small", NOW - 400)]
    overall, tenants = delivery_drain(due, taken, fell_due, now=NOW, window=window)
    assert (overall.backlog, overall.oldest_due) == (4, NOW - 900)
    assert overall.processed_per_second == 3 / window
    assert overall.arriving_per_second == 1 / window
    assert overall.drain_seconds == 600  # 4 at 2 net per 300 s
    big, small = tenants["big"], tenants["small"]
    assert (big.backlog, big.oldest_due, big.drain_seconds) == (3, NOW - 900, 900)
    assert (small.backlog, small.oldest_due, small.drain_seconds) == (1, NOW - 60, 300)


def test_delivery_drain_of_a_tenant_nobody_serves_is_not_draining():
    overall, tenants = delivery_drain([("t", NOW - 5)], [], [], now=NOW, window=300)
    assert tenants["t"].drain_seconds == NOT_DRAINING
    assert overall.drain_seconds == NOT_DRAINING
    empty, none = delivery_drain([], [], [], now=NOW, window=300)
    assert (empty.backlog, empty.oldest_due, empty.drain_seconds, none) == (0, None, 0, {})


def test_largest_ranks_by_backlog_then_age_and_leaves_out_the_empty():
    def d(backlog: int, oldest: int | None) -> Drain:
        return Drain(backlog, oldest, 0.0, 0.0, 0)

    tenants = {"a": d(5, NOW), "b": d(9, NOW), "c": d(5, NOW - 60), "e": d(0, None)}
    assert [t for t, _ in largest(tenants)] == ["b", "c", "a"]
    assert [t for t, _ in largest(tenants, 1)] == ["b"]


def test_queue_drain_sums_a_tenants_targets_and_ages_only_queues_with_messages_waiting():
    # GIVEN acme's two queues (one empty, whose idle age must not count) and beta's one
    queues = [
        ("acme", QueueFigures(waiting=100, oldest_age=300, deleted=600, sent=300)),
        ("acme", QueueFigures(waiting=0, oldest_age=5_000, deleted=300, sent=0)),
        ("beta", QueueFigures(waiting=20, oldest_age=40, deleted=0, sent=30)),
    ]
    overall, tenants = queue_drain(queues, now=NOW, window=300)
    # THEN acme: 100 waiting since NOW - 300, 3 deleted and 1 sent a second: 50 s
    assert tenants["acme"] == Drain(
        backlog=100,
        oldest_due=NOW - 300,
        processed_per_second=3.0,
        arriving_per_second=1.0,
        drain_seconds=50,
    )
    # AND beta is not draining; overall 120 at 3 - 1.1 a second
    assert tenants["beta"].drain_seconds == NOT_DRAINING
    assert (overall.backlog, overall.oldest_due) == (120, NOW - 300)
    assert overall.drain_seconds == estimate(120, processed=3.0, arriving=1.1) == 64


def test_queue_drain_of_no_queue_is_empty():
    overall, tenants = queue_drain([], now=NOW, window=300)
    assert (overall.backlog, overall.oldest_due, overall.drain_seconds, tenants) == (0, None, 0, {})
