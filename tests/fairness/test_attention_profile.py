"""The attention profile: equality with eager attention weights, mass bookkeeping,
padding (left and right), calibrated flatness and the strength blend, segments,
persistence, figures / report section, the CLI and bad input."""

from __future__ import annotations

import functools
import json

import numpy as np
import pandas as pd
import pytest
import torch

from posfair import Calibration
from posfair.attention.profile import AttentionProfile, attention_profile
from posfair.calibration import STOCK
from posfair.model.token_spans import join_segments

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def text(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, n_words))


DOCS = [text(40, 1), text(9, 2), text(27, 3), text(33, 4)]  # mixed lengths -> padding in every batch
B = 8


# -- an independent reference: transformers' eager attention weights ------------------------------
@functools.cache
def eager_model(folder):
    from transformers import AutoModel, AutoTokenizer

    return AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder, attn_implementation="eager").eval()


def eager_rows(folder, pooling: str, doc: str) -> np.ndarray:
    """(layers, T) head-averaged pooling row of one unpadded document."""
    tok, model = eager_model(folder)
    enc = tok([doc], return_tensors="pt")
    with torch.no_grad():
        att = model(**enc, output_attentions=True).attentions
    rows = []
    for a in att:  # (1, H, T, T)
        a = a[0].double().mean(0)  # (T, T)
        rows.append({"cls": a[0], "lasttoken": a[-1], "mean": a.mean(0)}[pooling].numpy())
    return np.stack(rows)


def reference_views(row: np.ndarray, basket: int, n_bins: int) -> dict[str, np.ndarray]:
    content = row[:, 1:-1]
    C = content.shape[1]
    baskets = np.stack([content[:, k : k + basket].sum(1) for k in range(0, C, basket)], axis=1)
    bins = np.zeros((row.shape[0], n_bins))
    for i in range(C):
        bins[:, min(int((i + 0.5) * n_bins / C), n_bins - 1)] += content[:, i]
    return {"special": np.stack([row[:, 0], row[:, -1]], axis=1), "basket": baskets, "bin": bins}


def mean_over_docs(per_doc: list[np.ndarray]) -> np.ndarray:
    """Mean per cell over the documents that have the cell (per layer)."""
    width = max(v.shape[1] for v in per_doc)
    total = np.zeros((per_doc[0].shape[0], width))
    count = np.zeros(width)
    for v in per_doc:
        total[:, : v.shape[1]] += v
        count[: v.shape[1]] += 1
    return total / count


@pytest.mark.parametrize("arch", ["bert", "bert-mean", "modernbert", "qwen3"])
def test_profile_equals_eager_attention_weights(tiny_model, tiny_model_path, arch):
    folder, pooling = tiny_model_path(arch)
    model = tiny_model(arch)
    layers = (1, 3)
    prof = attention_profile(model, DOCS, layers=layers, basket_size=B, n_bins=5, batch_size=3)
    assert prof.n_docs == len(DOCS)
    assert prof.queries == ("all" if pooling == "mean" else "pool")
    refs = [reference_views(eager_rows(folder, pooling, d), B, 5) for d in DOCS]
    for view in ("special", "basket", "bin"):
        expected = mean_over_docs([r[view] for r in refs])  # (layers, cells)
        np.testing.assert_allclose(prof.heatmap(view), expected, atol=2e-5)
        np.testing.assert_allclose(prof.mean(view), expected[list(layers)].mean(0), atol=2e-5)
    # documents reaching each basket: 38 content keys -> 5 baskets of 8 in the longest document
    counts = prof.stats("basket")["count"]
    assert counts[0] == len(DOCS) and counts[-1] == 1


