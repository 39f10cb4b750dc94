"""A schedule's recent figures (punctual.domain.figures), from occurrences and attempts built
here: every outcome counted once by state, retried besides, both lags to the second, the
misfire episodes among the fires read, and the latest failure of every kind."""

from __future__ import annotations

from typing import Any

import pytest

from punctual.domain.figures import Spread, StateTimes, recent_figures, spread, state_times
from punctual.domain.ids import occurrence_id
from punctual.domain.occurrence import Attempt, AttemptOutcome, Occurrence, OccurrenceState
from punctual.domain.schedule import MissedEpisode

S = OccurrenceState
A = AttemptOutcome
T0 = 1_800_000_000
SID = "sch_alice_0123456789abcdef"


def occ(at: int, state: OccurrenceState = S.SUCCEEDED, **fields: Any) -> Occurrence:
    fields.setdefault("available_at", at)
    return Occurrence(
        occurrence_id=occurrence_id(SID, 1, at),
        tenant_id="alice",
        schedule_id=SID,
        schedule_version=1,
        scheduled_for=at,
        target="default",
        state=state,
        **fields,
    )


def tried(
    o: Occurrence, *steps: tuple[int, int | None, AttemptOutcome, str | None]
) -> tuple[Occurrence, list[Attempt]]:
    """``o`` with attempts (started, finished, outcome, error), its attempt count set."""
    attempts = [
        Attempt(
            occurrence_id=o.occurrence_id,
            attempt_no=n,
            started_at=start,
            lease_expires_at=start + 60,
            finished_at=end,
            outcome=outcome,
            error=error,
        )
        for n, (start, end, outcome, error) in enumerate(steps, 1)
    ]
    return o.model_copy(update={"attempt_count": len(attempts)}), attempts


def test_spread_is_nearest_rank() -> None:
    assert spread([]) is None
    assert spread([7]) == Spread(1, 7, 7, 7)
    assert spread([0, 60]) == Spread(2, 0, 60, 60)
    values = list(range(1, 201))  # 1..200: p50 is the 100th, p99 the 198th
    assert spread(values[::-1]) == Spread(200, 100, 198, 200)
    assert spread([5, 1, 3]) == Spread(3, 3, 5, 5)


def test_each_fire_counts_once_by_state_and_retried_besides() -> None:
    read = [
        tried(occ(T0), (T0 + 1, T0 + 2, A.SUCCEEDED, None)),
        tried(
            occ(T0 + 60),
            (T0 + 61, T0 + 62, A.RETRY, "flaky"),
            (T0 + 80, T0 + 81, A.SUCCEEDED, None),
        ),
        tried(occ(T0 + 120, S.DEAD), (T0 + 121, T0 + 122, A.DEAD, "boom")),
        (occ(T0 + 180, S.MISSED, reason="too late"), []),
        (occ(T0 + 240, S.SKIPPED_OVERLAP), []),
        (occ(T0 + 300, S.CANCELED, reason="schedule paused"), []),
        (occ(T0 + 360, S.SCHEDULED), []),
        tried(occ(T0 + 420, S.RUNNING), (T0 + 421, None, A.RUNNING, None)),
        tried(occ(T0 + 480, S.RETRY_WAIT), (T0 + 482, T0 + 483, A.RETRY, "later")),
    ]
    figures = recent_figures(read, [], unreadable=2)
    assert figures.fires == 9
    assert figures.since == T0
    counts = (
        figures.succeeded,
        figures.retried,
        figures.dead,
        figures.missed,
        figures.skipped,
        figures.canceled,
        figures.open,
    )
    assert counts == (2, 1, 1, 1, 1, 1, 3)
    assert figures.unreadable == 2
    # The latest failure: the RETRY_WAIT fire's failed attempt, at its end.
    failure = figures.last_failure
    assert failure is not None
    assert (failure.occurrence_id, failure.at, failure.what, failure.error) == (
        read[-1][0].occurrence_id,
        T0 + 483,
        "RETRY",
        "later",
    )


def test_lags_are_measured_from_the_due_time_of_each_claimed_fire() -> None:
    # A flexible fire due 40 s after its instant: its lags count from its due time.
    read = [
        tried(occ(T0, enqueued_at=T0 - 30), (T0 + 2, T0 + 3, A.SUCCEEDED, None)),
        tried(
            occ(T0 + 60, available_at=T0 + 100, enqueued_at=T0 + 105),
            (T0 + 107, None, A.RUNNING, None),
        ),
        tried(occ(T0 + 120, enqueued_at=T0 + 121), (T0 + 119, T0 + 130, A.SUCCEEDED, None)),
        (occ(T0 + 180, S.SCHEDULED), []),  # not claimed: no lag of either kind
    ]
    figures = recent_figures(read, [])
    # Sent ahead (with a delay): receivable at its due time, lag 0.
    assert figures.receivable_lag == Spread(3, 1, 5, 5)
    # A worker clock 1 s behind starts a handler "before" its due time: negative, as read.
    assert figures.start_lag == Spread(3, 2, 7, 7)
    assert recent_figures(read[1:2], []).start_lag == Spread(1, 7, 7, 7)
    assert recent_figures(read[2:3], []).start_lag == Spread(1, -1, -1, -1)


