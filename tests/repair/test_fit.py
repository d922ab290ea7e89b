"""posfair fit: the held-out measures against a slow path, the checks on planted repairs, the family split, the
fine-tuning loss against a hand computation, and the whole pipeline on a seeded tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from posfair.fairness.documents import Document, Instance, LanguageConfig, SamplingReport, SegmentSet
from posfair.repair.heldout import RepairLimits, check_repair, evaluate_repair, set_units

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fairness"))
from conftest import tiny_corpus  # noqa: E402


def _instance(sets: int, n: int = 3) -> Instance:
    """Every ordering of ``sets`` disjoint sets of ``n`` segments (segment ``s{k}-{i}``)."""
    import itertools

    docs, segsets = [], []
    for k in range(sets):
        ids = tuple(f"s{k}-{i}" for i in range(n))
        segsets.append(SegmentSet(f"set{k}", ids))
        for j, perm in enumerate(itertools.permutations(range(n))):
            seg = tuple(ids[i] for i in perm)
            texts = tuple(f"text {s}" for s in seg)
            docs.append(Document(f"set{k}-{j}", f"set{k}", j, perm, seg, seg, ("en",) * n, texts, " ".join(texts),
                                 (), 0))  # fmt: skip
    return Instance(
        n,
        LanguageConfig.mono("en"),
        segsets,
        docs,
        SamplingReport(
            n=n, config="en", limit=512, topics_available=n * sets, segments_outside_window=0, sets_wanted=sets
        ),
    )


def _biased_encoder(dim: int = 16, bias: float = 1.0, seed: int = 0):
    """Segments get random unit vectors; a document is a position-weighted sum (weights 1, 1 - bias/3, ...) of its
    segments' vectors plus noise: a planted first-position bias."""
    rng = np.random.default_rng(seed)
    vec: dict[str, np.ndarray] = {}

    def seg(text):
        if text not in vec:
            vec[text] = rng.normal(size=dim)
        return vec[text]

    def encode(texts):
        out = []
        for t in texts:
            parts = ["text " + p for p in t.split("text ") if p]
            parts = [p.strip() for p in parts]
            if len(parts) == 1:
                v = seg(parts[0])
            else:
                w = [1.0 - bias * p / (len(parts)) for p in range(len(parts))]
                v = sum(wi * seg(p) for wi, p in zip(w, parts, strict=True))
            out.append(v / np.linalg.norm(v))
        return np.array(out)

    return encode


def test_set_units_against_a_slow_path():
    inst = _instance(5)
    encode = _biased_encoder()
    units = set_units(inst, encode)
    # slow path: loops over documents and segments
    segs = sorted({s for d in inst.documents for s in d.segment_ids})
    S = {s: encode([f"text {s}"])[0] for s in segs}
    for k, sset in enumerate(inst.sets):
        docs = [d for d in inst.documents if d.set_id == sset.set_id]
        sig = np.zeros(3)
        above = np.zeros(3)
        top1 = 0.0
        for d in docs:
            v = encode([d.text])[0]
            sims = {s: float(v @ S[s]) for s in segs}
            best_foreign = max(x for s, x in sims.items() if s not in sset.topics)
            for p, s in enumerate(d.segment_ids):
                sig[p] += sims[s] / len(docs)
                above[p] += (sims[s] > best_foreign) / len(docs)
            top1 += (max(sims, key=sims.get) in d.segment_ids) / len(docs)
        np.testing.assert_allclose(units[k], np.concatenate([sig, above, [top1]]), atol=1e-9)


def test_a_planted_bias_removed_holds_and_its_reversal_fails():
    inst = _instance(12)
    stock = set_units(inst, _biased_encoder(bias=1.0))
    fixed = set_units(inst, _biased_encoder(bias=0.02))
    reversed_ = set_units(inst, _biased_encoder(bias=-1.0))
    h = evaluate_repair(stock, fixed, 3, "planted", len(inst.documents))
    b = stock[:, :3].mean(axis=0)
    assert h.positions[0].stock == pytest.approx(b[1] - b[0])
    assert h.positions[1].stock == pytest.approx(b[2] - b[0])
    assert all(e.stock < 0 for e in h.positions)
    for e in h.positions:
        assert e.removed_low <= e.removed <= e.removed_high
        assert e.removed > 0.9
    assert check_repair(h, RepairLimits(0.9, 100.0)) == []
    bad = evaluate_repair(stock, reversed_, 3)
    assert [e.lean for e in bad.positions] == ["reversed", "reversed"]
    failures = check_repair(bad, RepairLimits(0.0, 100.0))
    assert len(failures) == 2 and all("reversed beyond noise" in f for f in failures)
    # too little removed
    half = set_units(inst, _biased_encoder(bias=0.5))
    partial = evaluate_repair(stock, half, 3)
    assert any("below 90 %" in f for f in check_repair(partial, RepairLimits(0.9, 100.0)))
    assert not any("below" in f for f in check_repair(partial, RepairLimits(0.3, 100.0)))