@pytest.mark.parametrize("arch", ["bert", "bert-mean", "qwen3"])
def test_masses_sum_to_one_and_padding_gets_nothing(tiny_model, arch):
    model = tiny_model(arch)
    if arch == "qwen3":
        assert model.tokenizer.padding_side == "left"
    batched = attention_profile(model, DOCS, basket_size=B, batch_size=4)
    assert batched.max_total_error < 1e-5
    assert batched.max_padding_mass == 0.0
    singles = [attention_profile(model, [d], basket_size=B, batch_size=1) for d in DOCS]
    for s in singles:
        total = s.mean("special").sum() + np.nansum(s.mean("basket"))
        assert total == pytest.approx(1.0, abs=1e-5)
        assert s.mean("special").sum() + np.nansum(s.mean("bin")) == pytest.approx(1.0, abs=1e-5)
    # a padded batch gives exactly the profile of the documents run alone
    merged = singles[0]
    for s in singles[1:]:
        merged = merged.merge(s)
    for view in ("special", "basket", "bin"):
        np.testing.assert_allclose(batched.heatmap(view), merged.heatmap(view), atol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "bert-mean", "qwen3"])
def test_calibrated_content_baskets_are_flat_and_blend_linearly(tiny_model, arch):
    model = tiny_model(arch)
    doc = [DOCS[0]]
    full = Calibration(basket_size=B, layers=(2, 3), strength=1.0, isolate_bos=True, isolate_eos=True)
    stock = attention_profile(model, doc, basket_size=B)
    cal = attention_profile(model, doc, basket_size=B, calibration=full)
    assert cal.label == full.label() and cal.calibration == full.to_dict()
    hm_stock, hm_cal = stock.heatmap(), cal.heatmap()
    n_b = hm_stock.shape[1]
    assert n_b >= 3
    for layer in (2, 3):
        assert np.ptp(hm_cal[layer]) < 1e-5  # every content basket carries the same mass
        assert np.ptp(hm_stock[layer]) > 1e-3  # which the stock model does not
        content = 1.0 - cal.heatmap("special")[layer].sum()
        np.testing.assert_allclose(hm_cal[layer], content / n_b, atol=1e-5)
    np.testing.assert_allclose(hm_cal[:2], hm_stock[:2], atol=1e-6)  # uncalibrated layers untouched
    # strength alpha: mass = alpha * calibrated + (1 - alpha) * stock (only the last layer, same inputs)
    last = dict(basket_size=B, layers=(3,), isolate_bos=True, isolate_eos=True)
    one = attention_profile(model, doc, basket_size=B, calibration=Calibration(**last, strength=1.0)).heatmap()[3]
    alpha = 0.3
    blend = attention_profile(model, doc, basket_size=B, calibration=Calibration(**last, strength=alpha)).heatmap()[3]
    np.testing.assert_allclose(blend, alpha * one + (1 - alpha) * hm_stock[3], atol=1e-5)
    assert np.ptp(one) < 1e-5 and np.ptp(blend) > 1e-4


