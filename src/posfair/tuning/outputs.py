"""Writing a tuning run: trial and Pareto tables, the test-split table, the trade-off figure, the tuned model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from posfair.calibration import STOCK
from posfair.calibration.choice import Resolved
from posfair.calibration.coverage import NOOP_LABEL, SHARE_NAME, format_share
from posfair.files.atomic import atomic_write_text
from posfair.model import FairModel
from posfair.report.plots import display_labels, front_lines, relabel, save_figure, tradeoff_scatter
from posfair.report.tables import Table, to_markdown, write_table
from posfair.tuning.objectives import DEV, TEST, format_effect
from posfair.tuning.tune_result import TuneResult

__all__ = [
    "skipped_note",
    "trials_table",
    "front_table",
    "test_table",
    "tradeoff_figure",
    "fronts_figure",
    "variants_table",
    "write_outputs",
    "save_tuned_model",
    "summary_markdown",
    "summary_text",
    "verdict_lines",
]

_NAMES = {
    "spread": "σ spread",
    "slope": "σ slope / position",
    "max_abs_beta": "max |β|",
    "recall": "recall@n",
    "margin": "margin",
    "other_cos": "other-set cos",
    "drift": "drift",
    "harm": "Harm",
    "psi": "PSI",
    "ndcg@10": "nDCG@10",
}
#: the values a guard metric can take: its figures' axis labels none beyond them
_BOUNDS = {"recall": (0.0, 1.0), "ndcg@10": (0.0, 1.0)}


def _columns(result: TuneResult, frame: pd.DataFrame) -> list[str]:
    first = [result.score, result.guard]
    extra = [c for c in result.objective.get("columns", []) if c not in first]
    return [c for c in first + extra if c in frame.columns]


def _cells(frame: pd.DataFrame, result: TuneResult, flags: bool) -> Table:
    cols = _columns(result, frame)
    out = pd.DataFrame(
        {"setting": frame["label"], "phase": frame["phase"], "strength": [f"{s:g}" for s in frame["strength"]]}
    )
    if "calibrated_share" in frame.columns:
        out[SHARE_NAME] = [format_share(v) for v in frame["calibrated_share"]]
    for c in cols:
        out[_NAMES.get(c, c)] = [f"{v:.3f}" for v in frame[c]]
    guard = _NAMES.get(result.guard, result.guard)
    if "guard_low" in frame.columns and frame["guard_low"].notna().any():
        out[f"Δ {guard} [95 %]"] = [
            "—" if pd.isna(lo) else f"{ch:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            for ch, lo, hi in zip(frame["guard_change"], frame["guard_low"], frame["guard_high"], strict=True)
        ]
    if "effect_low" in frame.columns and frame["effect_low"].notna().any():
        fmt = lambda v: format_effect(result.effect, v)  # noqa: E731
        out[f"{result.effect} [95 %]"] = [
            "—" if pd.isna(lo) else f"{fmt(r)} [{fmt(lo)}, {fmt(hi)}]"
            for r, lo, hi in zip(frame["effect"], frame["effect_low"], frame["effect_high"], strict=True)
        ]
    if "slope_low" in frame.columns and frame["slope_low"].notna().any():
        out["σ slope [95 %]"] = [
            "—" if pd.isna(lo) else f"{sl:+.4f} [{lo:+.4f}, {hi:+.4f}] {d}"
            for sl, lo, hi, d in zip(
                frame["slope"], frame["slope_low"], frame["slope_high"], frame["direction"], strict=True
            )
        ]
    if "constraint_on_interval" in frame.columns:
        out["on interval"] = ["—" if pd.isna(v) else v for v in frame["constraint_on_interval"]]
    if flags:
        out["feasible"] = ["yes" if f else "no" for f in frame["feasible"]]
        out["Pareto"] = ["yes" if f else "" for f in frame["on_front"]]
    out["chosen"] = ["◀" if c else "" for c in frame["chosen"]]
    return Table("", out.reset_index(drop=True))


#: how the tables' intervals are made and read (one sentence, in every caption that shows them)
INTERVALS_NOTE = (
    "Δ: the guard's change from stock with its 95 % paired bootstrap interval over the split's units; removed: the "
    "share of stock's score the setting removes (Δharm: Harm's change, points), with its interval; on interval: the constraint judged on the "
    "interval (holds = the whole interval above the limit, broken = below it, unresolved = the split cannot tell); "
    "σ slope: the calibrated profile's slope on position with its interval, and its direction on that interval "
    "(as stock / unresolved = the interval includes 0 / reversed = the whole interval on the other side of 0 from "
    "stock's); "
    "feasible: the search's rule, on the point estimate."
)


def _constraint(result: TuneResult) -> str:
    return f"{_NAMES.get(result.guard, result.guard)} at most {100 * result.max_drop:g} points below stock on the dev split"


def skipped_note(result: TuneResult) -> str:
    """One sentence on the grid points skipped because they calibrate nothing ("" if none)."""
    if not result.skipped:
        return ""
    n_grid = len(result.skipped) + sum(1 for t in result.dev_trials() if t.phase == "coarse")
    labels = ", ".join(t.label for t in result.skipped)
    return (
        f"Skipped {len(result.skipped)} of {n_grid} grid points ({NOOP_LABEL}: every document of the dev split is shorter "
        f"than one basket or exactly one basket, so they would equal stock): {labels}."
    )


def trials_table(result: TuneResult) -> Table:
    """Every dev trial (grid points that calibrate nothing were skipped and are named in the caption)."""
    t = _cells(result.frame(DEV), result, flags=True)
    direction = "higher" if result.objective["greater_is_better"] else "lower"
    caption = (
        f"Score: {_NAMES.get(result.score, result.score)} ({direction} is better); constraint: {_constraint(result)}. "
        f"{SHARE_NAME}: fraction of the split's documents the calibration changes (— for stock). " + INTERVALS_NOTE
    )
    note = skipped_note(result)
    return Table(
        f"Tuning trials on the dev split ({result.objective['name']})",
        t.frame,
        caption + (" " + note if note else ""),
        "trials",
    )


def front_table(result: TuneResult) -> Table:
    """The Pareto front (score vs guard) of the dev trials."""
    f = result.frame(DEV)
    t = _cells(f[f["on_front"]].sort_values(result.guard, ascending=False), result, flags=True)
    return Table(
        f"Pareto front on the dev split ({_NAMES.get(result.score, result.score)} vs {_NAMES.get(result.guard, result.guard)})",
        t.frame,
        f"Settings no other setting beats on both. Constraint: {_constraint(result)}. {INTERVALS_NOTE}",
        "pareto",
    )


def test_table(result: TuneResult) -> Table:
    """Stock and the chosen setting on the held-out test split (other variants' settings: :func:`variants_table`)."""
    f = result.frame(TEST)
    f = f[(f["label"] == "stock") | f["chosen"]]
    t = _cells(f, result, flags=False)
    prof = [c for c in f.columns if c.startswith("sigma_p")]
    if prof:
        t.frame.insert(3, "σ by position", ["/".join(f"{r[c]:.3f}" for c in prof) for _, r in f.iterrows()])
    return Table(
        f"Held-out test split: stock vs the chosen setting ({result.chosen_label})",
        t.frame,
        "The test split took no part in the choice. " + INTERVALS_NOTE,
        "test",
    )


def figure_names(result: TuneResult, split: str = DEV) -> dict[str, str]:
    """Each trial label of ``split`` -> the name the figures give it (:meth:`Calibration.figure_label`)."""
    return display_labels({t.label: t.calibration.figure_label() for t in result.trials if t.split == split})


def tradeoff_figure(result: TuneResult):
    f = result.frame(DEV)
    names = figure_names(result)
    points = pd.DataFrame(
        {
            "panel": "dev split",
            "label": [names[x] for x in f["label"]],
            "x": f[result.score],
            "y": f[result.guard],
            "reference": f["label"] == "stock",
            "highlight": f["chosen"],
        }
    )
    return tradeoff_scatter(
        points,
        xlabel=_NAMES.get(result.score, result.score),
        ylabel=_NAMES.get(result.guard, result.guard),
        title=f"Every setting tried on the dev split ({result.objective['name']} objective)",
        subtitle=relabel(tuning_subtitle(result), names),
        annotate=True,
        threshold=_feasibility(result),
        ybounds=_BOUNDS.get(result.guard),
    )


def tuning_subtitle(result: TuneResult) -> str:
    """What a tuner figure is of: the model, its token limit, the constraint and the choice in words."""
    o = result.objective
    head = " · ".join(
        x for x in (o.get("model_name"), f"token limit {o['token_limit']}" if o.get("token_limit") else "") if x
    )
    choice = "chosen: stock" if result.chosen is STOCK else f"chosen {result.chosen_label}: {result.chosen.describe()}"
    limit = (
        f"{_NAMES.get(result.guard, result.guard)} at most {100 * result.max_drop:g} points below stock (dashed line)"
    )
    return f"{head}\n{choice}; constraint: {limit}"  # the first line under the title, the second under the legend


def _feasibility(result: TuneResult) -> tuple[float, str] | None:
    """The dev split's feasibility line: the stock guard minus the allowed drop."""
    try:
        stock = result.trial(STOCK, DEV).metrics[result.guard]
    except KeyError:
        return None
    guard = _NAMES.get(result.guard, result.guard)  # the limit in points, as --max-recall-drop and the verdict say it
    return stock - result.max_drop, f"feasible above: stock {guard} - {100 * result.max_drop:g} points"


def fronts_figure(result: TuneResult):
    """The dev-split Pareto front of every variant on one plot, stock starred, the chosen setting labelled."""
    f = result.frame(DEV)
    stock = f["label"] == "stock"
    names = figure_names(result)
    points = pd.DataFrame(
        {
            "series": f["variant"],
            "label": [names[x] for x in f["label"]],
            "x": f[result.score],
            "y": f[result.guard],
            "on_front": f.get("on_variant_front", f["on_front"]),
            "reference": stock,
            "highlight": f["chosen"],
        }
    )
    return front_lines(
        points,
        xlabel=_NAMES.get(result.score, result.score),
        ylabel=_NAMES.get(result.guard, result.guard),
        title=f"Pareto front of each calibration variant (dev split, {result.objective['name']} objective)",
        subtitle=relabel(tuning_subtitle(result), names),
        threshold=_feasibility(result),
        ybounds=_BOUNDS.get(result.guard),
    )


def variants_table(result: TuneResult) -> Table:
    """Each variant's best feasible dev setting on the held-out test split, with stock."""
    f = result.frame(TEST)
    keep = {"stock"} | {c.label() for c in result.variant_best.values() if c is not None} | {result.chosen_label}
    f = f[f["label"].isin(keep)]
    t = _cells(f, result, flags=False)
    t.frame.insert(1, "variant", list(f["variant"]))
    missing = [v for v, c in result.variant_best.items() if c is None]
    note = f" No feasible dev setting: {', '.join(missing)}." if missing else ""
    return Table(
        "Held-out test split: each variant's best feasible dev setting",
        t.frame,
        "Chosen on the dev split per variant; the test split took no part in any choice." + note + " " + INTERVALS_NOTE,
        "variants",
    )


def summary_markdown(result: TuneResult) -> str:
    test = result.test_metrics()
    family = result.objective.get("test_family")
    split = (
        f" Test split: the document family {family}, dev: the corpus's other families (a family it was not tuned on)."
        if family
        else ""
    )
    lines = [
        f"# posfair tune ({result.objective['name']})",
        "",
        f"Chosen: **{result.chosen_label}** ({result.chosen.describe()})"
        + ("" if result.feasible else " (no calibration satisfied the constraint: stock kept)")
        + split
        + "".join(f"\n\n**{line}**" for line in verdict_lines(result)),
        "",
        to_markdown(front_table(result)),
        to_markdown(test_table(result)),
        to_markdown(trials_table(result)),
    ]
    if len(result.fronts) > 1:
        lines.insert(5, to_markdown(variants_table(result)))
    s, c = test["stock"], test["chosen"]
    check = "" if result.test_check is None else f" Constraint: {result.test_check.verdict}."
    effect = "" if result.test_effect is None else f" Score: {result.test_effect.verdict}."
    if result.test_effect is not None and result.test_effect.direction_text is not None:
        effect += f" Direction: {result.test_effect.direction_text}."
    lines[3:3] = [
        "",
        f"Held-out test split, stock -> chosen: {result.score} {s[result.score]:.3f} -> {c[result.score]:.3f}, "
        f"{result.guard} {s[result.guard]:.3f} -> {c[result.guard]:.3f}.{check}{effect}",
    ]
    note = skipped_note(result)
    if note:
        lines[3:3] = ["", note]
    reversed_ = result.test_reversal()
    if reversed_:
        lines[3:3] = ["", f"warning: {reversed_}"]
    return "\n".join(lines)


def verdict_lines(result: TuneResult) -> list[str]:
    """What the chosen setting's checks on the held-out test split say, failures first; and whether the tuned
    model was saved (:func:`posfair.tuning.tune` sets ``saved_model`` / ``save_refused``)."""
    failed = result.failures()
    out = [f"FAILS on the held-out test split: {'; '.join(failed)}."] if failed else []
    if result.save_refused is not None:
        out.append("The tuned model was NOT saved (--save-model-anyway / save_anyway=True saves it all the same).")
    elif result.saved_model is not None:
        out.append(f"Tuned model saved to {result.saved_model}" + (" although it fails." if failed else "."))
    return out


def summary_text(result: TuneResult, out_dir: str | Path | None = None, *, log: str | Path | None = None) -> str:
    """The run's verdict in a few plain lines for a terminal, each thing said once: the choice, the held-out test
    split's figures, its checks (a failure once, first; the checks that hold after), whether the model was saved
    (a refusal is the command's ``error:`` line: not said here) and where the files are (``log``: the trial log).
    The tables are in ``summary.md`` and ``tables/``."""
    name = lambda key: _NAMES.get(key, key)  # noqa: E731
    chosen = f"chosen on the dev split: {result.chosen_label}"
    lines = [chosen + ("" if result.chosen is STOCK else f" ({result.chosen.describe()})")]
    if not result.feasible:
        lines.append("no calibration kept the constraint on the dev split: stock kept")
    failed = result.failures()
    if failed:
        lines.append(f"FAILS on the held-out test split: {'; '.join(failed)}")
    if result.chosen is not STOCK:
        s, c = result.test_metrics()["stock"], result.test_metrics()["chosen"]
        lines.append(
            f"held-out test split, stock -> chosen: {name(result.score)} {s[result.score]:.3f} -> "
            f"{c[result.score]:.3f}, {name(result.guard)} {s[result.guard]:.3f} -> {c[result.guard]:.3f}"
        )
        checks = ((result.test_check, "constraint", lambda g: not g.holds),
                  (result.test_effect, "score", lambda g: g.reversed))  # fmt: skip
        for got, what, failing in checks:
            if got is not None and not failing(got):  # a failing check is said in the FAILS line
                lines.append(f"{what}: {got.verdict.removeprefix('on the held-out test split ')}")
        direction = None if result.test_effect is None else result.test_effect.direction_text
        if direction:
            lines.append(f"direction: {direction}")
    if result.saved_model is not None:
        lines.append(f"tuned model saved to {result.saved_model}" + (" although it fails" if failed else ""))
    if result.skipped:
        lines.append(f"skipped {len(result.skipped)} grid points that calibrate nothing ({NOOP_LABEL})")
    if out_dir is not None:
        out = Path(out_dir)
        trials = f"{out / 'trials.csv'}" + (f", {log} (the trial log)" if log is not None else "")
        lines.append(
            f"files: {out / 'summary.md'} (every table and legend), {out / 'tables'}/, {trials}, {out / 'tradeoff.png'}"
        )
    return "\n".join(lines)


def write_outputs(result: TuneResult, out_dir: str | Path) -> dict[str, Path]:
    """Tables (md/csv/tex), ``trials.csv``, ``tradeoff.{png,pdf}`` and ``summary.md`` into ``out_dir``."""
    out = Path(out_dir)
    paths: dict[str, Path] = {}
    tables = [trials_table(result), front_table(result), test_table(result)]
    if len(result.fronts) > 1:
        tables.append(variants_table(result))
    for t in tables:
        for kind, p in write_table(t, out / "tables").items():
            paths[f"table:{t.name}.{kind}"] = p
    frames = [result.frame(DEV).assign(split=DEV), result.frame(TEST).assign(split=TEST)]
    if result.skipped:
        frames.append(
            pd.DataFrame(
                [
                    {
                        "label": t.label,
                        "phase": t.phase,
                        "basket_size": t.calibration.basket_size,
                        "layers": str(t.calibration.layers),
                        "strength": t.strength,
                        "calibrated_share": 0.0,
                        "split": t.split,
                    }
                    for t in result.skipped
                ]
            )
        )
    paths["trials"] = atomic_write_text(out / "trials.csv", pd.concat(frames, ignore_index=True).to_csv(index=False))
    save_figure(tradeoff_figure(result), out / "tradeoff")
    paths["figure"] = out / "tradeoff.png"
    if len(result.fronts) > 1:
        save_figure(fronts_figure(result), out / "fronts")
        paths["fronts"] = out / "fronts.png"
    paths["summary"] = atomic_write_text(out / "summary.md", summary_markdown(result))
    return paths


def save_tuned_model(model: FairModel, calibration: Resolved, path: str | Path) -> Path:
    """Save ``model`` with ``calibration`` (a Calibration, or STOCK) as its own; the model's own calibration is restored."""
    before = model.calibration
    try:
        model.set_calibration(calibration)
        model.save(str(path))
    finally:
        model.set_calibration(before)
    return Path(path)
