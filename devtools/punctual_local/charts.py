"""The console's charts, as inline SVG: a schedule's next fires, the last hour's occurrences
on a timeline, and the lag histograms with their percentiles."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from punctual_local.lives import KINDS, LATE_SECONDS, Life, epoch, esc, utc_offset, waited_too_long
from punctual_local.stats import percentile

_W, _LEFT, _RIGHT = 940, 170, 50


def _x(instant: float, start: float, end: float) -> float:
    span = max(end - start, 1)
    return _LEFT + (instant - start) / span * (_W - _LEFT - _RIGHT)


def _axis(start: int, end: int, y: int, ticks: int = 6) -> str:
    parts = [f"<line x1={_LEFT} y1={y} x2={_W - _RIGHT} y2={y} class=axis />"]
    for i in range(ticks + 1):
        instant = start + (end - start) * i // ticks
        x = _x(instant, start, end)
        shape = "%m-%d %H:%M" if end - start > 86400 else "%H:%M:%S"
        label = datetime.fromtimestamp(instant, UTC).strftime(shape)
        parts.append(f"<line x1={x:.1f} y1={y} x2={x:.1f} y2={y + 4} class=axis />")
        parts.append(f"<text x={x:.1f} y={y + 16} class=tick>{label}</text>")
    return "".join(parts)


def fires_svg(fires: list[dict[str, Any]]) -> str:
    instants = [epoch(f["utc"]) or 0 for f in fires]
    start, end = instants[0], max(instants[-1], instants[0] + 60)
    marks: list[str] = []
    previous = None
    for fire, instant in zip(fires, instants, strict=True):
        x = _x(instant, start, end)
        offset = utc_offset(fire["local"])
        changed = previous is not None and offset != previous
        previous = offset
        local = fire["local"].replace("T", " ")
        label = esc(local[5:16] if end - start > 86400 else local[11:19])
        label += " DST" if changed else ""
        marks.append(
            f"<circle cx={x:.1f} cy=30 r=5 class='{'dst' if changed else 'fire'}'>"
            f"<title>{esc(fire['local'])} ({esc(fire['utc'])})</title></circle>"
            f"<text x={x:.1f} y={18 if len(marks) % 2 else 52} class=tick>{label}</text>"
        )
    return (
        f"<svg width={_W} height=90 role=img aria-label='next fires'>"
        f"<text x=0 y=34>next {len(fires)} fires (UTC axis)</text>"
        + "".join(marks)
        + _axis(start, end, 66)
        + "</svg>"
    )


# Past this many occurrences the timeline draws each as one mark at its scheduled time,
# colored by its state (late ones apart), without the spans: 10,000 occurrences stay a
# page the browser draws at once (about 80 bytes each instead of 400).
DENSE = 600


def timeline_svg(lives: list[Life], start: int, end: int) -> str:
    """One row per schedule: each occurrence's scheduled time (circle), when it became
    receivable (square) and when a worker claimed it (triangle), joined by a line."""
    names = sorted({life.schedule_name for life in lives})
    dense = len(lives) > DENSE
    pitch = 12 if dense and len(names) > 30 else 24
    row = {name: 30 + pitch * index for index, name in enumerate(names)}
    height = 40 + pitch * len(names)
    parts = [f"<svg width={_W} height={height + 30} role=img aria-label='occurrences timeline'>"]
    counts = Counter(life.schedule_name for life in lives)
    for name, y in row.items():
        label = f"<title>{esc(name)}: {counts[name]} occurrences</title>"
        parts.append(f"<text x=0 y={y + 4}>{esc(name[:22])}{label}</text>")
        parts.append(f"<line x1={_LEFT} y1={y} x2={_W - _RIGHT} y2={y} class=row />")
    for life in lives:
        y = row[life.schedule_name]
        state = life.occurrence["state"].lower()
        if dense:
            late = " late" if waited_too_long(life, end) else ""
            x = _x(life.scheduled, start, end)
            parts.append(
                f"<rect x={x - 1:.1f} y={y - 4} width=3 height=8 class='m {state}{late}' />"
            )
            continue
        points = [life.scheduled, life.receivable, life.claimed_at]
        known = [p for p in points if p is not None]
        x0, x1 = _x(min(known), start, end), _x(max(known), start, end)
        title = f"<title>{esc(life.occurrence['occurrence_id'])}: {esc(state)}</title>"
        parts.append(f"<line x1={x0:.1f} y1={y} x2={x1:.1f} y2={y} class='span {state}' />")
        x = _x(life.scheduled, start, end)
        parts.append(f"<circle cx={x:.1f} cy={y} r=4 class=scheduled>{title}</circle>")
        if life.receivable is not None:
            x = _x(life.receivable, start, end)
            parts.append(
                f"<rect x={x - 3:.1f} y={y - 3} width=6 height=6 class=receivable>{title}</rect>"
            )
        if life.claimed_at is not None:
            x = _x(life.claimed_at, start, end)
            parts.append(
                f"<polygon points='{x:.1f},{y - 5} {x - 4:.1f},{y + 3} {x + 4:.1f},{y + 3}' "
                f"class='claimed {state}'>{title}</polygon>"
            )
    parts.append(_axis(start, end, height))
    parts.append("</svg>")
    if dense:
        legend = (
            "<p class=legend>One mark per occurrence at its scheduled time: "
            "<span class=l-succeeded>▮</span> succeeded <span class=l-open>▮</span> open "
            "<span class=l-dead>▮</span> dead, missed or canceled "
            f"<span class=l-late>▮</span> waited over {LATE_SECONDS} s for a worker</p>"
        )
    else:
        legend = (
            "<p class=legend><span class=l-scheduled>●</span> scheduled "
            "<span class=l-receivable>■</span> receivable <span class=l-claimed>▲</span> "
            "claimed by a worker</p>"
        )
    return "".join(parts) + legend


_LABEL_Y = {50: 16, 95: 30, 99: 44}  # the percentiles' labels, apart when their lines meet


def histogram_svg(values: list[tuple[float, str]], label: str, axis: str) -> str:
    """Seconds as bars of whole seconds, each bar's occurrences stacked by group (KINDS)
    with its count above it, and the p50/p95/p99 of them all."""
    seconds = [v for v, _ in values]
    top = max(int(max(seconds)), 9)  # at least ten bins
    width = max(1, -(-(top + 1) // 30))  # at most 30 bins of whole seconds
    bins: list[Counter[str]] = [Counter() for _ in range(top // width + 1)]
    for value, kind in values:
        bins[int(max(0, value)) // width][kind] += 1
    height, tallest = 180, max(sum(b.values()) for b in bins)
    bar = (_W - _LEFT - _RIGHT) / len(bins)
    parts = [f"<svg width={_W} height={height + 80} role=img aria-label='{esc(label)}'>"]
    for index, counted in enumerate(bins):
        x = _LEFT + index * bar
        base = height + 10.0
        for kind, _ in KINDS:
            count = counted[kind]
            if not count:
                continue
            h = count / tallest * (height - 60)  # (the percentiles' labels above)
            base -= h
            parts.append(
                f"<rect x={x:.1f} y={base:.1f} width={bar - 2:.1f} height={h:.1f} "
                f"class='bar {kind}'><title>{index * width} to {(index + 1) * width} s, "
                f"{kind}: {count}</title></rect>"
            )
        total = sum(counted.values())
        if total:
            parts.append(
                f"<text x={x + bar / 2 - 1:.1f} y={base - 3:.1f} class='tick count'>{total}</text>"
            )
        parts.append(f"<text x={x:.1f} y={height + 26} class=tick>{index * width}</text>")
    for p in (50, 95, 99):
        value = percentile(seconds, p)
        x = _LEFT + value / width * bar
        parts.append(
            f"<line x1={x:.1f} y1=4 x2={x:.1f} y2={height + 10} class='p p{p}' />"
            f"<text x={x + 3:.1f} y={_LABEL_Y[p]} class='plabel'>p{p} {value:g} s</text>"
        )
    legend = "".join(
        f"<rect x={_LEFT + 240 * i} y={height + 56} width=10 height=10 class='bar {kind}' />"
        f"<text x={_LEFT + 240 * i + 14} y={height + 65}>{esc(name)}: "
        f"{sum(b[kind] for b in bins)}</text>"
        for i, (kind, name) in enumerate(KINDS)
    )
    parts.append(f"<text x=0 y={height // 2}>occurrences</text>")
    parts.append(f"<text x={_LEFT} y={height + 44}>{esc(axis)}</text>{legend}</svg>")
    return "".join(parts)