def test_segment_view(tiny_model):
    from posfair.fairness.documents import Document

    model = tiny_model("bert")
    parts = [(text(12, 10), text(20, 11), text(7, 12)), (text(5, 13), text(9, 14), text(30, 15))]
    docs, spans = zip(*(join_segments(p) for p in parts), strict=True)
    prof = attention_profile(model, list(docs), segments=list(spans), basket_size=B)
    seg = prof.mean("segment")
    assert seg.shape == (3,)
    assert prof.mean("special").sum() + seg.sum() == pytest.approx(1.0, abs=1e-5)
    n_tok = [[len(model.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in p] for p in parts]
    np.testing.assert_array_equal(prof.segment_tokens, np.sum(n_tok, axis=0))
    # Document objects bring their own spans
    objs = [
        Document(f"d{i}", "s", 0, (0, 1, 2), ("a", "b", "c"), ("a", "b", "c"), ("en",) * 3, p, d, tuple(s), 0)
        for i, (p, d, s) in enumerate(zip(parts, docs, spans, strict=True))
    ]
    again = attention_profile(model, objs, basket_size=B)
    np.testing.assert_allclose(again.mean("segment"), seg, atol=1e-9)


def test_save_load_frame(tiny_model, tmp_path):
    model = tiny_model("qwen3")
    prof = attention_profile(model, DOCS, basket_size=B, group="en", model_name="tiny-qwen3")
    paths = prof.save(tmp_path / "profile")
    assert paths["parquet"].is_file() and paths["npz"].is_file()
    back = AttentionProfile.load(paths["npz"])
    assert back.meta() == prof.meta()
    for view in ("special", "basket", "bin"):
        np.testing.assert_array_equal(back.heatmap(view), prof.heatmap(view))
    df = pd.read_parquet(paths["parquet"])
    assert set(df["view"]) == {"special", "basket", "bin"}
    set_rows = df[(df["view"] == "basket") & (df["layer"] == -1)]
    np.testing.assert_allclose(set_rows["mean"].to_numpy(), prof.mean("basket"))
    assert (set_rows["lo"] <= set_rows["mean"]).all() and (set_rows["hi"] >= set_rows["mean"]).all()
    assert not list(tmp_path.glob(".*.tmp"))
    mean_model = attention_profile(tiny_model("bert-mean"), DOCS[:1], basket_size=B)
    assert mean_model.query_label == "mean over query rows"
    assert (mean_model.to_frame()["queries"] == "mean over query rows").all()


def test_figures_and_report_section(tiny_model, tmp_path):
    from posfair.attention.render import attention_section
    from posfair.report.html import render_report

    model = tiny_model("bert")
    parts = [(text(12, 20), text(20, 21)), (text(25, 22), text(9, 23))]
    docs, spans = zip(*(join_segments(p) for p in parts), strict=True)
    cal = Calibration(basket_size=B, layers=2, strength=1.0)
    profiles = [
        attention_profile(model, list(docs), segments=list(spans), basket_size=B, calibration=c, group="en")
        for c in (STOCK, cal)
    ]
    section = attention_section(profiles, tmp_path)
    for name in ("attention_baskets", "attention_bins", "attention_layers", "attention_segments"):
        assert (tmp_path / f"{name}.png").is_file() and (tmp_path / f"{name}.pdf").is_file()
    assert len(section.figures) == 4
    html = render_report("t", [section])
    assert "Attention profile" in html and cal.label() in html and "stock" in html
    # drawn at their real size: every text inside the canvas, no labels on each other, the calibration in words
    from posfair.attention.render import plot_baskets, plot_layer_heatmap, plot_view
    from posfair.report.plots import figure_heading, layout_problems

    for fig in (plot_baskets(profiles, title="t"), plot_view(profiles, "bin", title="t"),
                plot_view(profiles, "segment", title="t"), plot_layer_heatmap(profiles, title="t")):  # fmt: skip
        assert layout_problems(fig) == []
        heading = figure_heading(fig)
        assert cal.describe() in heading and f"token limit {model.max_seq_length}" in heading
    # the data drawn are the profiles' numbers: each profile's line per view, each panel's layer x basket image
    for view in ("bin", "segment"):
        lines = {line.get_label(): line for line in plot_view(profiles, view).axes[0].get_lines()}
        for p in profiles:
            np.testing.assert_allclose(lines[p.label].get_ydata(), p.mean(view))
            np.testing.assert_allclose(lines[p.label].get_xdata(), np.arange(1, len(p.mean(view)) + 1))
    # the basket figure: each profile's basket means as its line, its BOS / EOS means as its two bars
    ax_special, ax_baskets = plot_baskets(profiles).axes[:2]
    lines = {line.get_label(): line for line in ax_baskets.get_lines()}
    heights = [bar.get_height() for bar in ax_special.patches]
    for k, p in enumerate(profiles):
        np.testing.assert_allclose(lines[p.label].get_ydata(), p.mean("basket"))
        np.testing.assert_allclose(heights[2 * k : 2 * k + 2], p.stats("special")["mean"])
    assert np.abs(profiles[1].mean("basket") - profiles[0].mean("basket")).max() > 1e-3  # calibrated is not stock
    images = [ax.get_images()[0].get_array() for ax in plot_layer_heatmap(profiles).axes if ax.get_images()]
    for image, p in zip(images, profiles, strict=True):
        np.testing.assert_allclose(np.ma.filled(image, np.nan), p.heatmap("basket"))


def test_cli_on_tiny_model(tiny_model_path, tmp_path):
    from typer.testing import CliRunner

    from posfair.cli import app

    folder, _ = tiny_model_path("bert")
    rows = [{"id": f"t{i}", "lang": "en", "text": text(15 + (i % 5) * 3, 100 + i)} for i in range(8)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    args = ["attention", "--model", str(folder), "--corpus", str(corpus), "--n", "2", "--docs", "4", "--profile-basket-size", "8",
            "--profile-layers", "2+3", "--calibration", "8,2,1.0", "--max-seq-length", "128", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert (out / "attention.html").is_file() and (out / "attention_baskets.png").is_file()
    stored = sorted(out.glob("attention_en_*.npz"))
    assert len(stored) == 2
    profs = [AttentionProfile.load(p) for p in stored]
    assert {p.layers for p in profs} == {(2, 3)} and all(p.n_docs == 4 for p in profs)
    bad = CliRunner().invoke(app, [*args[:-2], "--profile-layers", "9", "--out", str(out)])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --profile-layers 9: ") and "only 4" in bad.stderr


def test_bad_input(tiny_model):
    model = tiny_model("bert")
    with pytest.raises(ValueError, match=r"out of range: the model has 4 layers"):
        attention_profile(model, DOCS, layers=(1, 7))
    with pytest.raises(ValueError, match="only 4"):
        attention_profile(model, DOCS, layers=6)
    with pytest.raises(ValueError, match="basket_size must be an integer >= 1"):
        attention_profile(model, DOCS, basket_size=0)
    long_doc = text(model.max_seq_length + 50, 9)
    with pytest.raises(ValueError, match=r"longer than the model's limit of \d+ tokens \(first: document 1"):
        attention_profile(model, [DOCS[0], long_doc])
    with pytest.raises(ValueError, match="segments has 1 entries for 2 documents"):
        attention_profile(model, DOCS[:2], segments=[[(0, 3)]])


def test_cli_model_bundled_is_the_bundled_model_not_a_hub_id(tmp_path, minilm):
    """`--model bundled` (as the README wrote it) loads the bundled MiniLM offline, in attention and audit alike."""
    from typer.testing import CliRunner

    from posfair.cli import app

    rows = [{"id": f"t{i}", "lang": "en", "text": text(30 + i, 200 + i)} for i in range(6)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        ["attention", "--model", "bundled", "--corpus", str(corpus), "--n", "2", "--docs", "2", "--out", str(out)],
    )
    assert res.exit_code == 0, res.output
    (prof,) = [AttentionProfile.load(p) for p in out.glob("attention_en_*.npz")]
    assert prof.n_docs == 2 and len(prof.layers) == minilm.num_layers // 2


def test_progress_callback_and_bar(tiny_model, capsys):
    """Progress through a callback (how the CLI drives its bars) or a tqdm bar; the numbers do not depend on it."""
    model = tiny_model("bert")
    capsys.readouterr()  # building the tiny model shows bars of its own
    done = []
    quiet = attention_profile(model, DOCS, basket_size=B, batch_size=3, progress=done.append)
    assert done == [3, 1] and capsys.readouterr().err == ""
    shown = attention_profile(model, DOCS, basket_size=B, batch_size=3, show_progress_bar=True, group="en")
    err = capsys.readouterr().err
    assert "attention stock (en)" in err and "4/4" in err
    np.testing.assert_array_equal(shown.mean("basket"), quiet.mean("basket"))
