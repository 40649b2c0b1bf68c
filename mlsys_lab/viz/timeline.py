"""Schedule timeline (Gantt chart): one row per device/worker, one bar per executed node."""

import zlib


def plot_timeline(timeline, ax=None, title=None):
    """Draw ``timeline`` (records with node, device, worker, start, end in seconds) and return
    the matplotlib Figure."""
    import matplotlib.pyplot as plt

    events = list(timeline)
    lanes = sorted({(e.device, e.worker) for e in events})
    row_of = {lane: i for i, lane in enumerate(lanes)}
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 0.6 + 0.5 * max(len(lanes), 1)))
    else:
        fig = ax.figure
    t0 = min((e.start for e in events), default=0.0)
    cmap = plt.get_cmap("tab10")
    for e in events:
        row = row_of[(e.device, e.worker)]
        ax.barh(row, (e.end - e.start) * 1e3, left=(e.start - t0) * 1e3, height=0.6,
                color=cmap(zlib.crc32(e.node.split("=")[-1].encode()) % 10), edgecolor="black")
        ax.text((e.start - t0 + (e.end - e.start) / 2) * 1e3, row, e.node, ha="center",
                va="center", fontsize=7)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{d}/{w}" for d, w in lanes])
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "schedule timeline")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig
