"""The audit's advice when an instance has fewer than two segment sets names what would give more (issue 38,
item 10): a target document count only when the corpus has the sets, else what the corpus allows."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from posfair.fairness.documents import LanguageConfig
from posfair.fairness.experiment import AuditSettings, build_instances
from posfair.runtime.errors import PosfairInputError

BODIES = [
    "the apt package manager installs and upgrades software packages from the configured repositories",
    "kernel modules are loaded at boot and provide the drivers for the hardware of the machine",
    "the grub boot loader shows a menu and starts the selected operating system kernel",
    "printing is handled by cups which manages printers queues and print jobs over the network",
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from posfair.model import bundled_model_path

    return AutoTokenizer.from_pretrained(bundled_model_path())


def _corpus(topics: int) -> pd.DataFrame:
    return pd.DataFrame([{"id": f"t{i}", "lang": "en", "text": BODIES[i] + "."} for i in range(topics)])


def _build(tokenizer, topics: int, docs: int):
    settings = AuditSettings(
        n_values=(3,),
        configs=(LanguageConfig.parse("en"),),
        target_docs=docs,
        min_segment_tokens=1,
        max_segment_tokens=100,
        control=False,
    )
    return build_instances(_corpus(topics), settings, tokenizer, 512)


@pytest.mark.parametrize("docs", [6, 12, 100])
def test_three_topics_advice_names_the_corpus_not_the_document_count(tokenizer, docs):
    with pytest.raises(PosfairInputError) as err:
        _build(tokenizer, 3, docs)
    message = str(err.value)
    assert "raise the target document count" not in message
    assert "the corpus allows only 1 distinct set(s) of 3 segments: it has 3 usable topics" in message


def test_advised_document_count_is_the_smallest_that_gives_two_sets(tokenizer):
    """Four topics allow four sets of 3: the advice is a target count, and exactly the smallest that works."""
    with pytest.raises(PosfairInputError) as err:
        _build(tokenizer, 4, 6)
    found = re.search(r"raise the target document count to >= (\d+)", str(err.value))
    assert found, str(err.value)
    docs = int(found.group(1))
    assert [len(inst.sets) for inst in _build(tokenizer, 4, docs)] == [2]
    with pytest.raises(PosfairInputError):
        _build(tokenizer, 4, docs - 1)
