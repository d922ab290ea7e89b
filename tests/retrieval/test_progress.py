"""Progress of long calls: a caller's callback, tqdm bars (sentence-transformers' rule), or nothing."""

import logging
import sys
import types

from posfair.runtime.progress import progress_enabled, progress_tasks

logger = logging.getLogger("posfair.tests.progress")


def test_enabled_follows_the_logger_level_when_not_given(monkeypatch):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    logger.setLevel(logging.WARNING)
    assert not progress_enabled(None, logger)
    logger.setLevel(logging.INFO)
    assert progress_enabled(None, logger)
    logger.setLevel(logging.DEBUG)
    assert progress_enabled(None, logger)
    assert not progress_enabled(False, logger) and progress_enabled(True, logger)
    logger.setLevel(logging.NOTSET)


def test_a_notebook_shows_progress_by_default(monkeypatch):
    """In a Jupyter kernel a long call (audit, tune, ...) shows bars without any logging set up."""
    logger.setLevel(logging.WARNING)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    assert progress_enabled(None, logger) and not progress_enabled(False, logger)
    logger.setLevel(logging.NOTSET)


def test_a_callback_gets_every_task_and_advance():
    seen = []

    def progress(desc, total, done):
        seen.append((desc, total, done))
        return lambda n: seen.append(("advance", n))

    with progress_tasks(False, logger, progress) as task:  # the callback wins over show_progress_bar
        advance = task("documents", 3)
        advance(2)
        advance(1)
        task("queries", 5)(5)
    assert seen == [("documents", 3, 0), ("advance", 2), ("advance", 1), ("queries", 5, 0), ("advance", 5)]
    with progress_tasks(False, logger, lambda *a: None) as task:  # a callback may return no advance
        task("x", 1)(1)


def test_tqdm_bars_are_closed(capsys):
    with progress_tasks(True, logger) as task:
        advance = task("documents", 2)
        advance(2)
    assert "documents" in capsys.readouterr().err
    with progress_tasks(False, logger) as task:
        task("silent", 2)(2)
    assert "silent" not in capsys.readouterr().err
