"""The repair figure: bias removed against the retrieval change, one point per fit with its intervals."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from posfair.repair.heldout import effect_words
from posfair.report.plots import finish, new_figure, save_figure

__all__ = ["repair_tradeoff"]


def repair_tradeoff(results: Sequence, path_stem: str | Path, *, title: str = "") -> bytes:
    """One point per fit (:class:`~posfair.repair.fitting.FitResult`): x = the share of stock's |β_p| removed at
    the last position (its 95 % interval as the horizontal bar), y = the change of the share of own segments nearer
    than every foreign one (points, its 95 % interval as the vertical bar); the goal's corner shaded.  A point whose
    β_p flipped sign is a cross labelled "β_p reversed", described in the legend by
    :func:`~posfair.repair.heldout.effect_words` (its x is then 1 - what is left the other way, not bias removed).
    Writes ``<stem>.png`` / ``.pdf`` and returns the PNG bytes."""
    fig = new_figure((6.4, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    limits = results[0].limits if results else None
    if limits is not None:
        ax.axvspan(100 * limits.min_removed, 100 * max(1.0, limits.min_removed), color="0.92", zorder=0)
        ax.axhline(-limits.max_recall_drop, color="0.5", lw=0.8, ls="--", zorder=1)
    ax.axhline(0.0, color="0.7", lw=0.6, zorder=1)
    for r in results:
        e = r.heldout.positions[-1]
        c = r.heldout.retrieval_change("own above every foreign")
        x, y = 100 * e.removed, c.change
        label = f"{r.method} ({r.model})"
        if e.flipped:  # not bias removed: bias the other way, said as such (the words every report uses)
            label += f"\nβ{e.position} " + effect_words(e).replace("; ", ";\n")
        ax.errorbar(
            [x], [y], xerr=[[x - 100 * e.removed_low], [100 * e.removed_high - x]],
            yerr=[[y - c.change_low], [c.change_high - y]], capsize=3, label=label, linestyle="none",
            marker="X" if e.flipped else "o", markersize=9 if e.flipped else 6,
        )  # fmt: skip
        if e.flipped:
            ax.annotate(f"β{e.position} reversed", (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    ax.set_xlabel(f"stock |β{results[0].heldout.positions[-1].position}| removed (%)" if results else "removed (%)")
    ax.set_ylabel("Δ own segment above every foreign (points)")
    handles, labels = ax.get_legend_handles_labels()
    family = results[0].heldout.family if results else ""
    finish(
        fig,
        title=title or "Bias removed against retrieval kept, on a held-out family",
        subtitle=f"held-out family {family}; bars: 95 % paired bootstrap intervals over segment sets",
        note="shaded: the share the checks ask to remove; dashed: the retrieval limit"
        + (
            "; cross: β reversed (its sign flipped: x is 1 - |β| / |stock's β|, bias the other way, not removed)"
            if any(r.heldout.positions[-1].flipped for r in results)
            else ""
        ),
        handles=handles,
        labels=labels,
    )
    return save_figure(fig, path_stem)
