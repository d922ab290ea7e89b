"""The documents a repair is fitted on and judged on: one document family held out, the rest split by topic.

:func:`repair_split` holds out one document family of the corpus (``--test-family``; default the family with
the fewest topics, so the fit keeps the most) and splits the other families' topics into *train* (fitted on)
and *dev* (early stopping, the choice among settings), seeded, no topic on both sides.  Documents are every
ordering of segment sets of ``n`` sections (:func:`posfair.fairness.experiment.build_instances`), none
truncated.  The dev and test sets are disjoint (no section in two sets: independent units for the intervals)
and use every usable section once; the train sets draw each section into several sets (``reuse`` times as many
documents as disjoint sets give), so the fit sees each section beside many others and at every position.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pandas as pd

from posfair import encoding as enc
from posfair.fairness.documents import Instance
from posfair.fairness.experiment import AuditSettings, build_instances
from posfair.runtime.errors import PosfairInputError
from posfair.tuning.objectives import corpus_families, split_ids

__all__ = ["FAMILY_FIELD", "RepairSplit", "disjoint_sets", "held_out_family", "repair_split"]

#: the corpus column naming each section's document family (the bundled corpus: debian-faq, installation-guide)
FAMILY_FIELD = "source"


@dataclass(frozen=True)
class RepairSplit:
    """Train / dev / test instances: test is the held-out family ``test_family``; train and dev come from the
    ``fit_families`` by topic."""

    test_family: str
    fit_families: tuple[str, ...]
    train: tuple[Instance, ...]
    dev: tuple[Instance, ...]
    test: tuple[Instance, ...]

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per split (segment sets, documents)."""
        return {
            name: (sum(len(i.sets) for i in part), sum(len(i.documents) for i in part))
            for name, part in (("train", self.train), ("dev", self.dev), ("test", self.test))
        }


def disjoint_sets(inst: Instance) -> Instance:
    """``inst`` cut to its leading sets that share no section (the sampler draws unused sections first and
    reuses sections only after they run out)."""
    seen: set[str] = set()
    keep: list[str] = []
    for s in inst.sets:
        if seen & set(s.topics):
            break
        seen.update(s.topics)
        keep.append(s.set_id)
    kept = set(keep)
    return dataclasses.replace(
        inst, sets=[s for s in inst.sets if s.set_id in kept], documents=[d for d in inst.documents if d.set_id in kept]
    )


def held_out_family(corpus: pd.DataFrame, test_family: str | None) -> str:
    """The family :func:`repair_split` holds out: ``test_family`` (checked against the corpus's families) or the
    family with the fewest sections.  Refuses a corpus without two families."""
    families = corpus_families(corpus) if FAMILY_FIELD in corpus.columns else []
    if len(families) < 2:
        raise PosfairInputError(
            f"a repair is judged on a document family it was not fitted on: the corpus needs a {FAMILY_FIELD!r} "
            f"column with at least 2 families; it has {len(families)}"
        )
    if test_family is None:
        sizes = corpus.groupby(FAMILY_FIELD)["id"].nunique()
        return str(sizes.sort_values(kind="stable").index[0])
    if test_family not in families:
        raise PosfairInputError(
            f"--test-family {test_family!r} is not in the corpus; its families: {', '.join(families)}"
        )
    return test_family


def repair_split(
    model,
    corpus: pd.DataFrame,
    *,
    limit: int,
    test_family: str | None = None,
    n: int = 3,
    configs: tuple[str, ...] = ("en",),
    dev_fraction: float = 0.25,
    reuse: int = 3,
    seed: int = 0,
) -> RepairSplit:
    """Build the three splits (see the module docstring) for documents of at most ``limit`` tokens."""
    test_family = held_out_family(corpus, test_family)
    families = corpus_families(corpus)
    fam = corpus[FAMILY_FIELD].astype(str)
    test_part, fit_part = corpus[fam == test_family], corpus[fam != test_family]
    train_ids, dev_ids = split_ids(fit_part["id"].astype(str).tolist(), dev_fraction, seed)
    ids = fit_part["id"].astype(str)
    tokenizer = enc.model_tokenizer(model)

    def instances(part: pd.DataFrame, docs_per_set_pass: int, disjoint: bool, tag: str) -> tuple[Instance, ...]:
        topics = part["id"].nunique()
        settings = AuditSettings(
            n_values=(n,),
            configs=configs,
            target_docs=max(1, docs_per_set_pass * math.factorial(n) * (topics // n)),
            seed=seed,
            max_seq_length=limit,
            retention=False,
            control=False,
        )
        out = []
        for inst in build_instances(part, settings, tokenizer, limit):
            inst = disjoint_sets(inst) if disjoint else inst
            if len(inst.sets) < 2:
                raise PosfairInputError(
                    f"the {tag} split ({part['id'].nunique()} sections) yields {len(inst.sets)} segment set(s) of "
                    f"{n} sections within {limit} tokens; it needs at least 2"
                )
            out.append(_tagged(inst, tag))
        return tuple(out)

    return RepairSplit(
        test_family=test_family,
        fit_families=tuple(f for f in families if f != test_family),
        train=instances(fit_part[ids.isin(train_ids)], reuse, False, "train"),
        dev=instances(fit_part[ids.isin(dev_ids)], 1, True, "dev"),
        test=instances(test_part, 1, True, "test"),
    )


def _tagged(inst: Instance, tag: str) -> Instance:
    """``inst`` with its set and document ids prefixed by the split's name (ids never collide across splits)."""
    sets = [dataclasses.replace(s, set_id=f"{tag}-{s.set_id}") for s in inst.sets]
    docs = [dataclasses.replace(d, set_id=f"{tag}-{d.set_id}", doc_id=f"{tag}-{d.doc_id}") for d in inst.documents]
    return dataclasses.replace(inst, sets=sets, documents=docs)
