"""Seeded tiny *remote-code* encoders: models whose attention bypasses transformers' registry.

:func:`build_remote_model` writes a folder exactly like a hub repository with custom
code (``modeling_posfair_tiny.py`` + ``config.json`` with ``auto_map`` + weights + the
bundled MiniLM tokenizer); tests load it as users load such models::

    posfair.load_model(folder, trust_remote_code=True, pooling="cls")

The architecture is a BERT-style post-norm encoder in the shape of current remote
code (gte-multilingual-base's family): a fused QKV projection, rotary position
embeddings computed once per forward and passed down to every layer, an additive
float attention bias built from the padding mask, and an attention module that
computes its own softmax.  ``attention_kind`` selects how:

``functional``  ``nn.functional.softmax(scores, dim=-1)``
``torch``       ``torch.softmax(scores, -1)``
``method``      ``scores.softmax(dim=-1)``
``module``      an ``nn.Softmax(dim=-1)`` submodule
``sdpa``        ``nn.functional.scaled_dot_product_attention`` with the float bias as
                ``attn_mask`` -- and no mask at all when the batch has no padding
                (gte's ``NewSdpaAttention``).
``packed``      jina-embeddings-v3's shape: one packed ``(B, L, 3, H, D)`` QKV tensor, the
                rotary embedding applied in that ``(B, L, H, D)`` layout, and an inner
                self-attention submodule calling SDPA with a *boolean* key-padding mask.
``unpadded``    gte's ``unpad_inputs``: the padding is removed, the batch's valid tokens are
                concatenated into one ``(1, H, T, D)`` sequence (rotary positions restart per
                text) and SDPA runs with a block-diagonal float mask (gte uses xformers'
                variable-length kernel there).  posfair cannot see per-text attention in that
                layout: a calibrated batch of several texts raises ``TypeError``; a single
                text is one block, calibrated exactly.

All kinds share their weights: with the same seed they are one model.

Each attention module has a ``before_attention`` attribute (None by default): a
callable run as ``before_attention(module, query)`` (query: ``(B, H, L, D)``, after the
rotary embedding) just before the softmax / SDPA call; tests use it to block a forward
inside the attention, or to run extra code there.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from posfair.calibration import STOCK
from posfair.model import bundled_model_path
from reference import reference_calibrate_row, reference_head_strength

KINDS = ("functional", "torch", "method", "module", "sdpa", "packed")
UNPADDED_KIND = "unpadded"  # not in KINDS: calibrates single texts only (see the module docstring)
MODULE_NAME = "modeling_posfair_tiny"

MODELING = '''\
"""A tiny encoder with its own attention (posfair's tests: remote code bypassing the attention registry)."""

import math

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput


class TinyRemoteConfig(PretrainedConfig):
    model_type = "posfair_tiny_remote"

    def __init__(
        self,
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=512,
        type_vocab_size=2,
        rope_theta=10000.0,
        layer_norm_eps=1e-12,
        initializer_range=0.02,
        attention_kind="functional",
        pad_token_id=0,
        **kwargs,
    ):
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.rope_theta = rope_theta
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.attention_kind = attention_kind


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class TinyRotary(nn.Module):
    def __init__(self, dim, theta):
        super().__init__()
        self.dim, self.theta = dim, theta

    def forward(self, length, device):
        inv = 1.0 / (self.theta ** (torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim))
        freqs = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class TinyInnerSelfAttention(nn.Module):
    """jina-v3's inner attention: SDPA on the unbound packed QKV with a boolean key-padding mask."""

    def forward(self, qkv, key_padding_mask=None):
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # (B, H, L, D)
        mask = key_padding_mask[:, None, None, :] if key_padding_mask is not None else None
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class TinyRemoteAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.kind = config.attention_kind
        if self.kind == "module":
            self.softmax = nn.Softmax(dim=-1)
        if self.kind == "packed":
            self.inner_attn = TinyInnerSelfAttention()
        self.before_attention = None

    def forward(self, hidden_states, attention_bias=None, rope=None):
        B, L, _ = hidden_states.shape
        if self.kind == "packed":
            qkv = self.qkv_proj(hidden_states).view(B, L, 3, self.heads, self.head_dim)
            cos, sin = (t[:, None, :] for t in rope)  # (L, 1, D) for the (B, L, H, D) layout
            q, k, v = qkv.unbind(dim=2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if self.before_attention is not None:
                self.before_attention(self, q.transpose(1, 2))
            out = self.inner_attn(torch.stack((q, k, v), dim=2), attention_bias)  # attention_bias: bool (B, L) or None
            return self.o_proj(out.transpose(1, 2).reshape(B, L, -1))
        qkv = self.qkv_proj(hidden_states).view(B, L, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        cos, sin = rope
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.before_attention is not None:
            self.before_attention(self, q)
        if self.kind in ("sdpa", "unpadded"):
            out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_bias, dropout_p=0.0)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            if attention_bias is not None:
                scores = scores + attention_bias
            if self.kind == "functional":
                probs = nn.functional.softmax(scores, dim=-1)
            elif self.kind == "torch":
                probs = torch.softmax(scores, -1)
            elif self.kind == "method":
                probs = scores.softmax(dim=-1)
            else:
                probs = self.softmax(scores)
            out = torch.matmul(probs, v)
        return self.o_proj(out.transpose(1, 2).reshape(B, L, -1))


class TinyRemoteLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyRemoteAttention(config)
        self.attn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states, attention_bias, rope):
        h = self.attn_norm(hidden_states + self.attention(hidden_states, attention_bias, rope))
        return self.mlp_norm(h + self.down(nn.functional.gelu(self.up(h))))


class TinyRemotePreTrainedModel(PreTrainedModel):
    config_class = TinyRemoteConfig
    base_model_prefix = "tiny"

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class TinyRemoteModel(TinyRemotePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.emb_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.rotary = TinyRotary(config.hidden_size // config.num_attention_heads, config.rope_theta)
        self.layers = nn.ModuleList([TinyRemoteLayer(config) for _ in range(config.num_hidden_layers)])
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embeddings

    def set_input_embeddings(self, value):
        self.word_embeddings = value

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, return_dict=True, **kwargs):
        B, L = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.emb_norm(self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids))
        kind = self.config.attention_kind
        if kind == "unpadded" and attention_mask is not None:
            return BaseModelOutput(last_hidden_state=self._unpadded(x, attention_mask.bool()))
        rope = tuple(t.to(x.dtype) for t in self.rotary(L, x.device))
        bias = None
        if kind == "packed":
            bias = attention_mask.bool() if attention_mask is not None else None
        elif attention_mask is not None and (kind not in ("sdpa", "unpadded") or not bool(attention_mask.bool().all())):
            bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, bias, rope)
        return BaseModelOutput(last_hidden_state=x)

    def _unpadded(self, x, mask):
        """gte's unpad_inputs: every valid token in one sequence, attention within each text only."""
        lengths = mask.sum(1).tolist()
        flat = x[mask][None]  # (1, T, hidden)
        cos, sin = self.rotary(max(lengths), x.device)
        pos = torch.cat([torch.arange(n, device=x.device) for n in lengths])  # positions restart per text
        rope = (cos[pos].to(x.dtype), sin[pos].to(x.dtype))
        bias = None
        if len(lengths) > 1:
            seq = torch.repeat_interleave(torch.arange(len(lengths), device=x.device), torch.tensor(lengths, device=x.device))
            bias = torch.where(seq[:, None] == seq[None, :], 0.0, torch.finfo(x.dtype).min).to(x.dtype)[None, None]
        for layer in self.layers:
            flat = layer(flat, bias, rope)
        out = torch.zeros_like(x)
        out[mask] = flat[0]
        return out
