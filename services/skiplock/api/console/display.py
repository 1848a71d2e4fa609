"""How the console's pages show times, durations and event data: the Jinja filters and the
throughput charts' geometry. Pure functions of the API's answers; no request, no database.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from ..render import duration_text

# The overview's chart ranges: the window in minutes, and how many minutes one bar holds.
CHART_RANGES = {"hour": (60, 1), "day": (1440, 30)}
# keys of an event's data shown as code blocks, not as JSON strings with escaped newlines
CODE_KEYS = ("traceback", "error", "message")


def parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def absolute(text: str | None) -> str:
    """`2026-12-05 05:12:03 UTC`: the hover text of a relative time."""
    when = parse_time(text)
    return "" if when is None else when.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(text: str | None, now: dt.datetime | None = None) -> str:
    """`3 min ago`, `in 2 h 5 min`, `just now`: a time relative to now."""
    when = parse_time(text)
    if when is None:
        return "—"
    seconds = ((now or dt.datetime.now(dt.timezone.utc)) - when).total_seconds()
    if abs(seconds) < 1:
        return "just now"
    return f"{duration_text(seconds)} ago" if seconds > 0 else f"in {duration_text(-seconds)}"


def between(earlier: str | None, later: str | None) -> str:
    """The time from one event to the next: `+1.2 s`, `+53 min`."""
    start, end = parse_time(earlier), parse_time(later)
    if start is None or end is None:
        return ""
    seconds = (end - start).total_seconds()
    return f"+{seconds:.1f} s" if seconds < 60 else f"+{duration_text(seconds)}"


def event_fields(data: Any) -> list[tuple[str, Any, bool]]:
    """An event's data as (key, value, as_code) rows: a traceback or a multi-line message is a
    code block, the rest short JSON values."""
    if not isinstance(data, dict):
        return [] if data is None else [("data", data, isinstance(data, str) and "\n" in data)]
    return [(key, value, isinstance(value, str) and (key in CODE_KEYS or "\n" in value))
            for key, value in sorted(data.items())]


class Bar(NamedTuple):
    start: str          # ISO time of the bar's first minute
    label: str          # its hover text
    completed: int
    failed: int


class Chart(NamedTuple):
    """One queue's outcomes over a range, in bars, with the axes' ticks."""

    name: str
    completed: int
    failed: int
    bars: list[Bar]
    peak: int                       # the y axis's top: the busiest bar, rounded up
    y_ticks: list[int]
    x_ticks: list[tuple[int, str]]  # (bar index, HH:MM UTC)


def _nice_ceiling(value: int) -> int:
    """The y axis's top: 1, 2, 5 times a power of ten at or above `value`."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if value <= factor * step:
                return factor * step
        step *= 10


def throughput_charts(answer: dict, per_bar: int) -> list[Chart]:
    """GET /v1/queues/throughput's per-minute series, summed into bars of `per_bar` minutes."""
    charts = []
    for queue in answer["queues"]:
        minutes = queue["per_minute"]
        bars = []
        for first in range(0, len(minutes), per_bar):
            group = minutes[first:first + per_bar]
            completed, failed = sum(m["completed"] for m in group), sum(m["failed"] for m in group)
            start = parse_time(group[0]["minute"])
            end = start + dt.timedelta(minutes=len(group))
            span = f"{start:%H:%M}" if per_bar == 1 else f"{start:%H:%M}–{end:%H:%M}"
            bars.append(Bar(group[0]["minute"], f"{span} UTC: {completed} completed, {failed} failed",
                            completed, failed))
        peak = _nice_ceiling(max([b.completed + b.failed for b in bars] + [1]))
        y_ticks = [0, peak // 2, peak] if peak % 2 == 0 else [0, peak]
        every = max(1, len(bars) // 6)  # about six time labels, at round times
        x_ticks = [(i, f"{parse_time(b.start):%H:%M}") for i, b in enumerate(bars) if i % every == 0]
        charts.append(Chart(queue["name"], queue["completed"], queue["failed"], bars, peak, y_ticks, x_ticks))
    return charts


def workers_per_queue(workers: list[dict]) -> dict[str, dict[str, int]]:
    """Live workers and their slots per queue they claim from (a worker of several counts in each)."""
    served: dict[str, dict[str, int]] = {}
    for worker in workers:
        for queue in worker["queues"]:
            entry = served.setdefault(queue, {"workers": 0, "slots": 0})
            entry["workers"] += 1
            entry["slots"] += worker["concurrency"]
    return served


def state_counts(queues: list[dict], states: tuple[str, ...], queue: str | None = None) -> dict[str, int]:
    """Tasks per state, of one queue or of all (GET /v1/queues' answer): the state tabs' counts."""
    return {state: sum(q["tasks"][state] for q in queues if queue in (None, q["name"])) for state in states}
