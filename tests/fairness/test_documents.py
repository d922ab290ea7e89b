import math

import numpy as np
import pandas as pd
import pytest

from posfair.fairness.documents import (
    LanguageConfig,
    build_instance,
    prepare_corpus,
    token_segment_index,
)
from posfair.model.token_spans import join_segments


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from posfair.model import bundled_model_path

    return AutoTokenizer.from_pretrained(bundled_model_path())


@pytest.fixture(autouse=True)
def _corpus(make_corpus):
    global tiny_corpus
    tiny_corpus = make_corpus


def _build(tokenizer, n=3, cfg="en", target=12, limit=512, **kw):
    kw.setdefault("min_segment_tokens", 1)
    kw.setdefault("max_segment_tokens", 200)
    return build_instance(
        prepare_corpus(tiny_corpus()),
        n,
        LanguageConfig.parse(cfg),
        tokenizer=tokenizer,
        limit=limit,
        target_docs=target,
        **kw,
    )


@pytest.mark.parametrize("n,target", [(2, 5), (3, 12), (4, 30)])
def test_permutation_counts(tokenizer, n, target):
    inst = _build(tokenizer, n=n, target=target)
    n_sets = math.ceil(target / math.factorial(n))
    assert len(inst.sets) == n_sets
    assert len(inst.documents) == n_sets * math.factorial(n)
    for s in inst.sets:
        docs = [d for d in inst.documents if d.set_id == s.set_id]
        assert len(docs) == math.factorial(n)
        assert len({d.permutation for d in docs}) == math.factorial(n)
        assert len({d.text for d in docs}) == math.factorial(n)
        for d in docs:  # the set's topics, permuted
            assert d.topics == tuple(s.topics[k] for k in d.permutation)
            assert sorted(d.topics) == sorted(s.topics)
    assert len({frozenset(s.topics) for s in inst.sets}) == len(inst.sets)
    assert inst.report.documents == len(inst.documents)


def test_positions_spans_and_languages(tokenizer):
    corpus = prepare_corpus(tiny_corpus())
    text = {(r.id, r.lang): r.text for r in corpus.itertuples()}
    inst = _build(tokenizer, n=3, cfg="de:en", target=12)
    for d in inst.documents:
        assert d.langs == ("de", "en", "en")
        assert d.text == " ".join(d.texts)
        for i, (s, e) in enumerate(d.spans):
            assert d.text[s:e] == d.texts[i] == text[(d.topics[i], d.langs[i])]
            assert d.segment_ids[i] == f"{d.langs[i]}:{d.topics[i]}"
        assert d.n_tokens == len(tokenizer(d.text)["input_ids"]) <= 512


def test_seeded_and_reproducible(tokenizer):
    a, b = _build(tokenizer, seed=3), _build(tokenizer, seed=3)
    assert [d.text for d in a.documents] == [d.text for d in b.documents]
    c = _build(tokenizer, seed=4)
    assert [s.topics for s in a.sets] != [s.topics for s in c.sets]


def test_sets_that_do_not_fit_are_skipped_and_reported(tokenizer):
    corpus = prepare_corpus(tiny_corpus(topics=9))
    lens = {
        r.id: len(tokenizer(r.text, add_special_tokens=False)["input_ids"])
        for r in corpus[corpus.lang == "en"].itertuples()
    }
    limit = sorted(lens.values())[5] * 3  # only some triples fit
    inst = build_instance(corpus, 3, LanguageConfig.mono("en"), tokenizer=tokenizer, limit=limit, target_docs=600,
                          min_segment_tokens=1, max_segment_tokens=limit)  # fmt: skip
    assert inst.report.sets_skipped_too_long > 0
    assert all(d.n_tokens <= limit for d in inst.documents)
    assert inst.report.exhausted and inst.report.notes
    # every fitting triple is eventually found, none that does not fit
    fitting = [
        t
        for t in _triples(sorted(lens))
        if all(len(tokenizer(" ".join(_texts(corpus, p)))["input_ids"]) <= limit for p in _perms(t))
    ]
    assert {frozenset(s.topics) for s in inst.sets} <= {frozenset(t) for t in fitting}