def test_a_retrieval_drop_beyond_the_limit_fails():
    inst = _instance(8)
    stock = set_units(inst, _biased_encoder())
    worse = stock.copy()
    worse[:, 3:6] -= 0.05  # five points fewer own segments above every foreign one
    h = evaluate_repair(stock, worse, 3)
    change = h.retrieval_change("own above every foreign")
    assert change.change == pytest.approx(-5.0)
    assert any("own above every foreign -5.0 points" in f for f in check_repair(h, RepairLimits(0.0, 1.0)))
    assert check_repair(h, RepairLimits(0.0, 6.0)) == []


def test_order_invariance_terms_by_hand():
    from posfair.repair.finetune import order_invariance_terms

    torch.manual_seed(0)
    b, n, d = 4, 3, 8

    def unit(*shape):
        return F.normalize(torch.randn(*shape, dtype=torch.float64), dim=-1)

    docs, segs, seg_targets = unit(b, d), unit(b, n, d), unit(b, n, d)
    set_target = unit(3, d)
    sets = [0, 0, 1, 2]  # rows 0 and 1 are two orderings of one set: one target, not each other's negatives
    targets = set_target[sets]
    distil, hold, rank = order_invariance_terms(docs, segs, targets, seg_targets, scale=20.0)
    assert float(distil) == pytest.approx(np.mean([1 - float(docs[i] @ targets[i]) for i in range(b)]), rel=1e-12)
    hand_hold = [1 - float(segs[i, p] @ seg_targets[i, p]) for i in range(b) for p in range(n)]
    assert float(hold) == pytest.approx(np.mean(hand_hold), rel=1e-12)
    total, count = 0.0, 0
    for i in range(b):
        for p in range(n):
            logits = []
            for j in range(b):
                for q in range(n):
                    if (j, q) == (i, p) or sets[j] != sets[i]:
                        logits.append(20.0 * float(docs[i] @ segs[j, q]))
            pos = 20.0 * float(docs[i] @ segs[i, p])
            total += -pos + np.log(np.sum(np.exp(logits)))
            count += 1
    assert float(rank) == pytest.approx(total / count, rel=1e-10)
    assert float(order_invariance_terms(docs, segs, targets, seg_targets, with_rank=False)[2]) == 0.0


def test_the_set_target_is_order_free_and_the_stock_model_sits_on_it_for_a_fair_model():
    """The set's target is the mean over every ordering: an encoder that ignores order is already there (distil
    0), and the rows carry it unchanged whatever the ordering."""
    from posfair.repair.finetune import stock_targets, training_rows

    inst = _instance(3)
    rng = np.random.default_rng(0)
    vec = {f"s{k}-{i}": rng.normal(size=6) for k in range(3) for i in range(3)}

    class BagOfSegments:  # the mean of its segments' vectors: blind to order
        def encode(self, texts, batch_size=16, **kwargs):
            out = []
            for t in texts:
                v = np.sum([vec[w] for w in t.split() if w != "text"], axis=0)
                out.append(v / np.linalg.norm(v))
            return np.array(out)

    targets = stock_targets(BagOfSegments(), [inst])
    rows = training_rows([inst], targets)
    labels = np.array(rows["label"]).reshape(len(rows["document"]), 4, 6)
    docs = BagOfSegments().encode(rows["document"])
    np.testing.assert_allclose(np.sum(docs * labels[:, 0], axis=1), 1.0, atol=1e-6)
    segs = BagOfSegments().encode(rows["segment_2"])
    np.testing.assert_allclose(np.sum(segs * labels[:, 2], axis=1), 1.0, atol=1e-6)
    assert len({tuple(np.round(labels[i, 0], 5)) for i in range(6)}) == 1  # one target for the 6 orderings


