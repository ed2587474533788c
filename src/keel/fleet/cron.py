"""Cron expressions for recurring fleet runs: parsing and the next firing time.

Five fields, `minute hour day-of-month month day-of-week`, as cron(5) reads them: `*`, numbers,
lists (`1,15`), ranges (`1-5`), steps (`*/10`, `0-30/5`, `5/15` = from 5 to the end), names for
months (`jan`…`dec`) and days (`sun`…`sat`; 0 and 7 are both Sunday), and the macros `@hourly`,
`@daily` (`@midnight`), `@weekly`, `@monthly`, `@yearly` (`@annually`). When both day fields are
restricted (neither starts with `*`), a day matching either fires (`0 0 1 * mon`: the 1st, and
every Monday). Times are wall-clock times in a zone (UTC unless given); a wall time that a daylight
saving change skips fires an hour later, one it repeats fires once. Pure: no I/O, no NATS.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo

from keel.errors import UserError

HINT = (
    "five fields: minute hour day-of-month month day-of-week, e.g. '0 3 * * mon-fri', "
    "'*/15 * * * *', or @hourly, @daily, @weekly, @monthly, @yearly"
)

MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")

#: (name, lowest, highest, names for lowest, lowest+1, …)
_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day-of-month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)

#: How far ahead a next firing is looked for: a 29 February on a given weekday (or-rule aside)
#: can be 28 years away; an expression with none in that span never fires (`0 0 30 2 *`).
_HORIZON = timedelta(days=366 * 29)


def _bad(index: int, text: str, why: str) -> UserError:
    name = _FIELDS[index][0]
    return UserError(f"cron field {index + 1} ({name}) {text!r}: {why}", hint=HINT)


def _number(index: int, text: str, word: str) -> int:
    _name, low, high, names = _FIELDS[index]
    lowered = word.lower()
    if names and lowered in names:
        return low + names.index(lowered)
    if not word.isdigit():
        what = f"a number {low}-{high}" + (f" or a name ({names[0]}…)" if names else "")
        raise _bad(index, text, f"{word!r} is not {what}")
    value = int(word)
    if not low <= value <= high:
        raise _bad(index, text, f"{value} is outside {low}-{high}")
    return value


def _field(index: int, text: str) -> frozenset[int]:
    _name, low, high, _names = _FIELDS[index]
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise _bad(index, text, "an empty list item")
        span, _, step_text = item.partition("/")
        step = 1
        if step_text or item.endswith("/"):
            if not step_text.isdigit() or int(step_text) == 0:
                raise _bad(index, text, f"step {step_text!r} is not a whole number above 0")
            step = int(step_text)
        if span == "*":
            first, last = low, high
        elif "-" in span:
            a, _, b = span.partition("-")
            first, last = _number(index, text, a), _number(index, text, b)
            if first > last:
                raise _bad(index, text, f"range {span!r} runs backwards")
        else:
            first = _number(index, text, span)
            last = high if step_text else first
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression; `text` as given."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    #: 0 = Sunday … 6 = Saturday (7 is folded into 0).
    weekdays: frozenset[int]
    #: Whether each day field was `*` (possibly with a step): cron's rule for the two.
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        stripped = text.strip()
        expanded = MACROS.get(stripped.lower(), stripped)
        if expanded.startswith("@"):
            raise UserError(f"unknown cron macro {stripped!r}", hint=HINT)
        parts = expanded.split()
        if len(parts) != 5:
            raise UserError(
                f"cron expression {stripped!r} has {len(parts)} field(s), not 5", hint=HINT
            )
        sets = [_field(i, part) for i, part in enumerate(parts)]
        weekdays = frozenset(d % 7 for d in sets[4])
        return cls(
            stripped,
            sets[0],
            sets[1],
            sets[2],
            sets[3],
            weekdays,
            any_day=parts[2].startswith("*"),
            any_weekday=parts[4].startswith("*"),
        )

    def day_matches(self, day: date) -> bool:
        in_month = day.day in self.days
        in_week = day.isoweekday() % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    def next_after(self, after: datetime, tz: tzinfo = UTC) -> datetime:
        """The first firing strictly after `after` (an aware time), in UTC."""
        t = after.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
        t += timedelta(minutes=1)
        limit = t + _HORIZON
        while t < limit:
            if t.month not in self.months:
                t = datetime(t.year + t.month // 12, t.month % 12 + 1, 1)
            elif not self.day_matches(t.date()):
                t = datetime(t.year, t.month, t.day) + timedelta(days=1)
            elif t.hour not in self.hours:
                t = t.replace(minute=0) + timedelta(hours=1)
            elif t.minute not in self.minutes:
                t += timedelta(minutes=1)
            else:
                # fold=0: a repeated wall time fires at its first pass; a skipped one maps to
                # the offset before the change (an hour later), after which the real times go on.
                when = t.replace(tzinfo=tz).astimezone(UTC)
                if when > after:
                    return when
                t += timedelta(minutes=1)
        raise UserError(f"cron expression {self.text!r} never fires", hint=HINT)

    def latest(self, first: datetime, now: datetime, tz: tzinfo = UTC) -> datetime:
        """The last firing in [`first`, `now`], where `first` is a firing time (<= `now`).
        Looks back from `now` in widening windows, so a schedule that missed a year of
        minutely firings costs a few steps, not half a million."""
        for back in (
            timedelta(minutes=1),
            timedelta(hours=1),
            timedelta(days=1),
            timedelta(days=32),
            timedelta(days=367),
        ):
            start = max(first, now - back)
            fire = first if start == first else self.next_after(start - timedelta(minutes=1), tz)
            if fire <= now:
                while (following := self.next_after(fire, tz)) <= now:
                    fire = following
                return fire
        fire = first
        while (following := self.next_after(fire, tz)) <= now:
            fire = following
        return fire
