"""The fleet page's chart, drawn on the server as SVG: per queue and tenant, for the last minutes, calls per
second (ok / failed), the p50 and p99 duration, and the oldest waiting call's age. Pure functions of the
figures (worker/watch.py gathers them); no script is needed to draw it, fleet.js only fetches it again."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

from worker.watch import Series

PANEL_W, PANEL_H, GAP = 220, 90, 24
COLOURS = {"ok": "#2b8a3e", "failed": "#c92a2a", "p50": "#1c7ed6", "p99": "#862e9c", "age": "#e8590c"}


def figure(series: Series, start_s: float, end_s: float) -> Markup:
    """One series as a <figure>: a caption with the latest figures and three panels sharing the time axis."""
    now = series.now
    panels = [
        _panel(0, "calls/s", start_s, end_s, _lines(series, ("ok", "failed"))),
        _panel(1, "duration s (p50, p99)", start_s, end_s, _lines(series, ("p50", "p99"))),
        _panel(2, "oldest waiting s", start_s, end_s, {"age": series.ages}),
    ]
    width = 3 * PANEL_W + 2 * GAP
    data = " ".join(f'data-{key.replace("_", "-")}="{_number(value)}"' for key, value in now.items())
    caption = (
        f"{escape(series.queue)} · {escape(series.tenant)} — ok {_number(now['ok_per_s'])}/s, failed "
        f"{_number(now['failed_per_s'])}/s, p50 {_number(now['p50_s'])} s, p99 {_number(now['p99_s'])} s, "
        f"oldest waiting {_number(now['oldest_waiting_s'])} s"
    )
    return Markup(
        f'<figure class="series" data-queue="{escape(series.queue)}" data-tenant="{escape(series.tenant)}" {data}>'
        f"<figcaption>{caption}</figcaption>"
        f'<svg role="img" aria-label="{escape(series.queue)} {escape(series.tenant)}" width="{width}" '
        f'height="{PANEL_H + 30}" viewBox="0 0 {width} {PANEL_H + 30}">{"".join(panels)}</svg></figure>'
    )


def _lines(series: Series, names: Sequence[str]) -> dict[str, list[tuple[float, float]]]:
    fields = {"ok": "ok_per_s", "failed": "failed_per_s", "p50": "p50_s", "p99": "p99_s"}
    lines: dict[str, list[tuple[float, float]]] = {}
    for name in names:
        values = ((p.at_s, getattr(p, fields[name])) for p in series.points)
        lines[name] = [(at, value) for at, value in values if value is not None]
    return lines


def _panel(index: int, title: str, start_s: float, end_s: float, lines: dict[str, list[tuple[float, float]]]) -> str:
    """A panel: its frame, its title with the scale's top, and a polyline per line."""
    left = index * (PANEL_W + GAP)
    top = max([value for line in lines.values() for _, value in line] + [0.0])
    scale = _nice(top)
    span = max(end_s - start_s, 1.0)
    parts = [
        f'<g class="panel" transform="translate({left},16)">',
        f'<text x="0" y="-4" font-size="11" fill="#333">{escape(title)} (max {_number(scale)})</text>',
        f'<rect x="0" y="0" width="{PANEL_W}" height="{PANEL_H}" fill="#fafbfc" stroke="#ccd"/>',
    ]
    for name, line in lines.items():
        xy = " ".join(
            f"{(at - start_s) / span * PANEL_W:.1f},{PANEL_H - value / scale * PANEL_H:.1f}"
            for at, value in line
            if at >= start_s
        )
        parts.append(
            f'<polyline class="{name}" points="{xy}" fill="none" stroke="{COLOURS[name]}" stroke-width="1.5"/>'
        )
    parts.append("</g>")
    return "".join(parts)


def _nice(top: float) -> float:
    """The scale's top: 1, 2 or 5 times a power of ten, at least the highest value (1 when all are 0)."""
    if top <= 0:
        return 1.0
    step = 10 ** len(str(int(top))) / 100 if top >= 1 else 0.001
    while True:
        for factor in (1, 2, 5):
            if step * factor >= top:
                return step * factor
        step *= 10


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 1000 else str(round(value))


def legend() -> Markup:
    names = {"ok": "ok", "failed": "failed", "p50": "p50", "p99": "p99", "age": "oldest waiting"}
    items = (f'<span style="color:{COLOURS[key]}">━ {label}</span>' for key, label in names.items())
    return Markup('<p class="legend">' + " ".join(items) + "</p>")
