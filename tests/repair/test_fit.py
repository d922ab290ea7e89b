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


def test_position_balanced_terms_by_hand():
    from posfair.repair.finetune import position_balanced_terms

    torch.manual_seed(0)
    b, n, d = 4, 3, 8
    docs = F.normalize(torch.randn(b, d, dtype=torch.float64), dim=-1)
    segs = F.normalize(torch.randn(b, n, d, dtype=torch.float64), dim=-1)
    sets = torch.tensor([0, 0, 1, 2])  # rows 0 and 1 share a set: their segments are not negatives of each other
    contrastive, spread = position_balanced_terms(docs, segs, sets, scale=20.0)
    total, count = 0.0, 0
    for i in range(b):
        for p in range(n):
            logits = []
            for j in range(b):
                for q in range(n):
                    if (j, q) == (i, p) or int(sets[j]) != int(sets[i]):
                        logits.append(20.0 * float(docs[i] @ segs[j, q]))
            pos = 20.0 * float(docs[i] @ segs[i, p])
            total += -pos + np.log(np.sum(np.exp(logits)))
            count += 1
    assert float(contrastive) == pytest.approx(total / count, rel=1e-10)
    sigma = np.array([[float(docs[i] @ segs[i, p]) for p in range(n)] for i in range(b)])
    assert float(spread) == pytest.approx(sigma.var(axis=1).mean(), rel=1e-10)


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


def _terms(model, instances):
    """(contrastive, balance) of :class:`PositionBalancedLoss` on every document of ``instances``, no gradient."""
    from posfair.repair.finetune import position_balanced_terms, training_rows

    rows = training_rows(instances)
    n = instances[0].n
    with torch.no_grad():
        docs = torch.as_tensor(model.encode(rows["document"], normalize_embeddings=True))
        segs = torch.stack(
            [torch.as_tensor(model.encode(rows[f"segment_{p}"], normalize_embeddings=True)) for p in range(1, n + 1)],
            dim=1,
        )
    return position_balanced_terms(docs, segs, torch.as_tensor(rows["label"]), 20.0)


def test_finetuning_lowers_its_objective_and_the_saved_folder_reloads_it(tiny_model_path, tmp_path):
    import posfair
    from posfair.repair.data import repair_split
    from posfair.repair.finetune import FinetuneSettings, fit_finetune

    path, _ = tiny_model_path("bert-mean")
    model = posfair.load_model(str(path), max_seq_length=128)
    split = repair_split(model, _two_families(), limit=128)
    before = _terms(model, split.train)
    settings = FinetuneSettings(steps=8, batch_size=8, learning_rate=1e-3, eval_every=4, trained_layers=0.5)
    seen = []
    fit_finetune(model, split.train, split.dev, str(tmp_path / "work"), settings,
                 progress=lambda step, total, value: seen.append((step, total)))  # fmt: skip
    after = _terms(model, split.train)
    # the objective falls on the documents it fits (a random tiny model has next to no position bias to remove:
    # the contrastive term is what moves here; the balance term's effect is the held-out table's business)
    objective = [float(c + settings.balance * b) for c, b in (before, after)]
    assert objective[1] < objective[0] - 0.05, objective
    assert seen and seen[-1][1] == 8
    # only the last half of the layers moved; the embeddings did not
    stock = posfair.load_model(str(path), max_seq_length=128)
    moved = {n for (n, p), (_, q) in zip(model.named_parameters(), stock.named_parameters(), strict=True)
             if not torch.equal(p, q)}  # fmt: skip
    assert moved and all(".layer.2." in n or ".layer.3." in n for n in moved)
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