def _two_families() -> pd.DataFrame:
    a = tiny_corpus(topics=40, seed=1, min_words=10, max_words=25, langs=("en",))
    a["source"] = "fam-a"
    b = tiny_corpus(topics=30, seed=2, min_words=10, max_words=25, langs=("en",))
    b["id"] = "b" + b["id"]
    b["source"] = "fam-b"
    return pd.concat([a, b], ignore_index=True)


def test_the_split_holds_out_the_smallest_family_and_shares_no_section(tiny_model):
    from posfair.repair.data import repair_split

    split = repair_split(tiny_model("bert-mean"), _two_families(), limit=128)
    assert split.test_family == "fam-b" and split.fit_families == ("fam-a",)

    def sections(part):
        return {t for inst in part for s in inst.sets for t in s.topics}

    train, dev, test = sections(split.train), sections(split.dev), sections(split.test)
    assert not (train & dev) and not (train & test) and not (dev & test)
    assert all(t.startswith("b") for t in test) and not any(t.startswith("b") for t in train | dev)
    for part in (split.dev, split.test):  # judged on disjoint sets: each section in one set
        for inst in part:
            topics = [t for s in inst.sets for t in s.topics]
            assert len(topics) == len(set(topics))
    # every ordering of every set is a document
    for inst in split.test:
        assert len(inst.documents) == 6 * len(inst.sets)


def test_fit_refuses_to_save_a_failing_repair_and_writes_its_report(tiny_model_path, tmp_path):
    from posfair.repair.fitting import fit_repair

    path, _ = tiny_model_path("bert-mean")
    out = tmp_path / "repaired"
    res = fit_repair(str(path), out, corpus=_two_families(), method="tempscale", max_seq_length=128,
                     limits=RepairLimits(0.9, 1.0))  # fmt: skip
    # a temperature cannot remove 90 % of a random tiny model's bias: refused, nothing saved but the report
    assert res.failures and not res.saved
    assert sorted(p.name for p in out.iterdir()) == ["fit"]
    saved = json.loads((out / "fit" / "heldout.json").read_text())
    assert saved["failures"] == res.failures and saved["saved"] is False
    assert "fails:" in (out / "fit" / "heldout.md").read_text()


def _objective(model, instances, targets, settings):
    """:class:`OrderInvariantLoss`'s value on every document of ``instances``, no gradient."""
    from posfair.repair.finetune import order_invariance_terms, training_rows

    rows = training_rows(instances, targets)
    n = instances[0].n
    with torch.no_grad():
        docs = torch.as_tensor(model.encode(rows["document"], normalize_embeddings=True), dtype=torch.float64)
        segs = torch.stack(
            [torch.as_tensor(model.encode(rows[f"segment_{p}"], normalize_embeddings=True)) for p in range(1, n + 1)],
            dim=1,
        ).double()
    labels = torch.as_tensor(rows["label"], dtype=torch.float64).reshape(len(docs), n + 1, -1)
    distil, hold, rank = order_invariance_terms(docs, segs, labels[:, 0], labels[:, 1:], settings.scale)
    return float(distil + settings.anchor * hold + settings.contrastive * rank)


