"""Inside a command, other libraries' progress bars stay off (transformers' "Loading weights" / "Writing model
shards", datasets' "Map"); with --debug, and after the command, they are as they were (issue 40 item 5)."""

from __future__ import annotations

import sys

import datasets.utils as datasets_tqdm
import huggingface_hub.utils as hub_utils
import transformers
from transformers.utils import logging as transformers_logging

import posfair
from posfair.cli.error_boundary import one_line_warnings


def test_no_weight_loading_bar_inside_a_command(tiny_model_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["posfair", "encode"])
    monkeypatch.delenv("POSFAIR_DEBUG", raising=False)
    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    path, pooling = tiny_model_path("bert")
    assert transformers_logging.is_progress_bar_enabled()
    hub_before = hub_utils.are_progress_bars_disabled()
    capsys.readouterr()
    with one_line_warnings():
        assert not transformers_logging.is_progress_bar_enabled()
        assert datasets_tqdm.are_progress_bars_disabled()
        assert hub_utils.are_progress_bars_disabled() == hub_before  # downloads keep their bars
        posfair.load_model(path, pooling=pooling)
    assert "Loading weights" not in capsys.readouterr().err
    assert transformers_logging.is_progress_bar_enabled() and not datasets_tqdm.are_progress_bars_disabled()
    posfair.load_model(path, pooling=pooling, show_progress_bar=True)  # asked for: transformers' own bar
    shown = capsys.readouterr().err
    if int(transformers.__version__.split(".")[0]) >= 5:  # transformers 4.x draws no weight-loading bar at all
        assert "Loading weights" in shown


def test_the_library_loads_and_saves_without_a_bar_unless_asked(tiny_model_path, capsys, tmp_path):
    """posfair.load_model and model.save in a script are as quiet as the commands (issue 49 item 4); the switch is
    the user's again afterwards."""
    path, pooling = tiny_model_path("bert")
    capsys.readouterr()
    model = posfair.load_model(path, pooling=pooling)
    model.save(str(tmp_path / "saved"))
    quiet = capsys.readouterr().err
    assert "Loading weights" not in quiet and "Writing model shards" not in quiet and "%|" not in quiet, quiet
    assert transformers_logging.is_progress_bar_enabled()  # restored: the user's setting
    model.save(str(tmp_path / "shown"), show_progress_bar=True)
    if int(transformers.__version__.split(".")[0]) >= 5:
        assert "Writing model shards" in capsys.readouterr().err


def test_debug_keeps_every_bar(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["posfair", "--debug", "encode"])
    with one_line_warnings():
        assert transformers_logging.is_progress_bar_enabled()
        assert not datasets_tqdm.are_progress_bars_disabled()
