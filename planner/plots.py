"""Plots of a forecast (matplotlib, the optional `plot` extra): time to train and cost against GPU
count, one line per cluster and batch, the points on the time-cost front highlighted."""

from __future__ import annotations

import io
from pathlib import Path

from planner.errors import SpecError

FORMATS = ("png", "svg")


def plot_format(path: str) -> str:
    """The format a --plot file asks for ('png' or 'svg'), once matplotlib is known to be
    there and the file's folder exists: SpecError naming the suffix, the missing extra or the
    folder (as plan.write_atomic words it), before any work is done."""
    suffix = str(path).rsplit(".", 1)[-1].lower() if "." in str(path) else ""
    if suffix not in FORMATS:
        raise SpecError(f"--plot {path}: expected a .png or .svg file")
    if not Path(path).resolve().parent.is_dir():
        raise SpecError(f"{path}: cannot write (no such folder)")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SpecError("--plot needs matplotlib: pip install 'llm-parallel-planner[plot]'") from None
    return suffix


def forecast_figure(doc: dict, fmt: str) -> bytes:
    """The figure of a planner.forecast/v1 document as `fmt` bytes (a format plot_format gave)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if "days" in r]
    money = bool(rows) and all("cost" in r for r in rows)
    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict = {}
    for r in rows:
        series.setdefault((r["cluster"], r["global_batch"]), []).append(r)
    for (cluster, batch), pts in series.items():
        pts.sort(key=lambda r: r["gpus"])
        label = cluster if len({b for _, b in series}) == 1 else f"{cluster}, batch {batch}"
        gpus = [r["gpus"] for r in pts]
        line, = ax_t.plot(gpus, [r["days"] for r in pts], marker="o", ms=3, label=label)
        ax_c.plot(gpus, [r["cost"] if money else r["gpu_hours"] for r in pts], marker="o", ms=3,
                  color=line.get_color(), label=label)
        front = [r for r in pts if r.get("front")]
        ax_t.scatter([r["gpus"] for r in front], [r["days"] for r in front], s=60, facecolors="none",
                     edgecolors="black", zorder=3)
        ax_c.scatter([r["gpus"] for r in front], [r["cost"] if money else r["gpu_hours"] for r in front], s=60,
                     facecolors="none", edgecolors="black", zorder=3)
    for ax, what in ((ax_t, "days to train"), (ax_c, "cost" if money else "GPU-hours")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.suptitle(f"{doc['inputs']['model']}: time and {'cost' if money else 'GPU-hours'} to train "
                 "(circled: the time-cost front)", fontsize=10)
    return _bytes(fig, fmt)


def validation_figure(doc: dict, fmt: str) -> bytes:
    """The figure of a planner.validate/v1 document as `fmt` bytes: predicted against published
    step times (calibration rows filled, checks hollow, by GPU; the diagonal and the
    validate.CHECK_LIMIT a check may miss by), each check's signed error inside its band (the
    band built without the row's own source; outside it in red), and where rows publish a peak,
    the predicted peak's error against the window validate.memory_ok keeps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from planner.validate import CHECK_LIMIT, MEMORY_UNDER, MEMORY_WITHIN, memory_ok

    checks = doc.get("checks", {}).get("runs", [])
    memory = [r for r in checks + doc["runs"] if "memory_error" in r]
    panels = 1 + bool(checks) + bool(memory)
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.6), squeeze=False)
    ax_t, rest = axes[0][0], list(axes[0][1:])

    gpus = sorted({r.get("gpu", "") for r in doc["runs"] + checks})
    colour = {g: plt.cm.tab10(i % 10) for i, g in enumerate(gpus)}
    for rows, filled, label in ((doc["runs"], True, "calibration"), (checks, False, "check")):
        for g in gpus:
            pts = [r for r in rows if r.get("gpu", "") == g]
            if pts:
                ax_t.scatter([r["derived_step_time_s"] for r in pts], [r["predicted_step_time_s"] for r in pts], s=22,
                             color=colour[g] if filled else "none", edgecolors=colour[g], linewidths=1.1,
                             label=f"{g} ({label})")
    every = [v for r in doc["runs"] + checks for v in (r["derived_step_time_s"], r["predicted_step_time_s"])]
    lo, hi = min(every) / 1.5, max(every) * 1.5
    for factor, style in ((1.0, "-"), (1 + CHECK_LIMIT, "--"), (1 - CHECK_LIMIT, "--")):
        ax_t.plot([lo, hi], [lo * factor, hi * factor], style, color="grey", lw=0.8)
    ax_t.set_xscale("log")
    ax_t.set_yscale("log")
    ax_t.set_xlim(lo, hi)
    ax_t.set_ylim(lo, hi)
    ax_t.set_xlabel("published step time (s)")
    ax_t.set_ylabel("predicted step time (s)")
    ax_t.set_title(f"calibration {doc['mape']:.1%} (bias {doc['bias']:+.1%})"
                   + (f", checks {doc['checks']['mape']:.1%} ({doc['checks']['bias']:+.1%})" if checks else ""),
                   fontsize=9)
    ax_t.legend(fontsize=6, ncol=2, loc="lower right")
    ax_t.grid(True, which="both", alpha=0.3)

    if checks:
        ax_e = rest.pop(0)
        ordered = sorted(checks, key=lambda r: r["error"])
        xs = range(len(ordered))
        for x, r in zip(xs, ordered):
            b = r.get("band")
            if b:
                ax_e.plot([x, x], [100 * b["low"], 100 * b["high"]], color="lightgrey", lw=2.2, zorder=1)
        inside = [not r.get("band") or r["band"]["low"] <= r["error"] <= r["band"]["high"] for r in ordered]
        ax_e.scatter(list(xs), [100 * r["error"] for r in ordered], s=12, zorder=2,
                     color=["black" if ok else "red" for ok in inside])
        for y in (-100 * CHECK_LIMIT, 0, 100 * CHECK_LIMIT):
            ax_e.axhline(y, color="grey", lw=0.8, ls="-" if y == 0 else "--")
        ax_e.set_xlabel("check rows, by signed error")
        ax_e.set_ylabel("predicted / published - 1 (%)")
        ax_e.set_title(f"checks: {doc['checks']['inside_band']:.0%} inside their band (grey), "
                       f"{doc['checks']['over_25_percent']} over {CHECK_LIMIT:.0%}", fontsize=9)
        ax_e.grid(True, axis="y", alpha=0.3)

    if memory:
        ax_m = rest.pop(0)
        ordered = sorted(memory, key=lambda r: r["memory_error"])
        ax_m.axvspan(-100 * MEMORY_UNDER, 100 * MEMORY_WITHIN, color="lightgrey", alpha=0.6)
        ax_m.barh(range(len(ordered)), [100 * r["memory_error"] for r in ordered], height=0.6,
                  color=["black" if memory_ok(r["memory_error"]) else "red" for r in ordered])
        ax_m.axvline(0, color="grey", lw=0.8)
        ax_m.set_yticks(range(len(ordered)))
        ax_m.set_yticklabels([r["id"] for r in ordered], fontsize=6)
        ax_m.set_xlabel("predicted / published peak - 1 (%)")
        ax_m.set_title(f"memory: peaks should land in -{MEMORY_UNDER:.0%} ... +{MEMORY_WITHIN:.0%} (grey)", fontsize=9)
        ax_m.grid(True, axis="x", alpha=0.3)

    return _bytes(fig, fmt)


def _bytes(fig, fmt: str) -> bytes:
    """A finished figure as `fmt` bytes (no timestamp or software stamp, so a figure of the same
    document is the same file), the figure closed."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format=fmt, dpi=110, metadata={"Software": None} if fmt == "png" else {"Date": None})
    plt.close(fig)
    return out.getvalue()