def test_finetuning_removes_a_planted_bias_and_the_saved_folder_reloads_it(tiny_model_path, tmp_path):
    import posfair
    from posfair.repair.data import repair_split
    from posfair.repair.finetune import FinetuneSettings, fit_finetune, stock_targets
    from posfair.repair.heldout import evaluate_repair, set_units

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_learned import plant_bias

    path, _ = tiny_model_path("bert-mean")
    stock = posfair.load_model(str(path), max_seq_length=128)
    plant_bias(stock)  # the first tokens pull every layer's attention: later segments under-represented
    model = posfair.load_model(str(path), max_seq_length=128)
    plant_bias(model)
    split = repair_split(model, _two_families(), limit=128)
    targets = stock_targets(model, split.train)
    settings = FinetuneSettings(steps=40, batch_size=8, learning_rate=5e-4, eval_every=8)
    before = _objective(model, split.train, targets, settings)
    seen = []
    fit_finetune(model, split.train, split.dev, str(tmp_path / "work"), settings,
                 progress=lambda step, total, value: seen.append((step, total)))  # fmt: skip
    after = _objective(model, split.train, targets, settings)
    # the objective falls on the documents it fits, and the planted bias shrinks on the family it never saw
    assert after < 0.8 * before, (before, after)
    assert seen and seen[-1][1] == 40

    def encoder(m):
        return lambda texts: m.encode(list(texts), normalize_embeddings=True).astype(np.float64)

    heldout = evaluate_repair(np.concatenate([set_units(i, encoder(stock)) for i in split.test]),
                              np.concatenate([set_units(i, encoder(model)) for i in split.test]), 3)  # fmt: skip
    assert all(e.stock < 0 and e.removed > 0.3 for e in heldout.positions), heldout.positions
    # every transformer layer moved; the embedding tables did not
    moved = {n for (n, p), (_, q) in zip(model.named_parameters(), stock.named_parameters(), strict=True)
             if not torch.equal(p, q)}  # fmt: skip
    layers = model.transformer_module.auto_model.config.num_hidden_layers
    assert {int(n.split(".layer.")[1].split(".")[0]) for n in moved} == set(range(layers))
    assert not any("embeddings" in n for n in moved)
    model.save(str(tmp_path / "saved"))
    reloaded = posfair.load_model(str(tmp_path / "saved"), max_seq_length=128)
    texts = [d.text for d in split.test[0].documents[:6]]
    np.testing.assert_allclose(reloaded.encode(texts), model.encode(texts), atol=1e-6)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--method", "nope"], "error: --method nope: must be one of finetune, learned, tempscale, grid; got 'nope'"),
        (["--test-family", "nope"], "error: --test-family 'nope' is not in the corpus; its families: debian-faq, "
                                    "installation-guide"),
        (["--steps", "0"], "error: --steps 0: must be in [1, 1000000]; got 0"),
        (["--min-removed", "120"], "error: --min-removed 120"),
    ],
)  # fmt: skip
def test_fit_refuses_bad_input_in_one_line(args, line, tmp_path):
    import subprocess

    res = subprocess.run([sys.executable, "-m", "posfair.cli", "fit", "--out", str(tmp_path / "o"), *args],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), res.stderr
    assert not (tmp_path / "o").exists()  # refused before any work: nothing written


def test_a_short_fit_encodes_targets_only_for_the_sets_it_reaches():
    from posfair.repair.finetune import _sets_used

    inst = _instance(8)
    assert _sets_used([inst], 48, seed=0) == [inst]  # 48 documents: every one is reached
    cut = _sets_used([inst], 5, seed=0)
    kept = {d.set_id for d in cut[0].documents}
    assert 1 <= len(kept) <= 5 and [s.set_id for s in cut[0].sets] == sorted(kept, key=lambda x: int(x[3:]))
    # every ordering of a kept set stays (its target is the mean over all of them)
    assert all(sum(d.set_id == k for d in cut[0].documents) == 6 for k in kept)
    assert _sets_used([inst], 5, seed=0) == cut  # seeded


def _units(means: list[float], sets: int = 12, seed: int = 0) -> np.ndarray:
    """:func:`set_units` rows of ``sets`` sets whose mean σ per position is ``means`` (plus a little noise), every
    own segment above every foreign one and recall@1 1."""
    rng = np.random.default_rng(seed)
    sigma = np.array(means) + rng.normal(scale=0.005, size=(sets, len(means)))
    return np.concatenate([sigma, np.ones((sets, len(means) + 1))], axis=1)


