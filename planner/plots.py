"""Plots of a forecast (matplotlib, the optional `plot` extra): time to train and cost against GPU
count, one line per cluster and batch, the points on the time-cost front highlighted."""

from __future__ import annotations

import io

from planner.errors import SpecError

FORMATS = ("png", "svg")


def plot_format(path: str) -> str:
    """The format a --plot file asks for ('png' or 'svg'), once matplotlib is known to be
    there: SpecError naming the suffix or the missing extra, before any work is done."""
    suffix = str(path).rsplit(".", 1)[-1].lower() if "." in str(path) else ""
    if suffix not in FORMATS:
        raise SpecError(f"--plot {path}: expected a .png or .svg file")
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
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format=fmt, dpi=110, metadata={"Software": None} if fmt == "png" else {"Date": None})
    plt.close(fig)
    return out.getvalue()
