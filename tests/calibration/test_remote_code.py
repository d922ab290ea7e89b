"""The fallback backend on remote-code models loaded as users load them (``trust_remote_code=True``):
every softmax spelling and SDPA call is calibrated exactly once, against the independent float64
reference, at several strengths, CLS and mean pooling, in a padded batch."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from posfair import Calibration
from posfair.calibration import STOCK, fallback
from reference import reference_calibrate_row
from remote_code_models import KINDS, UNPADDED_KIND, attention_modules, reference_encode

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def text(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, n_words))


TEXTS = [text(70, 1), text(12, 2), text(45, 3)]  # mixed lengths: a padded batch
UNPADDED = [text(40, 4), " ".join(reversed(text(40, 4).split()))]  # same words reordered: same token count
STRENGTHS = (0.25, 0.5, 0.75, 1.0)
POOLINGS = ("cls", "mean")  # mean pooling calibrates every valid query row (queries="all")
ATOL = 1e-5


def cal(strength: float) -> Calibration:
    return Calibration(basket_size=8, layers=0.75, strength=strength)


_REFERENCE: dict = {}


def reference(remote_model, pooling: str, strength: float | None, texts=TEXTS) -> np.ndarray:
    """The float64 reference embeddings (cached: every kind has the same weights, see test_all_kinds_are_one_model)."""
    key = (pooling, strength, tuple(texts))
    if key not in _REFERENCE:
        model = remote_model("functional", pooling)
        resolved = model.transformer_module.resolve(cal(strength)) if strength is not None else None
        _REFERENCE[key] = reference_encode(model, texts, resolved, batch_size=len(texts))
    return _REFERENCE[key]


@pytest.mark.parametrize("pooling", POOLINGS)
def test_all_kinds_are_one_model(remote_model, pooling):
    """The five attention spellings share their weights: one reference serves them all."""
    ref = reference(remote_model, pooling, None)
    for kind in KINDS:
        model = remote_model(kind, pooling)
        assert model.mechanism == "fallback"
        np.testing.assert_allclose(
            model.encode(TEXTS, calibration=STOCK, batch_size=len(TEXTS)), ref, atol=ATOL, rtol=0
        )


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("kind", KINDS)
def test_calibrated_equals_independent_reference(remote_model, kind, pooling):
    model = remote_model(kind, pooling)
    stock = model.encode(TEXTS, calibration=STOCK, batch_size=len(TEXTS))
    for strength in STRENGTHS:
        got = model.encode(TEXTS, calibration=cal(strength), batch_size=len(TEXTS))
        np.testing.assert_allclose(
            got, reference(remote_model, pooling, strength), atol=ATOL, rtol=0, err_msg=f"strength {strength}"
        )
        assert np.abs(got - stock).max() > 1e-3  # calibration really changed the embeddings


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("kind", KINDS)
def test_calibration_is_applied_once_not_twice(remote_model, kind, pooling):
    """Applied twice, strength a acts as 1 - (1 - a)^2: 0.5 would equal the reference at 0.75."""
    got = remote_model(kind, pooling).encode(TEXTS, calibration=cal(0.5), batch_size=len(TEXTS))
    assert np.abs(got - reference(remote_model, pooling, 0.75)).max() > 1e-3
    np.testing.assert_allclose(got, reference(remote_model, pooling, 0.5), atol=ATOL, rtol=0)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_unpadded_inputs_calibrate_single_texts_and_refuse_batches(remote_model, pooling):
    """gte's unpad_inputs shape: all valid tokens of a batch in one sequence with a block-diagonal mask.
    One text is one block (calibrated exactly); several texts cannot be told apart by posfair, so a
    calibrated batch raises TypeError naming the class instead of returning wrong numbers."""
    model = remote_model(UNPADDED_KIND, pooling)
    assert model.mechanism == "fallback"
    # the same model as the padded kinds: stock embeddings of a padded batch agree
    np.testing.assert_allclose(
        model.encode(TEXTS, calibration=STOCK, batch_size=len(TEXTS)),
        reference(remote_model, pooling, None),
        atol=ATOL,
        rtol=0,
    )
    for strength in STRENGTHS:
        for t in (TEXTS[0], TEXTS[2]):
            got = model.encode([t], calibration=cal(strength), batch_size=1)
            np.testing.assert_allclose(
                got, reference(remote_model, pooling, strength, [t]), atol=ATOL, rtol=0, err_msg=f"strength {strength}"
            )
    with pytest.raises(TypeError, match=r"cannot calibrate TinyRemoteModel.*layers without a hit"):
        model.encode(TEXTS, calibration=cal(0.5), batch_size=len(TEXTS))


@pytest.mark.parametrize("pooling", POOLINGS)
def test_sdpa_without_a_mask_on_an_unpadded_batch(remote_model, pooling):
    model = remote_model("sdpa", pooling)
    assert bool(model.tokenize(UNPADDED)["attention_mask"].all())  # no padding: the model passes attn_mask=None
    seen = []

    def watch(module, query):
        seen.append(query.shape)

    mods = attention_modules(model)
    mods[-1].before_attention = watch
    try:
        got = model.encode(UNPADDED, calibration=cal(0.5), batch_size=len(UNPADDED))
    finally:
        mods[-1].before_attention = None
    assert seen, "the SDPA attention did not run"
    np.testing.assert_allclose(got, reference(remote_model, pooling, 0.5, UNPADDED), atol=ATOL, rtol=0)
    assert np.abs(got - reference(remote_model, pooling, None, UNPADDED)).max() > 1e-3


@pytest.mark.parametrize("kind", ["functional", "sdpa"])
def test_other_softmaxes_in_the_attention_module_pass_through(remote_model, kind):
    """Inside a calibrated attention module, softmaxes that are not the attention (another dim, another
    shape) return exactly the stock values and are not counted as the attention call."""
    model = remote_model(kind, "cls")
    gen = torch.Generator().manual_seed(0)
    probes = {}

    def check(module, query):
        B, H, L, _ = query.shape
        x = torch.randn(B, H, L, L, generator=gen) if "x" not in probes else probes["x"]
        probes["x"] = x
        results = [
            torch.softmax(x, dim=1),
            torch.nn.functional.softmax(x, dim=2),
            x.softmax(0),
            torch.softmax(x[..., :-1], -1),  # keys != tokens
            torch.softmax(x[:, :, :1], -1),  # one query row
            torch.softmax(x.double()[0], -1),  # 3-D
        ]
        probes.setdefault("got", []).append(results)

    mods = attention_modules(model)
    mods[-1].before_attention = check
    try:
        got = model.encode(TEXTS, calibration=cal(0.5), batch_size=len(TEXTS))
    finally:
        mods[-1].before_attention = None
    x = probes["x"]
    want = [torch.softmax(x, 1), torch.softmax(x, 2), torch.softmax(x, 0), torch.softmax(x[..., :-1], -1),
            torch.softmax(x[:, :, :1], -1), torch.softmax(x.double()[0], -1)]  # fmt: skip
    for a, b in zip(probes["got"][0], want, strict=True):
        assert torch.equal(a, b)
    np.testing.assert_allclose(got, reference(remote_model, "cls", 0.5), atol=ATOL, rtol=0)


def test_a_second_attention_shaped_softmax_is_an_error_not_a_guess(remote_model):
    model = remote_model("functional", "cls")

    def extra(module, query):
        torch.softmax(query @ query.transpose(-1, -2), dim=-1)  # (B, H, L, L) over the last dim: looks like attention

    mods = attention_modules(model)
    mods[-1].before_attention = extra
    try:
        with pytest.raises(TypeError, match=r"cannot calibrate TinyRemoteModel.*ambiguous"):
            model.encode(TEXTS, calibration=cal(0.5))
        model.encode(TEXTS, calibration=STOCK)  # stock encoding does not look
    finally:
        mods[-1].before_attention = None
    got = model.encode(TEXTS, calibration=cal(0.5), batch_size=len(TEXTS))
    np.testing.assert_allclose(got, reference(remote_model, "cls", 0.5), atol=ATOL, rtol=0)


def test_an_attention_that_is_not_recognised_in_a_forward_is_an_error(remote_model):
    """If the attention cannot be recognised in some forward (here: it is skipped), the calibrated
    encode fails instead of returning stock numbers for that layer."""
    model = remote_model("functional", "cls")
    mods = attention_modules(model)
    last = mods[-1]
    last.forward = lambda hidden_states, attention_bias=None, rope=None: torch.zeros_like(hidden_states)
    try:
        with pytest.raises(TypeError, match=r"cannot calibrate TinyRemoteModel.*layers without a hit: \[3\]"):
            model.encode(TEXTS, calibration=cal(0.5))
    finally:
        del last.forward


@pytest.mark.parametrize("kind", ["functional", "sdpa"])
def test_bfloat16_calibrates_in_float32_and_keeps_the_dtype(remote_model, kind):
    """A bf16 model: the intercepted weights go back in bf16 (else ``probs @ V`` would fail) and the
    pooling row is the float64 loop reference applied once to the stock row, up to bf16 rounding.
    Only the last layer is calibrated, so its input is the stock one."""
    model = copy.deepcopy(remote_model(kind, "cls")).to(torch.bfloat16)
    c = Calibration(basket_size=8, layers=(3,), strength=0.5)
    resolved = model.transformer_module.resolve(c)
    features = model.tokenize(TEXTS)
    mask = features["attention_mask"].bool()
    rows = {}

    def run(calibration):
        with (
            torch.no_grad(),
            model.using(calibration),
            model.recording_attention(lambda layer, r: rows.__setitem__(layer, r), [3]),
        ):
            out = model(dict(features))["sentence_embedding"]
        return out, rows.pop(3)

    _, stock_row = run(STOCK)
    out, got = run(c)
    assert out.dtype == torch.bfloat16 and got.dtype == torch.float32
    for strength, close in ((0.5, True), (0.75, False)):
        want = np.zeros(got.shape)
        for b in range(got.shape[0]):
            s, e = int(mask[b].nonzero()[0]), int(mask[b].nonzero()[-1])
            for h in range(got.shape[1]):
                want[b, h] = reference_calibrate_row(
                    stock_row[b, h].double().numpy(), s, e, 8, strength, resolved.isolate_bos, resolved.isolate_eos,
                    resolved.bos_weight, resolved.eos_weight,
                )  # fmt: skip
        err = np.abs(got.double().numpy() - want).max()
        assert (err < 4e-3) if close else (err > 1e-2), (strength, err)


def test_copies_keep_one_set_of_hooks_and_calibrate_alike(remote_model):
    model = remote_model("functional", "cls")
    want = model.encode(TEXTS, calibration=cal(0.5), batch_size=len(TEXTS))
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        np.testing.assert_allclose(
            clone.encode(TEXTS, calibration=cal(0.5), batch_size=len(TEXTS)), want, atol=1e-6, rtol=0
        )
        for mod in attention_modules(clone):
            assert list(mod._forward_pre_hooks.values()).count(fallback._pre_hook) == 1
            assert list(mod._forward_hooks.values()).count(fallback._post_hook) == 1


class _Spy(TorchFunctionMode):
    """Counts, below posfair's own mode, SDPA calls and every (tokens x tokens) tensor produced."""

    def __init__(self, length: int):
        super().__init__()
        self.length, self.sdpa, self.square = length, 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.sdpa += func is torch.nn.functional.scaled_dot_product_attention
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-2:] == (self.length, self.length):
                self.square += 1
        return out