def test_a_sign_flipped_beta_is_reported_reversed_never_removed(monkeypatch, tmp_path):
    """Stock β2 = -0.1, β3 = -0.2; the repair turns them to +0.03 and +0.06: 70 % of |β| "removed" by magnitude,
    but the bias points the other way.  Every report says reversed, with what is left, and no share removed."""
    from posfair.cli.fit import summary_lines
    from posfair.repair import figure
    from posfair.repair.fitting import FitResult, heldout_markdown
    from posfair.repair.heldout import heldout_lines

    h = evaluate_repair(_units([0.8, 0.7, 0.6]), _units([0.8, 0.83, 0.86], seed=1), 3, "planted", 72)
    assert all(e.stock < 0 < e.repaired and e.lean == "reversed" for e in h.positions)
    assert [round(e.removed, 1) for e in h.positions] == [0.7, 0.7]  # what today's decision reads
    limits = RepairLimits(0.9, 1.0)
    failures = check_repair(h, limits)
    res = FitResult("finetune", "bundled", "planted", {"train": (9, 54), "dev": (2, 12)}, {}, h, None, failures,
                    True, 1.0, 1.0, str(tmp_path), limits, fit_families=("fam",))  # fmt: skip
    left = {e.position: f"|β{e.position}| now {100 * (1 - e.removed):.0f} % of stock's, the other way"
            for e in h.positions}  # fmt: skip
    lines = heldout_lines(h)
    for e, line in zip(h.positions, lines, strict=False):
        assert line.startswith(f"β{e.position}: reversed: stock {e.stock:+.4f} -> {e.repaired:+.4f}"), line
        assert left[e.position] in line and "removed" not in line, line
    assert [f for f in failures if f.startswith("β")] == [
        f"β{e.position} reversed beyond noise ({e.repaired:+.4f} [{e.repaired_low:+.4f}, {e.repaired_high:+.4f}]): "
        f"{left[e.position]}; at most 10 % may remain"
        for e in h.positions
    ]
    summary = "\n".join(summary_lines(res))
    md = heldout_markdown([res])
    for text in (summary, md.replace("\\|", "|")):
        assert "removed" not in text and all(words in text for words in left.values()), text
    assert len({row.count("|") - row.count("\\|") for row in md.splitlines()}) == 1  # |β2| does not split a cell
    saved = json.loads(json.dumps(res.to_dict(), default=float))
    assert [e["sign_flipped"] for e in saved["heldout"]["positions"]] == [True, True]
    assert all(e["outcome"].startswith("reversed: ") for e in saved["heldout"]["positions"])
    assert FitResult.from_dict(saved).heldout == h  # heldout.json still reads back
    seen = {}
    monkeypatch.setattr(figure, "finish", lambda fig, **kw: seen.update(kw))
    monkeypatch.setattr(figure, "save_figure", lambda fig, path: b"")
    figure.repair_tradeoff([res], tmp_path / "tradeoff")
    assert left[3] in seen["labels"][0] and "β reversed" in seen["note"]
    # a repair that keeps stock's sign still reads as a share removed
    kept = evaluate_repair(_units([0.8, 0.7, 0.6]), _units([0.8, 0.77, 0.74], seed=1), 3)
    assert all(e.stock < e.repaired < 0 for e in kept.positions)
    for e, line in zip(kept.positions, heldout_lines(kept), strict=False):
        assert f", removed {100 * e.removed:.0f} % [" in line and "reversed" not in line, line


def test_the_verdict_holds_the_title_queries_and_says_which_languages_it_skips(tiny_model_path, tmp_path):
    """Issue 59: title queries (nDCG@10, title -> section) are measures of the held-out table and of the one rule
    (check_repair); a corpus with another language gets the cross-language measures where the model knows the
    language, else a note in the summary and under heldout.md's table, and the fit is still made on English."""
    from posfair.cli.fit import summary_lines
    from posfair.repair.family_benchmark import TITLE_NDCG
    from posfair.repair.fitting import FitResult, fit_repair
    from posfair.repair.queries import TITLE

    path, _ = tiny_model_path("bert-mean")
    corpus = _two_families()
    german = corpus.assign(lang="de", text=corpus["text"].str[::-1], title=corpus["title"].str.upper())
    out = tmp_path / "repaired"
    res = fit_repair(str(path), out, corpus=pd.concat([corpus, german], ignore_index=True), method="tempscale",
                     max_seq_length=128, limits=RepairLimits(0.0, 100.0))  # fmt: skip
    measures = [c.measure for c in res.heldout.retrieval]
    assert measures[:4] == ["recall@1", "own above every foreign", TITLE_NDCG, TITLE], measures
    assert res.translations_found.keys() == {"de"}
    # fitted and judged on the English sections alone: the same sets as an English corpus gives
    from posfair.model import load_model
    from posfair.repair.data import repair_split

    assert res.counts == repair_split(load_model(str(path), max_seq_length=128), corpus, limit=128).counts()
    assert res.failures == check_repair(res.heldout, res.limits)
    # the one rule reads the title measure: planted 3 points down, the repair fails on it, by name
    import dataclasses

    planted = tuple(dataclasses.replace(c, change=-3.0) if c.measure == TITLE else c for c in res.heldout.retrieval)
    failed = check_repair(dataclasses.replace(res.heldout, retrieval=planted), RepairLimits(0.0, 2.0))
    assert f"{TITLE} -3.0 points, beyond the -2-point limit" in failed, failed
    saved = FitResult.from_dict(json.loads((out / "fit" / "heldout.json").read_text()))
    assert [c.measure for c in saved.heldout.retrieval] == measures and saved.notes == res.notes
    assert not res.multilingual  # a random tiny model finds few of the reversed-text "translations"
    assert res.notes and "not a multilingual model" in res.notes[0]
    assert res.notes[0] in (out / "fit" / "heldout.md").read_text()
    assert f"note: {res.notes[0]}" in summary_lines(res)
