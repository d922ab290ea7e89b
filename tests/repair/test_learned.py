"""posfair.repair.learned on a seeded tiny model with a planted positional bias: the objective falls, the fitted
per-head strengths reach the saved folder, the gradients the fit follows match central finite differences of the
same objective on the float64 reference path (tests/reference.py), TempScale's choice is the dev minimum."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import posfair
from posfair import Calibration
from posfair.model.calibrated_transformer import calibration_override
from posfair.repair.learned import SigmaObjective, TextBatch, embed, fit_learned, fit_tempscale
from reference import reference_mode

WORDS = (
    "river mountain paper window garden music school summer doctor market engine silver castle forest letter "
    "island table coffee winter bridge"
).split()


def instances(n_sets: int, seed: int, n: int = 3):
    """Sets of ``n`` random-word segments, every ordering a document (duck-typed ``Instance``)."""
    rng = random.Random(seed)
    docs = []
    for s in range(n_sets):
        segs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 12))) + "." for _ in range(n)]
        for perm in itertools.permutations(range(n)):
            texts = tuple(segs[i] for i in perm)
            ids = tuple(f"{seed}-{s}-{i}" for i in perm)
            docs.append(SimpleNamespace(text=" ".join(texts), texts=texts, segment_ids=ids, set_id=f"{seed}-{s}"))
    return [SimpleNamespace(documents=docs)]


def plant_bias(model, alpha: float = 6.0, gain: float = 5.0) -> None:
    """A positional bias toward the first 12 tokens: their position embeddings carry a direction ``p`` that no
    value sees and every layer's queries look for (``alpha`` nats), with the attention outputs scaled by ``gain`` so
    attention moves the embedding."""
    am = model.transformer_module.auto_model
    with torch.no_grad():
        p = torch.randn(am.config.hidden_size, generator=torch.Generator().manual_seed(1))
        p = 0.3 * p / p.norm()
        am.embeddings.position_embeddings.weight[:12] += p
        ph = p / p.norm()
        for layer in am.encoder.layer:
            a = layer.attention.self
            a.value.weight -= torch.outer(a.value.weight @ ph, ph)
            kp = a.key.weight @ ph
            a.query.bias += alpha * kp / kp.norm() ** 2
            a.value.weight *= gain
            layer.attention.output.dense.weight *= gain


@pytest.fixture
def planted(tiny_model_path):
    path, pooling = tiny_model_path("bert-mean")
    model = posfair.load_model(path, pooling=pooling)
    plant_bias(model)
    return model


def test_the_objective_falls_on_a_planted_bias_and_the_fit_reloads(planted, tmp_path):
    train, dev = instances(3, 1), instances(2, 2)
    seen = []
    cal = fit_learned(planted, train, dev, basket_size=4, layers=0.5, steps=8, lr=0.5, eval_every=4,
                      progress=lambda *a: seen.append(a))  # fmt: skip
    assert [s[:2] for s in seen] == [(i, 8) for i in range(1, 9)] and all(np.isfinite(s[2]) for s in seen)
    assert cal.basket_size == 4 and [i for i, _ in cal.head_strengths] == [2, 3]
    assert all(len(v) == 4 and all(0 <= x <= 1 for x in v) for _, v in cal.head_strengths)
    # the dev objective (stock = 1): the planted bias is partly removed, better than the starting strengths
    from posfair.repair import learned

    obj = SigmaObjective()
    _, split = learned._prepare(planted, train, dev, cal, docs_per_set=6, sets_per_batch=4, objective=obj,
                                batch_size=16, seed=0)  # fmt: skip
    start = Calibration(4, (2, 3), 0.5, head_strengths={2: (0.5,) * 4, 3: (0.5,) * 4})
    fitted, initial = (learned._evaluate(planted, split, obj, c, 16) for c in (cal, start))
    stock = learned._evaluate(planted, split, obj, None, 16)
    assert stock == pytest.approx(1.0, abs=1e-6)
    assert fitted < initial < 1.0 and fitted < 0.8, (fitted, initial)
    # saved as plain numbers, reloaded with the same vectors and embeddings
    want = planted.encode([d.text for d in dev[0].documents], calibration=cal)
    planted.set_calibration(cal).save(str(tmp_path / "fitted"))
    saved = json.loads((tmp_path / "fitted" / "config.json").read_text())["posfair_calibration"]
    assert saved["head_strengths"] == {str(i): list(v) for i, v in cal.head_strengths}
    again = posfair.load_model(str(tmp_path / "fitted"))
    assert again.calibration == cal
    np.testing.assert_allclose(again.encode([d.text for d in dev[0].documents]), want, atol=1e-6)


def _reference_embed(model, texts, cal):
    features = model.tokenize(list(texts))
    with torch.no_grad(), reference_mode(model, model.transformer_module.resolve(cal), features["attention_mask"]):
        return model(model.tokenize(list(texts)))["sentence_embedding"]


def test_gradients_match_central_differences_on_the_float64_reference(planted):
    model = planted.double()
    batch = TextBatch.of(instances(1, 3)[0].documents)
    obj = SigmaObjective(tau=0.1, balance_scale=1e-4)  # the planted model's stock balance is of that order
    zero = torch.zeros(len(batch.pair_doc), dtype=torch.float64)  # ce_stock 0: the keep term is the mean ce
    layers, H = (2, 3), 4
    base = torch.tensor([[0.3, 0.6, 0.8, 0.45], [0.7, 0.2, 0.5, 0.9]], dtype=torch.float64)

    def cal_of(values):
        return Calibration(
            4, layers, 0.5, head_strengths={i: tuple(map(float, v)) for i, v in zip(layers, values, strict=True)}
        )

    template = cal_of(base)
    tm = model.transformer_module
    strengths = base.clone().requires_grad_(True)
    resolved = tm.resolve(template)
    tracked = replace(resolved, head_strengths=tuple((i, strengths[k]) for k, i in enumerate(layers)))
    with torch.enable_grad(), tm.resolving(template, tracked), calibration_override(template):
        sig, ce = obj.parts(embed(model, batch.docs, None), embed(model, batch.segs, None), batch)
        loss = obj.value(sig, batch.pair_pos, ce, zero)
    loss.backward()

    def reference_value(values):
        cal = cal_of(values)
        s, c = obj.parts(_reference_embed(model, batch.docs, cal), _reference_embed(model, batch.segs, cal), batch)
        return float(obj.value(s, batch.pair_pos, c, zero))

    assert float(loss.detach()) == pytest.approx(reference_value(base), rel=1e-5)
    eps = 1e-3
    fd = torch.zeros_like(base)
    for k, h in itertools.product(range(len(layers)), range(H)):
        up, down = base.clone(), base.clone()
        up[k, h] += eps
        down[k, h] -= eps
        fd[k, h] = (reference_value(up) - reference_value(down)) / (2 * eps)
    scale = float(fd.abs().max())
    assert scale > 1e-4  # the strengths matter
    torch.testing.assert_close(strengths.grad, fd, atol=2e-3 * scale, rtol=1e-2)


def test_the_objective_encodes_as_encode_does(planted):
    texts = [d.text for d in instances(1, 4)[0].documents] + ["a short text"]
    for cal in (posfair.STOCK, Calibration(4, 0.5, 0.7, head_strengths={2: (0.0, 1.0, 0.5, 0.2)}, temperature=0.8)):
        with torch.no_grad(), planted.using(cal):
            got = embed(planted, texts, batch_size=3).numpy()
        np.testing.assert_allclose(got, planted.encode(texts, calibration=cal), atol=1e-6)


def test_tempscale_picks_the_dev_minimum_and_one_is_stock(planted):
    seen = []
    cal = fit_tempscale(planted, instances(2, 1), instances(2, 2), temperatures=(0.5, 1.0, 2.0), layers=0.5,
                        progress=lambda *a: seen.append(a))  # fmt: skip
    values = {t: v for (_, _, v), t in zip(seen, (0.5, 1.0, 2.0), strict=True)}
    assert values[1.0] == pytest.approx(1.0, abs=1e-5)  # T = 1 encodes stock
    assert cal.temperature == min(values, key=values.get) and cal.strength == 0.0
    assert len(set(values.values())) == 3