@pytest.mark.parametrize(
    ("pooling", "fused_path", "square"), [("cls", True, False), ("mean", True, False), ("mean", False, True)]
)
def test_intercepted_sdpa_runs_the_stock_kernel_plus_one_row(remote_model, monkeypatch, pooling, fused_path, square):
    """CLS pooling: the stock SDPA kernel runs for all rows in every layer and the pooling row is the only
    explicit work (no tokens x tokens matrix); mean pooling (every row calibrated) computes the calibrated
    layers with the fused per-basket kernel (posfair.calibration.fused: no tokens x tokens matrix either),
    or, with it switched off, explicitly in tiles."""
    import posfair.calibration.fused as fused

    monkeypatch.setattr(fused, "ENABLED", fused_path)
    model = remote_model("sdpa", pooling)
    assert model.mechanism == "fallback"  # probed before counting
    features = model.tokenize(TEXTS)
    spy = _Spy(features["input_ids"].shape[1])
    with torch.no_grad(), model.using(cal(0.5)), spy:
        model(features)
    n_layers, n_calibrated = model.num_layers, len(model.transformer_module.resolve(cal(0.5)).layers)
    assert spy.sdpa == (n_layers if pooling == "cls" else n_layers - n_calibrated)
    assert (spy.square > 0) == square
