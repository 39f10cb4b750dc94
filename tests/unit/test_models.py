"""Domain models: schedule validation, field_errors, Schedule.rule and the occurrence states."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from punctual.domain.occurrence import TERMINAL, TRANSITIONS, OccurrenceState, can_transition
from punctual.domain.policies import MisfireAction
from punctual.domain.schedule import MAX_PAYLOAD_BYTES, Schedule, ScheduleDefinition
from punctual.domain.specs import AtSpec, CronSpec, RateSpec
from punctual.domain.validation import field_errors
from punctual.timing import MAX_INSTANT, CronRule, OneShotRule, RateRule, utc_text

CRON: dict[str, Any] = {
    "kind": "cron",
    "expression": "30 9 * * mon-fri",
    "timezone": "Europe/Berlin",
}
RATE: dict[str, Any] = {"kind": "rate", "expression": "rate(15 minutes)"}
AT: dict[str, Any] = {"kind": "at", "at": "2026-12-24T18:00:00", "timezone": "Europe/Berlin"}


def _definition(**overrides: Any) -> dict[str, Any]:
    return {"spec": CRON, "target": "orders-queue"} | overrides


def _errors(data: dict[str, Any]) -> list[dict[str, str]]:
    with pytest.raises(ValidationError) as caught:
        ScheduleDefinition.model_validate(data)
    return field_errors(caught.value)


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


# --- valid definitions --------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "spec_type"),
    [
        pytest.param(CRON, CronSpec, id="cron"),
        pytest.param(RATE, RateSpec, id="rate"),
        pytest.param(AT, AtSpec, id="at"),
        pytest.param({**CRON, "expression": "@DAILY"}, CronSpec, id="cron_macro"),
        pytest.param({**AT, "at": "2026-12-24T17:00:00Z", "timezone": None}, AtSpec, id="at_utc"),
    ],
)
def test_schedule_definition_spec_discriminated_by_kind(spec: dict[str, Any], spec_type: type):
    # GIVEN a definition whose spec has kind cron, rate or at
    # WHEN validated
    definition = ScheduleDefinition.model_validate(_definition(spec=spec))
    # THEN the spec is parsed into the model for that kind, with defaults filled in
    assert type(definition.spec) is spec_type
    assert definition.spec.kind == spec["kind"]
    assert definition.strict is True
    assert definition.misfire.action is MisfireAction.FIRE_ONCE


def test_schedule_definition_round_trips_through_json():
    # GIVEN a fully specified definition
    data = _definition(
        name="nightly",
        payload={"report": "daily", "n": 3, "tags": ["a", "b"]},
        flexible_window_seconds=900,
        misfire={"action": "CATCHUP", "catchup_limit": 5},
        overlap="SKIP_IF_RUNNING",
        retry={"max_attempts": 5, "backoff_base_seconds": 30, "backoff_max_seconds": 30},
    )
    # WHEN validated, dumped to JSON and validated again
    first = ScheduleDefinition.model_validate(data)
    second = ScheduleDefinition.model_validate_json(first.model_dump_json())
    # THEN nothing is lost, and the flexible window makes it non-strict
    assert second == first
    assert second.strict is False
    assert second.misfire.catchup_limit == 5


@pytest.mark.parametrize("window", [0, 1, 900])
def test_schedule_definition_flexible_window_edges_accepted(window: int):
    # GIVEN a flexible window on the edges of 0..900
    # WHEN validated; THEN it is accepted as given
    definition = ScheduleDefinition.model_validate(_definition(flexible_window_seconds=window))
    assert definition.flexible_window_seconds == window


def test_schedule_definition_payload_at_limit_accepted():
    # GIVEN a payload whose compact JSON is exactly 32 KiB ('{"k":"' + x... + '"}' = 8 + n)
    payload = {"k": "x" * (MAX_PAYLOAD_BYTES - 8)}
    assert len(json.dumps(payload, separators=(",", ":"))) == MAX_PAYLOAD_BYTES
    # WHEN validated; THEN it is accepted
    definition = ScheduleDefinition.model_validate(_definition(payload=payload))
    assert definition.payload == payload


def test_schedule_definition_misfire_catchup_limit_with_catchup_accepted():
    # GIVEN catchup_limit with action CATCHUP; WHEN validated; THEN it is kept
    data = _definition(misfire={"action": "CATCHUP", "catchup_limit": 3})
    assert ScheduleDefinition.model_validate(data).misfire.catchup_limit == 3


# --- invalid definitions and field_errors -------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "reason_part"),
    [
        pytest.param(
            _definition(spec={**CRON, "expression": "0 9 * *"}),
            "spec.expression",
            "expected 5 fields",
            id="cron_four_fields",
        ),
        pytest.param(
            _definition(spec={**CRON, "expression": "0 0 30 2 *"}),
            "spec.expression",
            "can never fire",
            id="cron_never_fires",
        ),
        pytest.param(
            _definition(spec={**CRON, "timezone": "Mars/Base"}),
            "spec.timezone",
            "'Mars/Base' is not an IANA time zone name",
            id="cron_bad_zone",
        ),
        pytest.param(
            _definition(spec={**RATE, "expression": "rate(5 seconds)"}),
            "spec.expression",
            "is not a rate",
            id="rate_bad_expression",
        ),
        pytest.param(
            _definition(spec={**RATE, "timezone": "Nowhere"}),
            "spec.timezone",
            "not an IANA time zone name",
            id="rate_bad_zone",
        ),
        pytest.param(
            _definition(spec={**AT, "at": "2026-03-08T02:30:00", "timezone": "America/New_York"}),
            "spec.at",
            "does not exist",
            id="at_nonexistent",
        ),
        pytest.param(
            _definition(spec={**AT, "timezone": None}),
            "spec.at",
            "no UTC offset",
            id="at_naive_without_zone",
        ),
        pytest.param(
            _definition(spec={**AT, "at": "next tuesday"}),
            "spec.at",
            "not an ISO-8601 date-time",
            id="at_not_iso",
        ),
        pytest.param(
            _definition(spec={**AT, "timezone": "Europe/Atlantis"}),
            "spec.timezone",
            "not an IANA time zone name",
            id="at_bad_zone",
        ),
        pytest.param(
            _definition(target="-starts-with-dash"),
            "target",
            "should match pattern",
            id="target_bad_name",
        ),
        pytest.param(_definition(target=""), "target", "should match pattern", id="target_empty"),
        pytest.param(
            _definition(target="a" * 65), "target", "should match pattern", id="target_too_long"
        ),
        pytest.param(
            _definition(flexible_window_seconds=901),
            "flexible_window_seconds",
            "less than or equal to 900",
            id="window_too_big",
        ),
        pytest.param(
            _definition(flexible_window_seconds=-1),
            "flexible_window_seconds",
            "greater than or equal to 0",
            id="window_negative",
        ),
        pytest.param(
            _definition(payload={"k": "x" * (MAX_PAYLOAD_BYTES - 7)}),
            "payload",
            f"payload is {MAX_PAYLOAD_BYTES + 1} bytes; at most {MAX_PAYLOAD_BYTES} allowed",
            id="payload_one_byte_over",
        ),
        pytest.param(
            _definition(retry={"backoff_base_seconds": 100, "backoff_max_seconds": 50}),
            "retry",
            "backoff_base_seconds must not exceed backoff_max_seconds",
            id="retry_base_above_max",
        ),
        pytest.param(
            _definition(misfire={"action": "SKIP", "catchup_limit": 5}),
            "misfire",
            "catchup_limit applies only when action is CATCHUP",
            id="misfire_limit_with_skip",
        ),
        pytest.param(
            _definition(misfire={"catchup_limit": 5}),
            "misfire",
            "catchup_limit applies only when action is CATCHUP",
            id="misfire_limit_with_default_action",
        ),
        pytest.param(
            _definition(
                spec={
                    **CRON,
                    "start_at": "2026-02-01T00:00:00Z",
                    "end_at": "2026-01-01T00:00:00Z",
                }
            ),
            "spec",
            "end_at must be later than start_at",
            id="end_before_start",
        ),
        pytest.param(
            _definition(
                spec={
                    **RATE,
                    "start_at": "2026-01-01T00:00:00Z",
                    "end_at": "2026-01-01T01:00:00+01:00",
                }
            ),
            "spec",
            "end_at must be later than start_at",
            id="end_equal_start_other_offset",
        ),
        pytest.param(
            _definition(spec={**CRON, "start_at": "2026-01-01T00:00:00"}),
            "spec.start_at",
            "timezone",
            id="naive_start_at",
        ),
        pytest.param(
            _definition(colour="blue"), "colour", "Extra inputs are not permitted", id="extra_top"
        ),
        pytest.param(
            _definition(spec={**CRON, "seconds": "0"}),
            "spec.seconds",
            "Extra inputs are not permitted",
            id="extra_in_spec",
        ),
        pytest.param(
            _definition(retry={"jitter": True}),
            "retry.jitter",
            "Extra inputs are not permitted",
            id="extra_in_retry",
        ),
        pytest.param(
            _definition(spec={**CRON, "kind": "interval"}),
            "spec",
            "does not match any of the expected tags",
            id="unknown_kind",
        ),
        pytest.param(
            _definition(spec={"expression": "0 9 * * *", "timezone": "UTC"}),
            "spec",
            "discriminator 'kind'",
            id="missing_kind",
        ),
        pytest.param({"target": "q"}, "spec", "Field required", id="missing_spec"),
    ],
)
def test_field_errors_names_field_and_reason(data: dict[str, Any], field: str, reason_part: str):
    # GIVEN a definition with exactly one problem
    # WHEN validated
    errors = _errors(data)
    # THEN field_errors reports one entry naming the dotted field (no union tag) and reason
    assert len(errors) == 1, errors
    assert errors[0]["field"] == field
    assert reason_part in errors[0]["reason"]
    assert not errors[0]["reason"].startswith("Value error")


def test_field_errors_reports_every_problem():
    # GIVEN a definition with three independent problems
    data = _definition(
        spec={**CRON, "expression": "61 * * * *"}, target="!", flexible_window_seconds=1000
    )
    # WHEN validated
    errors = _errors(data)
    # THEN each problem gets its own entry
    assert sorted(e["field"] for e in errors) == [
        "flexible_window_seconds",
        "spec.expression",
        "target",
    ]
    reasons = {e["field"]: e["reason"] for e in errors}
    assert "minute field" in reasons["spec.expression"]


def test_field_errors_only_zone_reported_when_at_zone_is_bad():
    # GIVEN a local 'at' that would not exist in New York, but with an unknown zone
    data = _definition(spec={**AT, "at": "2026-03-08T02:30:00", "timezone": "Bad/Zone"})
    # WHEN validated
    errors = _errors(data)
    # THEN only the zone is reported: the 'at' check needs a valid zone to run
    assert [e["field"] for e in errors] == ["spec.timezone"]


def test_schedule_definition_payload_size_counts_utf8_bytes():
    # GIVEN a payload of 6,000 'é' (2 bytes each in UTF-8: 12,008 bytes of compact JSON)
    payload = {"k": "\u00e9" * 6000}
    utf8 = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert len(utf8) < MAX_PAYLOAD_BYTES // 2
    # WHEN validated
    definition = ScheduleDefinition.model_validate(_definition(payload=payload))
    # THEN it is accepted: it is well under 32 KiB
    assert definition.payload == payload


# --- Schedule.rule ------------------------------------------------------------------


def _schedule(spec: dict[str, Any], created_at: str = "2026-01-01T10:07:00Z") -> Schedule:
    return Schedule.model_validate(
        _definition(spec=spec)
        | {
            "tenant_id": "t1",
            "schedule_id": "s1",
            "version": 1,
            "created_at": created_at,
            "updated_at": created_at,
        }
    )


def test_schedule_rule_rate_anchors_on_created_at_by_default():
    # GIVEN a rate schedule with neither anchor nor start_at, created at 10:07
    schedule = _schedule(RATE)
    # WHEN its rule is built
    rule = schedule.rule()
    # THEN fires are created_at + k * 15 min
    assert isinstance(rule, RateRule)
    assert rule.anchor == _epoch("2026-01-01T10:07:00Z")
    fires = rule.fires(_epoch("2026-01-01T10:00:00Z"), _epoch("2026-01-01T10:40:00Z"))
    assert [utc_text(f) for f in fires] == [
        "2026-01-01T10:07:00Z",
        "2026-01-01T10:22:00Z",
        "2026-01-01T10:37:00Z",
    ]


def test_schedule_rule_rate_prefers_anchor_then_start_at():
    # GIVEN rate schedules with an explicit anchor, and with only a start_at
    anchored = _schedule(
        {**RATE, "anchor": "2026-01-01T00:01:00Z", "start_at": "2026-01-02T00:00:00Z"}
    )
    started = _schedule({**RATE, "start_at": "2026-01-02T00:05:00+01:00"})
    # WHEN their rules are built
    # THEN the anchor wins over start_at, and start_at wins over created_at
    anchored_rule, started_rule = anchored.rule(), started.rule()
    assert isinstance(anchored_rule, RateRule)
    assert isinstance(started_rule, RateRule)
    assert anchored_rule.anchor == _epoch("2026-01-01T00:01:00Z")
    assert started_rule.anchor == _epoch("2026-01-01T23:05:00Z")


def test_rate_spec_rule_without_any_anchor_rejected():
    # GIVEN a bare RateSpec used outside a Schedule (no creation time)
    spec = RateSpec(expression="rate(1 hour)")
    # WHEN its rule is built without created_at
    # THEN it refuses rather than inventing an anchor
    with pytest.raises(ValueError, match="needs an anchor"):
        spec.rule()


def test_schedule_rule_cron_and_at_carry_zone_and_bounds():
    # GIVEN a bounded cron schedule and a local one-shot schedule
    cron = _schedule({**CRON, "start_at": "2026-03-02T00:00:00Z", "end_at": "2026-03-03T23:59:59Z"})
    at = _schedule(AT)
    # WHEN their rules are built
    cron_rule, at_rule = cron.rule(), at.rule()
    # THEN the cron rule is in Berlin time and clipped; the one-shot is 18:00 CET
    assert isinstance(cron_rule, CronRule)
    assert cron_rule.zone_name == "Europe/Berlin"
    fires = cron_rule.fires(_epoch("2026-03-01T00:00:00Z"), _epoch("2026-03-10T00:00:00Z"))
    assert [utc_text(f) for f in fires] == ["2026-03-02T08:30:00Z", "2026-03-03T08:30:00Z"]
    assert isinstance(at_rule, OneShotRule)
    assert utc_text(at_rule.instant) == "2026-12-24T17:00:00Z"


def test_at_spec_resolved_carries_ambiguity_note():
    # GIVEN a local 'at' in New York's repeated hour
    spec = AtSpec(at="2026-11-01T01:30:00", timezone="America/New_York")
    # WHEN resolved
    resolved = spec.resolved()
    # THEN the earlier instant is used and the note mentions the repeat
    assert utc_text(resolved.instant) == "2026-11-01T05:30:00Z"
    assert resolved.note is not None
    assert "twice" in resolved.note


def test_schedule_version_must_be_positive():
    # GIVEN a schedule record with version 0
    # WHEN validated; THEN it is rejected on 'version'
    with pytest.raises(ValidationError) as caught:
        Schedule.model_validate(
            _definition()
            | {
                "tenant_id": "t1",
                "schedule_id": "s1",
                "version": 0,
                "created_at": datetime(2026, 1, 1, tzinfo=UTC),
                "updated_at": datetime(2026, 1, 1, tzinfo=UTC),
            }
        )
    assert [e["field"] for e in field_errors(caught.value)] == ["version"]


# --- occurrence state machine -------------------------------------------------------

S = OccurrenceState

# The design's lifecycle, with ENQUEUED folded into SCHEDULED: the relay does not mark the
# send (docs/decisions.md, 2026-11-30), so SCHEDULED covers "waiting in the queue" and a
# retry waits in RETRY_WAIT until a worker claims it again.
DESIGN_MOVES = {
    (S.SCHEDULED, S.RUNNING),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.RETRY_WAIT),
    (S.RETRY_WAIT, S.RUNNING),
    (S.RUNNING, S.DEAD),
    (S.RETRY_WAIT, S.DEAD),
    (S.SCHEDULED, S.CANCELED),
    (S.SCHEDULED, S.MISSED),
    (S.SCHEDULED, S.SKIPPED_OVERLAP),
}
# Further moves the model also allows (lease takeover, deadline expiry or an unsendable
# message before running, cancel during a run or a back-off, overlap on retry).
OPERATIONAL_MOVES = {
    (S.RUNNING, S.RUNNING),
    (S.SCHEDULED, S.DEAD),
    (S.RUNNING, S.CANCELED),
    (S.RETRY_WAIT, S.CANCELED),
    (S.RETRY_WAIT, S.SKIPPED_OVERLAP),
    # An abandoned run whose schedule's run slot another occurrence took.
    (S.RUNNING, S.SKIPPED_OVERLAP),
}
ALLOWED = DESIGN_MOVES | OPERATIONAL_MOVES
EXPECTED_TERMINAL = {S.SUCCEEDED, S.DEAD, S.MISSED, S.CANCELED, S.SKIPPED_OVERLAP}


def test_transitions_table_covers_every_state():
    # GIVEN the transition table; WHEN listing its keys
    # THEN every occurrence state has an entry (none would KeyError in can_transition)
    assert set(TRANSITIONS) == set(OccurrenceState)


@pytest.mark.parametrize(
    ("current", "target"), sorted(DESIGN_MOVES), ids=lambda s: s.value if isinstance(s, S) else s
)
def test_can_transition_allows_every_design_move(current: OccurrenceState, target: OccurrenceState):
    # GIVEN a move from the design's lifecycle
    # WHEN checked; THEN it is allowed
    assert can_transition(current, target)


def test_can_transition_design_happy_path_and_retry_loop():
    # GIVEN the happy path with one retry
    path = [S.SCHEDULED, S.RUNNING, S.RETRY_WAIT, S.RUNNING, S.SUCCEEDED]
    # WHEN each step is checked; THEN every step is allowed and the end is terminal
    assert all(can_transition(a, b) for a, b in itertools.pairwise(path))
    assert path[-1] in TERMINAL


def test_terminal_states_are_exactly_the_final_ones():
    # GIVEN the derived TERMINAL set; WHEN compared with the design
    # THEN the five final states, and only they, are terminal
    assert set(TERMINAL) == EXPECTED_TERMINAL


@pytest.mark.parametrize("terminal", sorted(EXPECTED_TERMINAL), ids=lambda s: s.value)
def test_can_transition_terminal_state_allows_nothing(terminal: OccurrenceState):
    # GIVEN a terminal state
    # WHEN checking a move to every state, itself included
    # THEN none is allowed
    assert [t for t in OccurrenceState if can_transition(terminal, t)] == []


def test_can_transition_nothing_returns_to_scheduled():
    # GIVEN every state; WHEN checking a move back to SCHEDULED
    # THEN none is allowed, not even SCHEDULED -> SCHEDULED
    assert [s for s in OccurrenceState if can_transition(s, S.SCHEDULED)] == []


def test_can_transition_brute_force_matches_hand_written_table():
    # GIVEN the hand-written allowed set
    # WHEN checking all 81 ordered pairs of states
    actual = {(a, b) for a in OccurrenceState for b in OccurrenceState if can_transition(a, b)}
    # THEN exactly the listed moves are allowed, nothing more and nothing less
    assert actual - ALLOWED == set(), "allowed but not in the hand-written table"
    assert ALLOWED - actual == set(), "in the hand-written table but refused"


def test_every_state_can_reach_a_terminal_state():
    # GIVEN the transition graph
    # WHEN searching forward from each state
    # THEN some terminal state is always reachable (no trap cycles)
    for start in OccurrenceState:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & EXPECTED_TERMINAL, start


@settings(max_examples=300, deadline=None)
@given(choices=st.lists(st.integers(min_value=0, max_value=1000), max_size=40))
def test_occurrence_random_walk_ends_terminal_or_keeps_moving(choices: list[int]) -> None:
    # GIVEN a new occurrence and a random sequence of choices among the allowed moves
    state = S.SCHEDULED
    # WHEN walking the state machine with them
    for choice in choices:
        moves = sorted(TRANSITIONS[state])
        if state in EXPECTED_TERMINAL:
            # THEN a terminal state offers no move at all
            assert moves == []
            break
        # THEN a non-terminal state always offers a move, and the move is allowed
        assert moves, f"{state} is stuck but not terminal"
        target = moves[choice % len(moves)]
        assert can_transition(state, target)
        assert target is not S.SCHEDULED
        state = target
    # THEN the walk ended terminal, or can still move on
    assert state in EXPECTED_TERMINAL or TRANSITIONS[state]


# --- input rules: numbers are numbers, instants within the calendar, storable payloads ---


def test_schedule_definition_takes_a_whole_number_written_with_a_zero_fraction():
    # GIVEN numbers JSON writes as 60.0 (JSON Schema's `integer` admits them)
    definition = ScheduleDefinition.model_validate(
        {
            "spec": CRON,
            "target": "default",
            "flexible_window_seconds": 60.0,
            "retry": {"max_attempts": 5.0},
            "misfire": {"action": "CATCHUP", "catchup_limit": 3.0},
        }
    )
    # THEN each is the integer it equals
    assert definition.flexible_window_seconds == 60
    assert isinstance(definition.flexible_window_seconds, int)
    assert (definition.retry.max_attempts, definition.misfire.catchup_limit) == (5, 3)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"flexible_window_seconds": "60"}, "flexible_window_seconds"),
        ({"flexible_window_seconds": True}, "flexible_window_seconds"),
        ({"flexible_window_seconds": 60.5}, "flexible_window_seconds"),
        ({"retry": {"max_attempts": 2.5}}, "retry.max_attempts"),
        ({"retry": {"deadline_seconds": "3600"}}, "retry.deadline_seconds"),
        ({"misfire": {"action": "CATCHUP", "catchup_limit": True}}, "misfire.catchup_limit"),
        ({"spec": {**RATE, "anchor": 1_795_000_000}}, "spec.anchor"),
        ({"spec": {**RATE, "anchor": "1795000000.5"}}, "spec.anchor"),
        ({"spec": {**RATE, "anchor": "9999-01-01T00:00:00Z"}}, "spec.anchor"),
        ({"spec": {**CRON, "start_at": "0001-12-31T23:59:59Z"}}, "spec.start_at"),
        ({"spec": {**AT, "at": "9999-06-01T00:00:00"}}, "spec.at"),
    ],
)
def test_schedule_definition_refuses_lax_numbers_and_instants_off_the_calendar(
    overrides: dict[str, Any], field: str
):
    # WHEN a number is given as text or a boolean, an instant as a number or past the calendar
    with pytest.raises(ValidationError) as refused:
        ScheduleDefinition.model_validate(_definition(**overrides))
    # THEN the field is named
    assert field_errors(refused.value)[0]["field"] == field


def test_schedule_definition_takes_the_calendar_s_first_and_last_second():
    # GIVEN start and end at the calendar's edges; THEN both are accepted
    spec = {**CRON, "start_at": "0002-01-01T00:00:00Z", "end_at": "9998-12-31T23:59:59Z"}
    definition = ScheduleDefinition.model_validate(_definition(spec=spec))
    assert definition.spec.bounds().end == MAX_INSTANT


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"a": _nested(15)}, None),
        ({"a": _nested(16)}, "payload.a" + ".0" * 15 + " nests deeper than 16 levels"),
        ({"big": 10**38 - 1, "small": -1e-130, "zero": 0.0}, None),
        ({"n": 10**38}, "payload.n: 100000000000000000000000000000000000000 is not a number"),
        ({"n": 1e38}, "payload.n: 1e+38 is not a number"),
        ({"n": 5e-324}, "payload.n: 5e-324 is not a number"),
        ({"n": float("nan")}, "payload.n: nan is not a number"),
        ({"m": {"": 1}}, "payload.m has an empty key"),
    ],
)
def test_schedule_definition_payload_must_be_storable(payload: dict[str, Any], reason: str | None):
    # WHEN a payload is checked; THEN it is accepted, or refused naming the part and why
    if reason is None:
        assert ScheduleDefinition.model_validate(_definition(payload=payload)).payload == payload
        return
    with pytest.raises(ValidationError) as refused:
        ScheduleDefinition.model_validate(_definition(payload=payload))
    [error] = field_errors(refused.value)
    assert error["field"] == "payload"
    assert error["reason"].startswith(reason), error


def test_stored_schedule_payload_is_not_judged_again_on_read():
    # GIVEN a stored schedule whose payload DynamoDB gave back with a large integral number
    # (1e40 is written as 1E+40 and read back as the integer 10**40)
    stored = {
        **_definition(payload={"n": 10**40}),
        "tenant_id": "acme",
        "schedule_id": "sch_a",
        "version": 1,
        "created_at": datetime(2026, 11, 18, tzinfo=UTC),
        "updated_at": datetime(2026, 11, 18, tzinfo=UTC),
    }
    # WHEN it is loaded; THEN it loads (the input rules judged it when it was written)
    assert Schedule.model_validate(stored).payload == {"n": 10**40}