'''


def _import_modeling(folder: Path):
    name = f"_posfair_test_{MODULE_NAME}_{abs(hash(str(folder)))}"
    spec = importlib.util.spec_from_file_location(name, folder / f"{MODULE_NAME}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def build_remote_model(
    folder: Path,
    attention_kind: str = "functional",
    seed: int = 0,
    initializer_range: float = 0.15,
    model_type: str = "posfair_tiny_remote",
    **config,
) -> Path:
    """Write a tiny remote-code model (hidden 64, 4 layers, 4 heads) to ``folder``; returns the folder.

    ``initializer_range`` is larger than BERT's 0.02 so attention rows are far from
    uniform and calibration at different strengths gives clearly different embeddings.
    ``model_type``: what its config declares (gte's remote code declares ``"new"``, jina-v3's ``"xlm-roberta"``).
    """
    if attention_kind not in (*KINDS, UNPADDED_KIND):
        raise ValueError(f"attention_kind must be one of {(*KINDS, UNPADDED_KIND)}; got {attention_kind!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{MODULE_NAME}.py").write_text(
        MODELING.replace('model_type = "posfair_tiny_remote"', f"model_type = {model_type!r}")
    )
    mod = _import_modeling(folder)
    cfg = mod.TinyRemoteConfig(attention_kind=attention_kind, initializer_range=initializer_range, **config)
    cfg.auto_map = {"AutoConfig": f"{MODULE_NAME}.TinyRemoteConfig", "AutoModel": f"{MODULE_NAME}.TinyRemoteModel"}
    cfg.architectures = ["TinyRemoteModel"]
    torch.manual_seed(seed)
    model = mod.TinyRemoteModel(cfg).eval()
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(bundled_model_path()).save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------------------------
# The independent slow reference for these models
# --------------------------------------------------------------------------------------------


def _reference_forward(module, layer: int, resolved):
    """A float64 replacement for one ``TinyRemoteAttention.forward``, written from the architecture:
    explicit eager weights from the module's own parameters, the chosen rows calibrated with the loop
    reference (``tests/reference.py``), then ``@ V`` and the output projection."""

    def forward(hidden_states, attention_bias=None, rope=None):
        B, L, _ = hidden_states.shape
        H, D = module.heads, module.head_dim
        x = hidden_states.double()
        qkv = x @ module.qkv_proj.weight.double().T + module.qkv_proj.bias.double()
        qkv = qkv.view(B, L, 3, H, D)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, L, D)
        cos, sin = (t.double() for t in rope)

        def rotate(t):
            half = D // 2
            return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

        q, k = rotate(q), rotate(k)
        scores = q @ k.transpose(-1, -2) / D**0.5
        if attention_bias is None:
            valid = torch.ones(B, L, dtype=torch.bool)
        elif attention_bias.dtype == torch.bool:  # the packed kind's key-padding mask (B, L)
            valid = attention_bias
            scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        else:
            scores = scores + attention_bias.double()
            valid = attention_bias.reshape(B, L) == 0
        w = torch.softmax(scores, dim=-1).numpy().copy()
        T = getattr(resolved, "temperature", None)
        tempered = None if T is None else torch.softmax(scores / T, dim=-1).numpy()  # TempScale, from the scores
        if resolved is not None and layer in resolved.layers:
            for b in range(B):
                pos = valid[b].nonzero().flatten()
                s, e = int(pos[0]), int(pos[-1])
                rows = range(s, e + 1) if resolved.queries == "all" else [e if resolved.pooling == "lasttoken" else s]
                content = (e - s + 1) - int(resolved.isolate_bos) - int(resolved.isolate_eos)
                for h in range(H):
                    for r in rows:
                        if tempered is not None and content >= resolved.basket_size:
                            w[b, h, r] = tempered[b, h, r]
                        w[b, h, r] = reference_calibrate_row(
                            w[b, h, r], s, e, resolved.basket_size, reference_head_strength(resolved, layer, h),
                            resolved.isolate_bos, resolved.isolate_eos, resolved.bos_weight, resolved.eos_weight,
                            trailing=resolved.trailing,
                        )  # fmt: skip
        out = (torch.from_numpy(w) @ v).transpose(1, 2).reshape(B, L, H * D)
        out = out @ module.o_proj.weight.double().T + module.o_proj.bias.double()
        return out.to(hidden_states.dtype)

    return forward


def attention_modules(model) -> list:
    """The attention module of each layer of a loaded tiny remote-code FairModel."""
    return [layer.attention for layer in model.transformer_module.auto_model.layers]


def reference_encode(model, texts, resolved, **encode_kwargs):
    """Embeddings of ``texts`` with every attention replaced by the float64 reference calibrated
    with ``resolved`` (None = the reference stock model); the model's own code does the rest."""
    mods = attention_modules(model)
    for i, mod in enumerate(mods):
        mod.forward = _reference_forward(mod, i, resolved)
    try:
        return model.encode(texts, calibration=STOCK, **encode_kwargs)
    finally:
        for mod in mods:
            del mod.forward


def assert_every_kind_matches_the_reference(remote_model, pooling: str, texts, cal, atol: float = 1e-5) -> None:
    """Each remote-code kind, encoding ``texts`` with ``cal`` through posfair, == the functional kind's float64
    reference (``remote_model``: the conftest fixture building a kind with a pooling)."""
    import numpy as np

    ref_model = remote_model("functional", pooling)
    ref = reference_encode(ref_model, texts, ref_model.transformer_module.resolve(cal), batch_size=len(texts))
    for kind in KINDS:
        got = remote_model(kind, pooling).encode(texts, calibration=cal, batch_size=len(texts))
        np.testing.assert_allclose(got, ref, atol=atol, rtol=0, err_msg=f"{kind} {cal.label()}")
