"""The audit's numbers beyond the observations: OLS coefficients, fidelity and calibration coverage.

Pure functions of the observation table (one row per variant, document and
position; see :mod:`posfair.fairness.experiment`), gathered by
:class:`posfair.fairness.audit_result.AuditResult` and formatted by
:mod:`posfair.fairness.audit_tables`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from posfair.calibration import Calibration
from posfair.calibration.coverage import NOOP_LABEL, calibration_coverage
from posfair.fairness.documents import instance_label
from posfair.fairness.experiment import FIDELITY, MEASURES
from posfair.fairness.measures import profile_slope, profile_spread
from posfair.runtime.stacklevel import user_stacklevel
from posfair.stats.clusters import cluster_kind
from posfair.stats.inference import FEW_CLUSTERS, FewClustersWarning, Inference, InferenceLabel, read_inference_labels
from posfair.stats.position_ols import PositionOLS, fit_position_ols

__all__ = [
    "fit_all",
    "fit_instance",
    "few_clusters",
    "few_clusters_message",
    "cluster_kinds",
    "clusters_used_text",
    "headline_clusters",
    "fidelity_summary",
    "coverage_summary",
    "coverage_messages",
    "GROUP",
    "COEF_COLUMNS",
    "TYPED_COLUMNS",
    "inference_labels",
    "saved_table",
    "INSTANCE_KEYS",
]

GROUP = ["calibration", "setting", "measure", "n", "config"]
COEF_COLUMNS = [
    "config_key",
    "coef",
    "position",
    "estimate",
    "se",
    "t",
    "p",
    "mark",
    "nobs",
    "clusters",
    "cluster_by",
    "cluster_kind",
    "inference",
    "inference_used",
    "ci_low",
    "ci_high",
]
#: columns held in memory only: typed values whose text another column saves (``inference_used``: ``inference``)
TYPED_COLUMNS = ["inference_used"]
#: one regression per (variant, instance) and measure
INSTANCE_KEYS = ["calibration", "setting", "n", "config"]


def _fit_group(g: pd.DataFrame, measure: str, n: int, inference: Inference) -> PositionOLS:
    y = g[measure].to_numpy(dtype=float)
    topics = g["topic"].to_numpy() if "topic" in g else None
    return fit_position_ols(
        y, g["position"].to_numpy(), g["set_id"].to_numpy(), n=int(n), inference=inference, topics=topics, warn=False
    )


def fit_all(
    observations: pd.DataFrame,
    measures: Sequence[str] = MEASURES,
    inference: Inference | str | None = None,
    *,
    warn: bool = True,
) -> pd.DataFrame:
    """OLS per (calibration, setting, measure, n, config): long table of coefficients.

    ``inference``: :class:`~posfair.stats.inference.Inference` (default CR1 + t(G-1)).  Columns
    ``clusters`` (G, the clusters the p-values rest on), ``cluster_by`` (what a cluster is, with the counts) and ``inference`` (a short label) say what each p-value rests
    on; ``ci_low`` / ``ci_high`` are the 95% CR1 t(G-1) intervals of statsmodels' fit (whose
    results object :func:`fit_instance` returns).  ``warn``: one
    :class:`~posfair.stats.inference.FewClustersWarning` naming every instance with G < 20 (see
    :func:`few_clusters`).
    """
    inference = Inference.coerce(inference)
    rows = []
    for key, g in observations.groupby(INSTANCE_KEYS, sort=False):
        for m in measures:
            if not np.isfinite(g[m].to_numpy(dtype=float)).any():
                continue
            f = _fit_group(g, m, key[2], inference).to_frame()
            for name, val in zip(INSTANCE_KEYS, key, strict=True):
                f[name] = val
            f["measure"] = m
            f["config_key"] = g["config_key"].iloc[0]
            rows.append(f)
    if not rows:
        return pd.DataFrame(columns=GROUP + COEF_COLUMNS)
    out = pd.concat(rows, ignore_index=True)[GROUP + COEF_COLUMNS]
    message = few_clusters_message(out)
    if warn and message:
        warnings.warn(message, FewClustersWarning, stacklevel=user_stacklevel())
    return out


def fit_instance(
    observations: pd.DataFrame,
    *,
    measure: str,
    calibration: str,
    setting: str,
    n: int,
    config: str,
    inference: Inference | str | None = None,
) -> PositionOLS:
    """The regression of one (variant, instance, measure) with statsmodels' results object (``.result``).

    The same fit as the rows of :func:`fit_all` (same observations in the same order): its
    ``conf_int()`` equals their ``ci_low`` / ``ci_high``, its ``summary()`` is statsmodels'.
    """
    o = observations
    g = o[(o["calibration"] == calibration) & (o["setting"] == setting) & (o["n"] == n) & (o["config"] == config)]
    if not len(g):
        raise KeyError(f"no observations for {calibration}/{setting}/n={n}/{config}")
    if measure not in g or not np.isfinite(g[measure].to_numpy(dtype=float)).any():
        raise KeyError(f"no {measure} observations for {calibration}/{setting}/n={n}/{config}")
    return _fit_group(g, measure, n, Inference.coerce(inference))


def few_clusters(coefs: pd.DataFrame) -> pd.DataFrame:
    """The instances (n, config) whose regressions rest on fewer than 20 segment sets, with G (the fewest clusters
    any of the instance's intervals rests on)."""
    if not len(coefs) or "clusters" not in coefs:
        return pd.DataFrame(columns=["n", "config", "clusters"])
    c = coefs[coefs["clusters"] < FEW_CLUSTERS]
    c = c.groupby(["n", "config"], sort=False, as_index=False)["clusters"].min()
    return c[["n", "config", "clusters"]].reset_index(drop=True)


def few_clusters_message(coefs: pd.DataFrame) -> str | None:
    """One line naming every instance with G < 20 (None if there is none): the warning, CLI and report text."""
    few = few_clusters(coefs)
    if not len(few):
        return None
    total = coefs.drop_duplicates(["n", "config"]).shape[0]
    which = "; ".join(f"{instance_label(r.n, r.config)}: G={r.clusters}" for r in few.itertuples(index=False))
    labels = ", ".join(dict.fromkeys(coefs["inference"])) if "inference" in coefs else ""
    return (
        f"{len(few)} of {total} instances rest on fewer than {FEW_CLUSTERS} clusters (G) -- {which}. "
        f"Their p-values ({labels}) are approximate with so few clusters; more documents (more segment sets) "
        "or --inference wild give sturdier tests."
    )


def inference_labels(coefs: pd.DataFrame) -> list[InferenceLabel | str]:
    """Per row the inference its p-value used, typed: the column ``inference_used`` of a fresh fit; for a saved table
    (``coefficients.csv`` read back, which keeps the text) its ``inference`` labels read by
    :func:`~posfair.stats.inference.read_inference_labels`; [] without either."""
    if "inference_used" in coefs:
        return list(coefs["inference_used"])
    if "inference" in coefs:
        return read_inference_labels(coefs["inference"])
    return []


def saved_table(frame: pd.DataFrame) -> pd.DataFrame:
    """A table of fits as its CSV holds it (``coefficients.csv``, ``language_effects.csv``): without the in-memory
    :data:`TYPED_COLUMNS` (their text is in ``inference``)."""
    return frame.drop(columns=TYPED_COLUMNS, errors="ignore")


def cluster_kinds(coefs: pd.DataFrame) -> list[str]:
    """Per coefficient row what a cluster is in its interval, in one word: the typed column ``cluster_kind``; for a
    ``coefficients.csv`` saved before that column was written, read off its ``cluster_by`` label
    (:func:`~posfair.stats.clusters.cluster_kind`); "" without either."""
    if "cluster_kind" in coefs:
        return [str(k) for k in coefs["cluster_kind"]]
    if "cluster_by" in coefs:
        return [cluster_kind(b) for b in coefs["cluster_by"]]
    return [""] * len(coefs)


#: how the inference line says what an interval was clustered by (a count of intervals is never called "sets")
_CLUSTERED_BY = {
    "sets": "clustered by set",
    "components": "clustered by component",
    "two-way": "two-way by set and topic",
}


def clusters_used_text(coefs: pd.DataFrame) -> str:
    """Which clustering the intervals of ``coefs`` used, counted: ``Intervals (β_p, p ≥ 2), 48 in all: 12 clustered
    by component (G = 2), 36 clustered by set (G = 16) (column cluster_by of coefficients.csv).`` ("" without
    ``cluster_by``)."""
    if "cluster_by" not in coefs or not len(coefs):
        return ""
    c = coefs[coefs["position"] > 1] if "position" in coefs else coefs
    kinds = pd.Series(cluster_kinds(c), index=c.index)
    counts = pd.DataFrame({"kind": kinds, "G": c["clusters"].astype(int)}).value_counts(sort=False)
    parts = [f"{int(k)} {_CLUSTERED_BY.get(kind, kind)} (G = {g})" for (kind, g), k in counts.items()]
    return f"Intervals (β_p, p ≥ 2), {len(c)} in all: {', '.join(parts)} (column cluster_by of coefficients.csv)."


def inference_summary(coefs: pd.DataFrame) -> str:
    """The inference of ``coefs``' intervals in one short line, for a terminal's summary (the report says it in
    full: :func:`clusters_used_text` and :func:`~posfair.stats.inference.describe_inference`): each inference's label
    as the column ``inference`` of coefficients.csv holds it, and the clusters (G) the intervals (β_p, p ≥ 2) rest on
    per kind, e.g. ``CR1 conservative t(G-1), G = 2 to 5 sets`` ("" without an inference)."""
    labels = inference_labels(coefs) if len(coefs) else []
    if not labels:
        return ""
    text = "; ".join(dict.fromkeys(lab.text() if isinstance(lab, InferenceLabel) else str(lab) for lab in labels))
    c = coefs[coefs["position"] > 1] if "position" in coefs else coefs
    if "clusters" not in c or not len(c):
        return text
    kinds = cluster_kinds(c)
    spans = []
    for kind in dict.fromkeys(kinds):
        g = sorted({int(x) for x, k in zip(c["clusters"], kinds, strict=True) if k == kind})
        spans.append(f"{g[0] if len(g) == 1 else f'{g[0]} to {g[-1]}'} {kind}".strip())
    return f"{text}, G = {', '.join(spans)}"


def headline_clusters(coefs: pd.DataFrame) -> str:
    """The G of one headline row (every calibration's β_p): ``16 sets``, or ``stock: 2 components; cal: 16 two-way``
    where the calibrations' intervals used different clusterings."""
    kinds = cluster_kinds(coefs)
    cells = [f"{int(g)} {k}".strip() for g, k in zip(coefs["clusters"], kinds, strict=True)]
    if len(set(cells)) == 1:
        return cells[0]
    return "; ".join(f"{cal}: {cell}" for cal, cell in zip(coefs["calibration"], cells, strict=True))


def fidelity_summary(
    observations: pd.DataFrame, coefficients: pd.DataFrame | None = None, coverage: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per (calibration, setting, n, config): the σ profile, its spread, slope (direction) and max |β|, and
    the fidelity means.

    Per-position columns ``sigma_p<k>`` / ``margin_p<k>`` (NaN beyond n); ``recall`` and ``drift``
    are means over documents (each document counts once).  With ``coverage``
    (:func:`coverage_summary`) a column ``calibrated_share`` (NaN for stock).
    """
    keys = INSTANCE_KEYS
    if not len(observations):
        return pd.DataFrame(
            columns=keys + ["config_key", "documents", "sets", "spread", "slope", "max_abs_beta", *FIDELITY]
        )
    n_max = int(observations["n"].max())
    rows = []
    for key, g in observations.groupby(keys, sort=False):
        by_pos = g.groupby("position")
        per_doc = g.drop_duplicates("doc_id")
        row: dict[str, Any] = dict(zip(keys, key, strict=True))
        row.update(
            config_key=g["config_key"].iloc[0], documents=int(g["doc_id"].nunique()), sets=int(g["set_id"].nunique())
        )
        row["spread"] = profile_spread(g["sigma"].to_numpy(), g["position"].to_numpy())
        row["slope"] = profile_slope(g["sigma"].to_numpy(), g["position"].to_numpy())
        row["max_abs_beta"] = np.nan
        if coefficients is not None and len(coefficients):
            c = coefficients
            hit = c[
                (c["measure"] == "sigma")
                & (c["calibration"] == key[0])
                & (c["setting"] == key[1])
                & (c["n"] == key[2])
                & (c["config"] == key[3])
                & (c["position"] > 1)
            ]
            if len(hit):
                row["max_abs_beta"] = float(hit["estimate"].abs().max())
        row["other_cos"] = float(per_doc["other_cos"].mean())
        row["margin"] = float(g["margin"].mean())
        row["recall"] = float(per_doc["recall"].mean())
        row["drift"] = float(per_doc["drift"].mean())
        for p in range(1, n_max + 1):
            row[f"sigma_p{p}"] = float(by_pos["sigma"].mean().get(p, np.nan))
            row[f"margin_p{p}"] = float(by_pos["margin"].mean().get(p, np.nan))
        if coverage is not None:
            row["calibrated_share"] = share_of(coverage, key[0], key[2], key[3])
        rows.append(row)
    return pd.DataFrame(rows)


def coverage_summary(observations: pd.DataFrame, calibrations: list[dict[str, Any]], pooling: str) -> pd.DataFrame:
    """One row per (calibration, n, config): ``documents``, ``calibrated`` and ``calibrated_share`` (NaN for stock).

    Counted with :func:`posfair.calibration.coverage.calibration_coverage` over the documents' token
    counts (``doc_tokens``: special tokens included; documents are built to fit the token limit, so
    none is truncated) and the calibrations' basket rule resolved for ``pooling``.
    """
    cols = ["calibration", "n", "config", "config_key", "documents", "calibrated", "calibrated_share"]
    if not len(observations):
        return pd.DataFrame(columns=cols)
    fields = set(Calibration.__dataclass_fields__)
    by_label = {c["label"]: Calibration.from_dict({k: v for k, v in c.items() if k in fields}) for c in calibrations}
    docs = observations[observations["setting"] == "main"].drop_duplicates(["calibration", "doc_id"])
    rows = []
    for (label, n, config), g in docs.groupby(["calibration", "n", "config"], sort=False):
        row: dict[str, Any] = {
            "calibration": label,
            "n": int(n),
            "config": config,
            "config_key": g["config_key"].iloc[0],
            "documents": int(len(g)),
        }
        cal = by_label.get(label)
        if cal is None:  # stock
            row.update(calibrated=np.nan, calibrated_share=np.nan)
        else:
            cov = calibration_coverage(cal, g["doc_tokens"].to_numpy(), pooling)
            row.update(calibrated=cov.calibrated, calibrated_share=cov.share)
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def coverage_messages(coverage: pd.DataFrame) -> list[str]:
    """One line per calibration that left some documents stock (share < 1), over all its instances."""
    out = []
    cov = coverage[coverage["calibrated_share"].notna()]
    for label, g in cov.groupby("calibration", sort=False):
        docs, done = int(g["documents"].sum()), int(g["calibrated"].sum())
        if done < docs:
            what = f"{NOOP_LABEL}, its figures are the stock model's" if done == 0 else f"{docs - done} encoded stock"
            out.append(f"calibration {label}: calibrated share {done / docs:.3f} ({done} of {docs} documents; {what})")
    return out


def share_of(coverage: pd.DataFrame, calibration: str, n, config: str) -> float:
    """The calibrated share of one (calibration, n, config) in a :func:`coverage_summary` (NaN if absent or stock)."""
    hit = coverage[
        (coverage["calibration"] == calibration) & (coverage["n"] == int(n)) & (coverage["config"] == config)
    ]
    return float(hit["calibrated_share"].iloc[0]) if len(hit) else np.nan


def is_noop(coverage: pd.DataFrame, calibration: str) -> bool:
    """Whether ``calibration`` changed no document in any instance of a :func:`coverage_summary`."""
    g = coverage[coverage["calibration"] == calibration]
    return bool(len(g)) and bool(g["calibrated_share"].notna().all()) and int(g["calibrated"].sum()) == 0
