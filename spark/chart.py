"""The reconciliation chart (PNG): latency distribution per hop, and a timeline of anomalies.

Takes small, already aggregated data (quantile curves and counts per time bucket, computed in
Spark), so that it costs the same for ten lines or ten billion. matplotlib is optional (`pip install
oncemesh[chart]`): `available()` says whether it can be drawn.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

KIND_ORDER = {"end_to_end": 0, "publish": 1, "mesh": 2, "deliver": 3}

_COLOURS = {"lost": "#d62728", "duplicated": "#9467bd", "unexpected": "#8c564b",
            "false_accept": "#e377c2", "in_doubt": "#ff7f0e", "recovered": "#2ca02c",
            "ended_before_delivery": "#7f7f7f", "ok": "#1f77b4"}


@dataclass(frozen=True, slots=True)
class HopCurve:
    """One hop's latency distribution: (quantile, seconds) points, n samples."""

    kind: str
    hop: str
    n: int
    points: tuple[tuple[float, float], ...]


def bucket_for(span: float, buckets: int = 100) -> float:
    """A round bucket width (1, 2 or 5 x 10^k seconds) giving about `buckets` buckets over `span`."""
    target = max(span, 1e-3) / buckets
    k = math.floor(math.log10(target))
    for m in (1, 2, 5, 10):
        if m * 10.0 ** k >= target:
            return float(m * 10.0 ** k)
    return float(10.0 ** (k + 1))


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def preload() -> None:
    """Import matplotlib on a thread of its own, now: `oncemesh reconcile` calls this before it
    starts Spark's JVM, while Python has nothing else to do (the import takes ~1 s)."""
    import threading

    def load() -> None:
        if not available():
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401

    threading.Thread(target=load, name="oncemesh-chart-import", daemon=True).start()


def render(curves: Sequence[HopCurve], timeline: Mapping[str, Sequence[tuple[float, int]]],
           path: Path, title: str = "oncemesh reconciliation", bucket: float = 1.0) -> Path:
    """Draw the chart to `path` (PNG). `timeline`: class -> [(t, n)] anomalous pairs per time bucket
    of `bucket` seconds."""
    import matplotlib

    # (here, not at the top: schema loads pyspark, and bench and soak ask `available()` without it)
    from .schema import CLASSES

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
    fig.suptitle(title)
    drawn = 0
    for c in curves:
        pts = [(q, lat * 1000.0) for q, lat in c.points if lat is not None and lat > 0]
        if not pts:
            continue
        style = "-" if c.kind == "end_to_end" else ("--" if c.kind == "mesh" else "-.")
        ax1.plot([p[1] for p in pts], [p[0] for p in pts], style, label=f"{c.hop} (n={c.n})")
        drawn += 1
    ax1.set_xscale("log")
    ax1.set_xlabel("latency (ms, log scale)")
    ax1.set_ylabel("fraction of messages")
    ax1.set_title("latency distribution per hop")
    ax1.grid(True, which="both", alpha=0.3)
    if drawn:
        ax1.legend(fontsize=7, loc="lower right")
    else:
        ax1.text(0.5, 0.5, "no latency samples", ha="center", va="center", transform=ax1.transAxes)

    buckets = sorted({t for rows in timeline.values() for t, _ in rows})
    t0 = buckets[0] if buckets else 0.0
    width = min((b - a for a, b in zip(buckets, buckets[1:], strict=False)), default=bucket) or bucket
    bottom = dict.fromkeys(buckets, 0)
    any_anomaly = False
    for cls in CLASSES:
        rows = dict(timeline.get(cls, ()))
        if not rows:
            continue
        any_anomaly = True
        xs = [t for t in buckets if t in rows]
        ax2.bar([t - t0 for t in xs], [rows[t] for t in xs], width=width * 0.9, align="edge",
                bottom=[bottom[t] for t in xs], label=cls, color=_COLOURS.get(cls))
        for t in xs:
            bottom[t] += rows[t]
    ax2.set_xlabel("seconds since the first anomaly (by first send)")
    ax2.set_ylabel(f"anomalous pairs per {bucket:.3g} s")
    ax2.set_title("timeline of anomalies")
    ax2.grid(True, alpha=0.3)
    if any_anomaly:
        ax2.legend(fontsize=8)
    else:
        ax2.text(0.5, 0.5, "no anomalies", ha="center", va="center", transform=ax2.transAxes)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
