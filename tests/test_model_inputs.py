"""``FairModel.encode`` refuses empty and non-string items whatever container holds them."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest


@pytest.mark.parametrize(
    "sentences,message",
    [
        (["fine", ""], "text 1 is empty: posfair does not embed empty texts"),
        (np.array(["fine", "also fine", "  "]), "text 2 is empty: posfair does not embed empty texts"),
        (np.array(["fine", None], dtype=object), "text 1 is NoneType None, not a string: posfair embeds only texts"),
        (("fine", 123), "text 1 is int 123, not a string: posfair embeds only texts"),
        (pd.Series(["fine", float("nan")]), "text 1 is float nan, not a string: posfair embeds only texts"),
        (np.array([["a", "b"]]), "texts must be a string or a 1-d sequence of strings; got an array of shape (1, 2)"),
    ],
)
def test_encode_refuses_unusable_items_by_index(tiny_model, sentences, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        tiny_model("bert").encode(sentences)


def test_a_numpy_array_of_texts_encodes_like_a_list(tiny_model):
    model = tiny_model("bert")
    texts = ["first text", "a second, longer text"]
    np.testing.assert_array_equal(model.encode(np.array(texts)), model.encode(texts))
    assert model.encode(np.array([], dtype=str)).shape == (0, model.get_embedding_dimension())
