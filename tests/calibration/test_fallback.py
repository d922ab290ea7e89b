"""Models whose attention bypasses transformers' registry (remote code computing its own softmax)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import posfair
from posfair import Calibration
from posfair.attention.profile import attention_profile
from posfair.calibration import STOCK


class OwnSoftmaxAttention(nn.Module):
    """A self-attention written like remote-code models: its own softmax, no AttentionInterface."""

    def __init__(self, stock, use_sdpa: bool = False):
        super().__init__()
        self.query, self.key, self.value = stock.query, stock.key, stock.value
        self.head = stock.attention_head_size
        self.use_sdpa = use_sdpa

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        B, L, _ = hidden_states.shape
        q, k, v = (
            m(hidden_states).view(B, L, -1, self.head).transpose(1, 2) for m in (self.query, self.key, self.value)
        )
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = torch.where(attention_mask, 0.0, torch.finfo(torch.float32).min)
        if self.use_sdpa:
            out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        else:
            scores = q @ k.transpose(-1, -2) / self.head**0.5
            if attention_mask is not None:
                scores = scores + attention_mask
            out = torch.softmax(scores, dim=-1) @ v
        return out.transpose(1, 2).reshape(B, L, -1), None


class NoSoftmaxAttention(OwnSoftmaxAttention):
    """Normalises with exp/sum by hand: nothing posfair could intercept."""

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        B, L, _ = hidden_states.shape
        q, k, v = (
            m(hidden_states).view(B, L, -1, self.head).transpose(1, 2) for m in (self.query, self.key, self.value)
        )
        w = torch.exp(q @ k.transpose(-1, -2) / self.head**0.5)
        return ((w / w.sum(-1, keepdim=True)) @ v).transpose(1, 2).reshape(B, L, -1), None


def load_with(tiny_model_path, cls, **kw):
    path, pooling = tiny_model_path("bert")
    model = posfair.load_model(path, pooling=pooling)
    for layer in model.transformer_module.auto_model.encoder.layer:
        layer.attention.self = cls(layer.attention.self, **kw)
    model.transformer_module.reprobe()  # modules were swapped after loading: probe again
    return model


TEXTS = ["one two three four five six seven eight nine ten eleven twelve " * 4, "a b c d e f g h i j k l m n o p"]
CAL = Calibration(basket_size=8, layers=0.5, strength=0.8)


@pytest.mark.parametrize("use_sdpa", [False, True])
def test_fallback_matches_registry_path(tiny_model_path, use_sdpa):
    path, pooling = tiny_model_path("bert")
    registry = posfair.load_model(path, pooling=pooling)
    custom = load_with(tiny_model_path, OwnSoftmaxAttention, use_sdpa=use_sdpa)
    stock_custom = custom.encode(TEXTS)
    assert custom.mechanism == "fallback"
    torch.testing.assert_close(
        torch.from_numpy(stock_custom), torch.from_numpy(registry.encode(TEXTS)), atol=1e-5, rtol=0
    )
    got = custom.encode(TEXTS, calibration=CAL)
    want = registry.encode(TEXTS, calibration=CAL)
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(want), atol=1e-5, rtol=0)
    assert abs(got - stock_custom).max() > 1e-3


def test_fallback_mean_pooling_all_rows(tiny_model_path):
    path, _ = tiny_model_path("bert")
    registry = posfair.load_model(path, pooling="mean")
    custom = load_with(tiny_model_path, OwnSoftmaxAttention)
    custom._posfair_setup("mean", None, None)
    torch.testing.assert_close(
        torch.from_numpy(custom.encode(TEXTS, calibration=CAL)),
        torch.from_numpy(registry.encode(TEXTS, calibration=CAL)),
        atol=1e-5,
        rtol=0,
    )


def test_unsupported_attention_is_an_error_naming_the_class(tiny_model_path):
    model = load_with(tiny_model_path, NoSoftmaxAttention)
    model.encode(TEXTS)  # stock encoding is unaffected
    with pytest.raises(TypeError, match=r"cannot calibrate BertModel"):
        model.encode(TEXTS, calibration=CAL)


# -- the attention profile's recorder on the fallback path ---------------------------------------------


def record_rows(model, texts, calibration, queries):
    """{layer: [rows, ...]} recorded in one forward pass (every call kept, to count them)."""
    calls: dict[int, list[torch.Tensor]] = {}
    features = model.tokenize(texts)
    with (
        torch.no_grad(),
        model.using(calibration),
        model.recording_attention(
            lambda layer, rows: calls.setdefault(layer, []).append(rows.clone()),
            range(model.num_layers),
            queries=queries,
        ),
    ):
        model(features)
    return calls, features


@pytest.mark.parametrize("queries", ["pool", "all"])
@pytest.mark.parametrize("calibration", [STOCK, CAL], ids=["stock", "calibrated"])
@pytest.mark.parametrize("use_sdpa", [False, True])
def test_fallback_records_each_layer_once_and_as_the_registry_path(tiny_model_path, use_sdpa, calibration, queries):
    path, pooling = tiny_model_path("bert")
    registry = posfair.load_model(path, pooling=pooling)
    custom = load_with(tiny_model_path, OwnSoftmaxAttention, use_sdpa=use_sdpa)
    want, _ = record_rows(registry, TEXTS, calibration, queries)
    got, features = record_rows(custom, TEXTS, calibration, queries)
    assert custom.mechanism == "fallback"
    B, K = features["input_ids"].shape
    assert sorted(got) == list(range(custom.num_layers))
    for layer, rows in got.items():
        assert len(rows) == 1, f"layer {layer} recorded {len(rows)} times"
        assert rows[0].shape == (B, 4, K) and rows[0].dtype == torch.float32  # (batch, heads, keys)
        torch.testing.assert_close(rows[0], want[layer][0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["functional", "module", "sdpa"])
def test_attention_profile_on_a_remote_code_model(remote_model, kind):
    model = remote_model(kind, "cls")
    for queries in ("pool", "all"):
        got, _ = record_rows(model, TEXTS, CAL, queries)
        assert {layer: len(r) for layer, r in got.items()} == {layer: 1 for layer in range(model.num_layers)}
    profile = attention_profile(model, TEXTS, basket_size=8, calibration=CAL, batch_size=2)
    assert profile.num_layers == model.num_layers


def test_the_route_is_a_typed_state():
    """Where a module stands in finding its attention route is a Route (not a string compared by spelling): a BERT
    model probes to the registry on transformers 5.x; reprobe forgets it; a copy of a checked fallback goes back to
    FALLBACK, its interception to be found again."""
    import copy

    import posfair
    from posfair.calibration.backends import FALLBACK
    from posfair.model.calibrated_transformer import Route
    from posfair.model.compat import TRANSFORMERS_5

    model = posfair.load_model()
    tm = model.transformer_module
    want = "fallback" if tm.backend_row.route(TRANSFORMERS_5) == FALLBACK else "registry"
    assert tm.mechanism == want
    assert tm.route is (Route.REGISTRY if want == "registry" else Route.FALLBACK_CHECKED)
    tm.reprobe()
    assert tm.route is Route.UNPROBED and tm.mechanism == want
    tm._route = Route.FALLBACK_CHECKED  # as a checked fallback: its copy finds its interception again
    assert copy.deepcopy(tm).route is Route.FALLBACK
