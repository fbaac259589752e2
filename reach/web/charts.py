"""Line charts as inline SVG, drawn on the server: no script library, nothing fetched."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

COLORS = ("#2563eb", "#16a34a", "#dc2626", "#9333ea")


def _nice_max(v: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above ``v`` (an axis top)."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    k = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 5, 10):
        if v <= m * k:
            return float(m * k)
    return float(10 * k)  # pragma: no cover - the loop always returns


def fmt(v: float) -> str:
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2f}".rstrip("0").rstrip(".") or "0"


def line_chart(
    title: str,
    ts_ms: Sequence[int],
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    unit: str = "",
    window_s: float = 600.0,
    width: int = 400,
    height: int = 150,
) -> str:
    """An SVG chart of ``series`` (name, one value per time of ``ts_ms``, None: a gap)
    over the last ``window_s`` seconds up to the newest time."""
    left, right, top, bottom = 44, 8, 22, 20
    w, h = width - left - right, height - top - bottom
    t = html.escape
    out = [
        (
            f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label="{t(title)}">'
        ),
        f'<text x="{left}" y="14" class="chart-title">{t(title)}</text>',
    ]
    values = [v for _, vs in series for v in vs if v is not None and math.isfinite(v)]
    top_v = _nice_max(max(values, default=0.0))
    end = ts_ms[-1] if ts_ms else 0
    start = end - window_s * 1000

    def x(ts: int) -> float:
        return left + max(0.0, (ts - start) / (window_s * 1000)) * w

    def y(v: float) -> float:
        return top + h - min(v, top_v) / top_v * h

    for frac in (0.0, 0.5, 1.0):
        yy = top + h - frac * h
        out.append(
            f'<line x1="{left}" y1="{yy:.1f}" x2="{left + w}" y2="{yy:.1f}" class="grid"/>'
            f'<text x="{left - 4}" y="{yy + 4:.1f}" class="axis" text-anchor="end">'
            f"{t(fmt(top_v * frac))}</text>"
        )
    out.append(
        f'<text x="{left}" y="{height - 4}" class="axis">-{window_s / 60:g} min</text>'
        f'<text x="{left + w}" y="{height - 4}" class="axis" text-anchor="end">now</text>'
    )
    legend_x = left + w
    for i, (name, vs) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        runs: list[list[str]] = [[]]
        for ts, v in zip(ts_ms, vs, strict=False):
            if v is None or not math.isfinite(v) or ts < start:
                runs.append([])
                continue
            runs[-1].append(f"{x(ts):.1f},{y(v):.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="1.5" fill="{color}"/>')
            elif run:
                out.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                    f'points="{" ".join(run)}"/>'
                )
        last = next((v for v in reversed(vs) if v is not None and math.isfinite(v)), None)
        label = f"{name} {fmt(last)}{unit}" if last is not None else f"{name} -"
        out.append(
            f'<text x="{legend_x}" y="14" class="legend" fill="{color}" '
            f'text-anchor="end">{t(label)}</text>'
        )
        legend_x -= 8 + 7 * len(label)
    out.append("</svg>")
    return "".join(out)