def _triples(ids):
    import itertools

    return list(itertools.combinations(ids, 3))


def _perms(t):
    import itertools

    return list(itertools.permutations(t))


def _texts(corpus, topics):
    m = {r.id: r.text for r in corpus[corpus.lang == "en"].itertuples()}
    return [m[t] for t in topics]


def test_bad_input_errors(tokenizer):
    with pytest.raises(ValueError, match="n .*>= 2"):
        _build(tokenizer, n=1)
    with pytest.raises(ValueError, match="unknown language 'xx'"):
        _build(tokenizer, cfg="xx")
    with pytest.raises(ValueError, match="no segment set fits the model limit of 20"):
        _build(tokenizer, limit=20, max_segment_tokens=18)
    with pytest.raises(ValueError, match="only 0 topics"):
        _build(tokenizer, min_segment_tokens=500, max_segment_tokens=600)
    with pytest.raises(ValueError, match="LEAD:LATER"):
        LanguageConfig.parse("a:b:c")
    with pytest.raises(ValueError, match="duplicate"):
        prepare_corpus(pd.concat([tiny_corpus(), tiny_corpus().iloc[:1]]))
    with pytest.raises(ValueError, match="missing column"):
        prepare_corpus(tiny_corpus().drop(columns=["lang"]))


def test_token_span_mapping_against_direct_tokenisation(tokenizer):
    inst = _build(tokenizer, n=4, target=24)
    for d in inst.documents[:24]:
        enc = tokenizer(d.text, return_offsets_mapping=True, return_special_tokens_mask=True)
        idx = token_segment_index(enc["offset_mapping"], d.spans, enc["special_tokens_mask"])
        ids = np.asarray(enc["input_ids"])
        assert idx[0] == -1 and idx[-1] == -1  # [CLS], [SEP]
        for i, seg in enumerate(d.texts):
            direct = tokenizer(seg, add_special_tokens=False)["input_ids"]
            assert ids[idx == i].tolist() == direct
        assert np.all(np.diff(idx[idx >= 0]) >= 0)  # segments are contiguous and in order


def test_join_segments():
    text, spans = join_segments(["ab", "c", "def"])
    assert text == "ab c def"
    assert spans == [(0, 2), (3, 4), (5, 8)]
    # whitespace-only tokens (SentencePiece) map to no segment
    idx = token_segment_index([(0, 0), (0, 2), (2, 3), (3, 4), (0, 0)], spans)
    assert idx.tolist() == [-1, 0, -1, 1, -1]


def test_sets_do_not_reuse_topics_while_the_corpus_allows(tokenizer):
    # 10 topics, n=3: three disjoint sets fit; a fourth must reuse, and the report says so
    inst = _build(tokenizer, n=3, target=18)  # 3 sets
    topics = [t for s in inst.sets for t in s.topics]
    assert len(inst.sets) == 3 and len(set(topics)) == 9  # disjoint
    assert inst.report.sets_sharing_topics == 0 and inst.report.topics_used == 9 and not inst.report.notes
    inst = _build(tokenizer, n=3, target=30)  # 5 sets from 10 topics: reuse is unavoidable
    holders = {}
    for s in inst.sets:
        for t in s.topics:
            holders[t] = holders.get(t, 0) + 1
    sharing = sum(any(holders[t] > 1 for t in s.topics) for s in inst.sets)
    assert len(inst.sets) == 5 and sharing > 0
    # the first three sets were still drawn disjoint
    first = [t for s in inst.sets[:3] for t in s.topics]
    assert len(set(first)) == 9
    assert inst.report.sets_sharing_topics == sharing and inst.report.topics_used == len(holders)
    assert any(f"{sharing} of 5 segment sets share a topic" in note for note in inst.report.notes)
