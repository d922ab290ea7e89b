"""One name for a model in every output: the library's audit names it as the command line does."""

from __future__ import annotations

from posfair.fairness.experiment import AuditSettings, make_model_info
from posfair.model.info import display_name


def test_the_audit_names_the_model_as_load_model_did(minilm):
    assert minilm.display_name == "all-MiniLM-L6-v2 (bundled)"
    info = make_model_info(minilm, AuditSettings(n_values=(3,), configs=("en",)))
    assert info.name == display_name(minilm) == minilm.display_name


def test_a_model_without_a_posfair_name_falls_back_to_its_card_then_path():
    class Card:
        base_model = "org/base"

    class Bare:
        model_card_data = Card()
        name_or_path = "/some/folder"

    assert display_name(Bare()) == "org/base"
    Bare.model_card_data = None
    assert display_name(Bare()) == "/some/folder"
    Bare.name_or_path = ""
    assert display_name(Bare()) == "Bare"
