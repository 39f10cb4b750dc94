"""The fields every domain record is built of: the record base, an instant, a count."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from punctual.timing import in_calendar, to_epoch


class Record(BaseModel):
    """A domain record: immutable once made, and no field it does not define (a typo in a
    request, or an attribute a tenant wrote into a stored item, is refused, not ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _text_or_datetime(value: Any) -> Any:
    # Pydantic would read a number, or a string holding one, as seconds since the epoch.
    number = isinstance(value, int | float)
    if isinstance(value, str):
        try:
            float(value)
            number = True
        except ValueError:
            pass
    if number:
        raise ValueError("an instant is an ISO-8601 date-time with an offset, not a number")
    return value


def _in_calendar(moment: datetime) -> datetime:
    in_calendar(to_epoch(moment))
    return moment


Instant = Annotated[AwareDatetime, BeforeValidator(_text_or_datetime), AfterValidator(_in_calendar)]
"""An aware date-time within the calendar the time engine computes in."""


# A number is a number: no "60" or true where an integer is due.
def whole(value: object) -> object:
    """A number JSON writes with a zero fraction (355.0) as the integer it equals: JSON
    Schema's `integer` admits it. 355.5, "355" and true stay refused (strict)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# (The Field before the validator: a constraint added where it is used then shows in the
# schema as minimum/maximum.)
StrictCount = Annotated[int, Field(strict=True), BeforeValidator(whole)]

EpochSeconds = Annotated[int, AfterValidator(in_calendar)]
"""An instant in epoch seconds within Punctual's calendar: what a stored record's instants
must be (a tenant's worker may write any number into its own items; one no date can show
makes the item unreadable, counted, rather than failing whatever shows it)."""


def _wall_time(text: str) -> str:
    # A re-plan and the reconciler read it back as a wall time: a tenant's worker may write
    # anything into its occurrence items, and an item with something else in it is that
    # tenant's unreadable item (counted, skipped), never a re-plan's failure.
    wall = datetime.fromisoformat(text)
    if wall.tzinfo is not None or wall.microsecond or text != wall.isoformat():
        raise ValueError(f"{text!r} is not a local wall time such as 2026-12-02T09:00:00")
    return text


WallTime = Annotated[str, AfterValidator(_wall_time)]
"""A naive local wall time to the second, as ``datetime.isoformat`` writes it."""
