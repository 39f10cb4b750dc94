"""The reconciler on daylight saving nights, on moto with the injected clock. It agrees with the
time contract on New York's spring-forward and fall-back nights, finding what an engine that
ignored the contract would have stored, and an hour that ends inside Adelaide's repeated hour
finds nothing unexpected."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from punctual.dal.common import to_dynamo
from punctual.dal.tables import occurrence_key
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id
from punctual.services import Services
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, make
from tests.integration.reconciler.helpers import (
    at,
    ids,
    materialize_until,
    plant,
    reconcile,
    shards_of,
    stored,
    total,
)

# --- DST ----------------------------------------------------------------------------------

NEW_YORK = "America/New_York"
SPRING = "2026-03-08"  # 02:00 EST -> 03:00 EDT at 07:00Z
FALL = "2026-11-01"  # 02:00 EDT -> 01:00 EST at 06:00Z
DST_CASES = {
    SPRING: {
        "30 1 * * *": ["06:30"],
        "30 2 * * *": [],  # 02:30 does not exist that day
        "*/30 * * * *": [
            "04:00",
            "04:30",
            "05:00",
            "05:30",
            "06:00",
            "06:30",
            "07:00",
            "07:30",
            "08:00",
            "08:30",
        ],
    },
    FALL: {
        "30 1 * * *": ["05:30"],  # once, at the earlier (EDT) 01:30
        "30 2 * * *": ["07:30"],
        # the repeated 01:00-01:59 (06:00Z-06:59Z) fires nothing the second time
        "*/30 * * * *": ["04:00", "04:30", "05:00", "05:30", "07:00", "07:30", "08:00", "08:30"],
    },
}
# What an engine that ignored the contract would have stored: a second 01:30 on the
# fall-back night, and the nonexistent 02:30 shifted to 03:30 EDT on the spring night.
NAIVE = {FALL: ("30 1 * * *", "06:30"), SPRING: ("30 2 * * *", "07:30")}


@pytest.mark.parametrize("day", [SPRING, FALL])
def test_reconciler_agrees_with_the_time_contract_on_dst_nights(
    alice: Api, aws: Services, clock: Clock, day: str
):
    # GIVEN '30 1 * * *', '30 2 * * *' and '*/30 * * * *' in New York, created the evening
    # before and materialized through the night
    clock.now = at("03:30", day)
    schedules = {expr: make(aws, spec=cron_spec(expr, NEW_YORK)) for expr in DST_CASES[day]}
    materialize_until(aws, clock, at("09:10", day), shards_of(aws, schedules.values()))
    # WHEN the reconciler checks [04:00Z, 09:00Z)
    clock.now = at("10:00", day)
    results = reconcile(aws, at("04:00", day), at("09:00", day))
    # THEN it expects exactly the contract's instants, all of which are stored
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.UNEXPECTED) == 0
    for expression, sid in schedules.items():
        found = sorted(
            o["scheduled_for"]
            for o in stored(aws, since=at("04:00", day), until=at("09:00", day))
            if o["schedule_id"] == sid
        )
        assert found == [at(t, day) for t in DST_CASES[day][expression]], expression
    assert total(results, Finding.IN_FLIGHT) == sum(len(v) for v in DST_CASES[day].values())
    # WHEN an occurrence a contract-blind engine would have made is stored (with the local
    # wall time it shows: on the fall-back night the second 01:30, which the rules in use
    # still show at its instant, so it is not a fire planned under older rules), and a real
    # one is lost
    expression, wrong = NAIVE[day]
    wall = datetime.fromtimestamp(at(wrong, day), ZoneInfo(NEW_YORK)).replace(tzinfo=None)
    bogus = plant(aws, schedules[expression], 1, at(wrong, day), local=wall.isoformat())
    real = occurrence_id(schedules["*/30 * * * *"], 1, at("05:30", day))
    aws.dynamodb.delete_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(real)),
    )
    again = reconcile(aws, at("04:00", day), at("09:00", day), repair=False)
    # THEN the stray one is UNEXPECTED and the lost one MISSING, nothing else
    assert ids(again, "unexpected") == {bogus}
    assert ids(again, "missing") == {real}


ADELAIDE = "Australia/Adelaide"
ADELAIDE_FALL = "2026-04-04"  # 03:00 ACDT -> 02:00 ACST at 16:30Z: 02:00-02:59 twice
# Each schedule's fires in [16:00Z, 17:00Z), the hour that ends at 02:30 of the repeated
# hour's second pass (ACST): only first-pass instants (the earlier, in ACDT) fire.
ADELAIDE_HOUR = {
    "*/15 * * * *": ["16:00", "16:15"],  # 02:30, 02:45 ACDT; 02:00-02:29 fired at 15:30Z on
    "0 * * * *": [],  # 02:00 ACDT fired at 15:30Z, 03:00 ACST is 17:30Z
    "30 * * * *": ["16:00"],
    "45 2 * * *": ["16:15"],
}


def test_reconciler_hour_ending_inside_adelaides_repeated_hour_finds_nothing_unexpected(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN Adelaide schedules (a zone half an hour off UTC) made at 14:50Z on the night its
    # clocks go back, materialized through the night
    day = ADELAIDE_FALL
    clock.now = at("14:50", day)
    schedules = {expr: make(aws, spec=cron_spec(expr, ADELAIDE)) for expr in ADELAIDE_HOUR}
    materialize_until(aws, clock, at("17:10", day), shards_of(aws, schedules.values()))
    # WHEN the reconciler checks the hours around the change: [15:00Z, 16:00Z) ends at 02:30
    # ACDT, in the repeated hour's first pass, [16:00Z, 17:00Z) at 02:30 ACST, in its second
    clock.now = at("18:05", day)
    hours = {
        start: reconcile(aws, at(start, day), at(end, day), repair=False)
        for start, end in [("15:00", "16:00"), ("16:00", "17:00")]
    }
    # THEN no hour finds a stored fire it did not expect, nor one missing: the expected
    # fires of the hour ending in the repeated hour include those of its first pass
    for start, results in hours.items():
        assert total(results, Finding.UNEXPECTED) == 0, start
        assert total(results, Finding.MISSING) == 0, start
    for expression, sid in schedules.items():
        found = sorted(
            o["scheduled_for"]
            for o in stored(aws, since=at("16:00", day), until=at("17:00", day))
            if o["schedule_id"] == sid
        )
        assert found == [at(t, day) for t in ADELAIDE_HOUR[expression]], expression
    assert total(hours["16:00"], Finding.IN_FLIGHT) == 4


# --- DST choices (docs/time.md, *Daylight saving: the choice per schedule*) ---------------

# (night, expression, choice) -> the fires it makes in [04:00Z, 09:00Z) that night, and an
# instant where a stray occurrence is UNEXPECTED under that choice (the default's fire).
CHOICES = {
    (SPRING, "30 2 * * *", "SHIFT"): (["07:00"], "07:30"),
    (SPRING, "*/30 2-3 * * *", "SHIFT"): (["07:00", "07:30"], "06:30"),
    (FALL, "30 1 * * *", "LAST"): (["06:30"], "05:30"),
    (FALL, "30 1 * * *", "BOTH"): (["05:30", "06:30"], "07:30"),
    (FALL, "*/30 1 * * *", "BOTH"): (["05:00", "05:30", "06:00", "06:30"], "07:00"),
}


@pytest.mark.parametrize(("day", "expression", "choice"), list(CHOICES))
def test_materializer_and_reconciler_follow_the_schedules_dst_choice(
    alice: Api, aws: Services, clock: Clock, day: str, expression: str, choice: str
):
    # GIVEN a New York cron with a DST choice, created the evening before and materialized
    # through the night
    clock.now = at("03:30", day)
    dst = {"gap": choice} if choice == "SHIFT" else {"repeat": choice}
    sid = make(aws, spec=cron_spec(expression, NEW_YORK) | {"dst": dst})
    materialize_until(aws, clock, at("09:10", day), shards_of(aws, [sid]))
    # WHEN the reconciler checks [04:00Z, 09:00Z)
    clock.now = at("10:00", day)
    results = reconcile(aws, at("04:00", day), at("09:00", day), repair=False)
    # THEN the fires are the choice's (each with its own occurrence id), all expected
    expected, stray = CHOICES[(day, expression, choice)]
    found = [
        o
        for o in stored(aws, since=at("04:00", day), until=at("09:00", day))
        if o["schedule_id"] == sid
    ]
    assert sorted(o["scheduled_for"] for o in found) == [at(t, day) for t in expected]
    assert len({o["occurrence_id"] for o in found}) == len(expected)
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.UNEXPECTED) == 0
    # WHEN an occurrence is stored where the choice does not fire, and one it made is lost
    wall = datetime.fromtimestamp(at(stray, day), ZoneInfo(NEW_YORK)).replace(tzinfo=None)
    bogus = plant(aws, sid, 1, at(stray, day), local=wall.isoformat())
    lost = occurrence_id(sid, 1, at(expected[-1], day))
    aws.dynamodb.delete_item(
        TableName=aws.settings.occurrences_table, Key=to_dynamo(occurrence_key(lost))
    )
    again = reconcile(aws, at("04:00", day), at("09:00", day), repair=False)
    # THEN the stray one is UNEXPECTED and the lost one MISSING: the check follows the choice
    assert ids(again, "unexpected") == {bogus}
    assert ids(again, "missing") == {lost}
