"""The matplotlib pieces the gallery pictures share: pyplot on the Agg backend, saving a figure to docs/images as a
small PNG, and the two kinds of accuracy axes (predicted vs reference, error per point)."""

from __future__ import annotations

from .docs_runner import IMAGES, shrink_png


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt, fig, name: str) -> None:
    """Lay out ``fig``, write it to docs/images/``name``, close it and shrink the PNG."""
    fig.tight_layout()
    png = IMAGES / name
    fig.savefig(png, bbox_inches="tight")
    plt.close(fig)
    shrink_png(png)


def identity_axes(ax, lim: tuple[float, float], band: float, xlabel: str, ylabel: str, title: str) -> None:
    """Log-log predicted vs reference: the diagonal, dotted lines at +-band, the legend top left."""
    lo, hi = lim
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (1 + band, 1 - band):
        ax.plot([lo, hi], [f * lo, f * hi], "k:", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=7, loc="upper left")


def error_axes(ax, xlabel: str, title: str) -> None:
    """Error per point in percent against a log x axis, with the +-10% band."""
    ax.axhspan(-10, 10, color="#55A868", alpha=0.1)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel=xlabel, ylabel="prediction error (%)", title=title)