def test_no_fire_claimed_has_no_lag_and_no_fire_no_since() -> None:
    figures = recent_figures([(occ(T0, S.SCHEDULED), [])], [])
    assert (figures.receivable_lag, figures.start_lag, figures.last_failure) == (None, None, None)
    empty = recent_figures([], [])
    assert (empty.fires, empty.since, empty.open, empty.unreadable) == (0, None, 0, 0)


def test_an_episode_among_the_fires_read_counts_its_fires_missed() -> None:
    read = [
        tried(occ(T0 + 600), (T0 + 601, T0 + 602, A.SUCCEEDED, None)),
        tried(occ(T0), (T0 + 1, T0 + 2, A.SUCCEEDED, None)),
    ]
    before = MissedEpisode(version=1, first=T0 - 900, last=T0 - 60, count=15)
    within = MissedEpisode(version=1, first=T0 + 60, last=T0 + 540, count=9)
    # Ends at or after the earliest fire read: counted whole, and the window starts with it.
    # (Another version's: its span may hold this version's fires.)
    ending = MissedEpisode(version=2, first=T0 - 120, last=T0 + 600, count=12)
    figures = recent_figures(read, [before, within, ending])
    assert (figures.fires, figures.missed, figures.since) == (23, 21, T0 - 120)
    failure = figures.last_failure
    assert failure is not None
    assert (failure.occurrence_id, failure.at, failure.what) == (None, T0 + 600, "MISSED")
    assert failure.scheduled_for == T0 + 600
    assert failure.error == "12 fires of version 2 recorded MISSED by the misfire policy"
    # One that ends at the earliest fire read (another version's fire of that instant) counts.
    edge = MissedEpisode(version=2, first=T0 - 60, last=T0, count=2)
    assert recent_figures(read, [edge]).missed == 2
    # No fire read: every episode kept is counted.
    alone = recent_figures([], [before])
    assert (alone.fires, alone.missed, alone.since) == (15, 15, T0 - 900)


@pytest.mark.parametrize("state", [S.DEAD, S.MISSED])
def test_an_occurrence_ended_failed_without_a_failed_attempt_is_a_failure(
    state: OccurrenceState,
) -> None:
    # Refused at its claim, expired, or missed: no attempt says so, the occurrence does.
    read = [
        tried(occ(T0), (T0 + 1, T0 + 9, A.RETRY, "first")),
        (occ(T0 + 60, state, reason="deadline passed"), []),
    ]
    failure = recent_figures(read, []).last_failure
    assert failure is not None
    assert (failure.occurrence_id, failure.at, failure.what, failure.error) == (
        read[1][0].occurrence_id,
        T0 + 60,
        state.value,
        "deadline passed",
    )


def test_a_dead_attempt_is_the_failure_once_and_a_lost_one_counts_at_its_start() -> None:
    lost_then_dead = tried(
        occ(T0, S.DEAD),
        (T0 + 1, None, A.LOST, None),
        (T0 + 70, T0 + 75, A.DEAD, "gave up"),
    )
    failure = recent_figures([lost_then_dead], []).last_failure
    assert failure is not None
    assert (failure.at, failure.what, failure.error) == (T0 + 75, "DEAD", "gave up")
    lost = tried(occ(T0, S.RUNNING), (T0 + 1, None, A.LOST, None), (T0 + 70, None, A.RUNNING, None))
    failure = recent_figures([lost], []).last_failure
    assert failure is not None
    assert (failure.at, failure.what) == (T0 + 1, "LOST")
    # DEAD after a failed attempt of another kind: the occurrence's end is one more failure,
    # no earlier than that attempt.
    refused = tried(occ(T0, S.DEAD, reason="retries exhausted"), (T0 + 5, T0 + 90, A.RETRY, "x"))
    failure = recent_figures([refused], []).last_failure
    assert failure is not None
    assert (failure.at, failure.what, failure.error) == (T0 + 90, "DEAD", "retries exhausted")


def test_the_latest_failure_wins_across_fires_ties_by_the_later_fire() -> None:
    read = [
        tried(
            occ(T0 + 60),
            (T0 + 200, T0 + 210, A.RETRY, "late failure of an early fire"),
            (T0 + 300, T0 + 301, A.SUCCEEDED, None),
        ),
        tried(occ(T0 + 120, S.DEAD), (T0 + 121, T0 + 130, A.DEAD, "early failure")),
        tried(occ(T0 + 180, S.DEAD), (T0 + 181, T0 + 210, A.DEAD, "tie, later fire")),
    ]
    failure = recent_figures(read, []).last_failure
    assert failure is not None
    assert failure.error == "tie, later fire"
    failure = recent_figures(read[:2], []).last_failure
    assert failure is not None
    assert failure.error == "late failure of an early fire"


def test_two_versions_fires_of_one_instant_failing_in_one_second_give_one_failure() -> None:
    # (a change made both versions' fires of one instant: the same instant and failure time)
    first = tried(occ(T0, S.DEAD), (T0 + 1, T0 + 5, A.DEAD, "v1"))
    second = occ(T0, S.DEAD).model_copy(
        update={"occurrence_id": occurrence_id(SID, 2, T0), "schedule_version": 2}
    )
    failure = recent_figures(
        [first, tried(second, (T0 + 2, T0 + 5, A.DEAD, "v2"))], []
    ).last_failure
    assert failure is not None
    assert failure.error == "v1"  # the first read (the newest first: the read's order)


def test_a_backfilled_fire_of_an_episode_is_counted_once() -> None:
    # GIVEN an episode of 3 missed fires, one of which a backfill made later (its own id)
    episode = MissedEpisode(version=1, first=T0 + 60, last=T0 + 180, count=3)
    read = [
        tried(occ(T0 + 240), (T0 + 241, T0 + 242, A.SUCCEEDED, None)),
        tried(occ(T0 + 120), (T0 + 900, T0 + 901, A.SUCCEEDED, None)),  # the backfilled one
        tried(occ(T0), (T0 + 1, T0 + 2, A.SUCCEEDED, None)),
    ]
    figures = recent_figures(read, [episode])
    # THEN 5 fires: 3 made (succeeded), 2 missed; not 6
    assert (figures.fires, figures.succeeded, figures.missed) == (5, 3, 2)
    # AND an episode whose every fire was made later is no failure
    whole = MissedEpisode(version=1, first=T0 + 120, last=T0 + 120, count=1)
    made_later = recent_figures(read, [whole])
    assert made_later.last_failure is None
    assert (made_later.fires, made_later.missed) == (3, 0)


def test_with_no_fire_read_episodes_count_only_if_the_read_reached_the_first_item() -> None:
    episode = MissedEpisode(version=1, first=T0, last=T0 + 60, count=2)
    assert recent_figures([], [episode], reached=True).missed == 2
    # (stopped at its bound, behind manual runs: where the episode lies is not known)
    assert recent_figures([], [episode], reached=False).missed == 0


@pytest.mark.parametrize(
    ("enqueued", "steps", "expected"),
    [
        # sent ahead with a delay (receivable at its due time), claimed 2 s after it, a
        # run of 3 s that failed, 30 s of back-off, a run of 4 s
        (
            T0 - 170,
            [(T0 + 2, T0 + 5, A.RETRY), (T0 + 35, T0 + 39, A.SUCCEEDED)],
            StateTimes(0, 2, (3, 4), (30,)),
        ),
        # sent 7 s late (an outage of the relay), claimed 1 s after that, still running
        (T0 + 7, [(T0 + 8, None, A.RUNNING)], StateTimes(7, 1, (), ())),
        # not claimed yet: the send is not recorded yet either
        (None, [], StateTimes(None, None, (), ())),
        # an attempt taken over (its end never written): no wait measured after it
        (T0, [(T0 + 1, None, A.LOST), (T0 + 70, T0 + 71, A.SUCCEEDED)], StateTimes(0, 1, (1,), ())),
        # a worker clock 2 s behind SQS's: a negative wait, kept as measured
        (T0 + 1, [(T0 - 1, T0 + 3, A.SUCCEEDED)], StateTimes(1, -2, (4,), ())),
        # claimed, but its message carried no SentTimestamp: the send is not known, so
        # neither is the wait for the claim; the run is
        (None, [(T0 + 2, T0 + 3, A.SUCCEEDED)], StateTimes(None, None, (1,), ())),
        # sent (recorded) and no attempt yet
        (T0, [], StateTimes(0, None, (), ())),
    ],
    ids=[
        "retried",
        "sent-late",
        "not-claimed",
        "taken-over",
        "clock-behind",
        "send-unknown",
        "sent-not-claimed",
    ],
)
def test_state_times_split_an_occurrences_time_by_state(
    enqueued: int | None,
    steps: list[tuple[int, int | None, AttemptOutcome]],
    expected: StateTimes,
) -> None:
    o, attempts = tried(
        occ(T0, enqueued_at=enqueued),
        *[(start, end, outcome, None) for start, end, outcome in steps],
    )
    assert state_times(o, attempts) == expected


def test_state_times_of_a_flexible_occurrence_start_at_its_due_time() -> None:
    # GIVEN a flexible fire at T0 due (available) 40 s later, sent 3 s after that
    o, attempts = tried(
        occ(T0, available_at=T0 + 40, enqueued_at=T0 + 43), (T0 + 45, T0 + 46, A.SUCCEEDED, None)
    )
    # THEN the times count from its due time, not its scheduled instant
    assert state_times(o, attempts) == StateTimes(3, 2, (1,), ())
