"""What a command prints as a table: aligned plain columns that fit the width, else one block per row;
plain text when piped (no box drawing, no wrapping, no cut cells)."""

from __future__ import annotations

from posfair.cli.terminal import table
from posfair.cli.terminal_progress import console
from posfair.cli.terminal_tables import table_text

BOX = set("─│┃━┏┓┗┛┡┩╇╋┳┻┼├┤╭╮╰╯")
HEADER = ["n", "configuration", "coef", "stock", "B128-L0.5-a0.5", "B64-Llast1-a1-prior20x3.abc123", "G"]
ROWS = [
    ["3", "en", "beta_2", "-0.153 •", "-0.106 •", "-0.050 □", "2"],
    ["4", "de:en", "beta_4", "-0.087", "0.027", "0.001", "16"],
]


def test_a_table_that_fits_is_aligned_columns_with_numbers_right_aligned():
    text = table_text("T", ["name", "value"], [["a", "1.5"], ["bbb", "-12.25"]], caption="c")
    assert text.split("\n") == ["T", "name   value", "----  ------", "a        1.5", "bbb   -12.25", "c"]


def test_a_table_too_wide_for_80_columns_becomes_one_block_per_row():
    wide = sum(max(len(h), *(len(r[i]) for r in ROWS)) for i, h in enumerate(HEADER)) + 2 * (len(HEADER) - 1)
    assert wide > 80
    text = table_text("Audit", HEADER, ROWS, width=80, keys=3)
    lines = text.split("\n")
    assert all(len(line) <= 80 for line in lines)
    assert lines[1] == "- n=3  configuration=en  coef=beta_2"
    assert "    B64-Llast1-a1-prior20x3.abc123  -0.050 □" in lines
    for row in ROWS:  # every cell printed whole
        for h, cell in zip(HEADER[3:], row[3:], strict=True):
            assert any(line.split() == [h, *cell.split()] for line in lines), (h, cell)
    # the same table with room enough: one line per row
    assert len(table_text("Audit", HEADER, ROWS, width=200).split("\n")) == 1 + 2 + len(ROWS)


def test_piped_output_is_plain_and_80_columns_wide(capsys, monkeypatch):
    """Not a terminal and no COLUMNS (a log, a pipe): the width is 80, as a terminal's default (issue 49)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    con = console()  # pytest's captured stdout is not a terminal
    assert not con.is_terminal and con.width == 80
    table("Audit [bold]x[/bold]", HEADER, ROWS, caption="σ coefficients vs position 1 · " + "long " * 30, keys=3)
    out = capsys.readouterr().out
    assert not BOX & set(out)
    assert "[bold]" in out  # cells and titles are printed as they are, never read as markup
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines) and lines[1] == "- n=3  configuration=en  coef=beta_2"
    assert lines[-1].strip().split() and all(set(w) <= set("long") for w in lines[-1].split())  # caption wrapped


def test_with_columns_set_a_wide_table_is_one_block_per_row_and_its_caption_wraps_at_words(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    table("Audit", HEADER, ROWS, caption="σ coefficients vs position 1 · " + "long " * 30, keys=3)
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines) and lines[1] == "- n=3  configuration=en  coef=beta_2"
    assert lines[-1].strip().split() and all(set(w) <= set("long") for w in lines[-1].split())


def _logical(lines: list[str]) -> list[str]:
    """Lines as written, a wrapped line's continuations (indented) joined to it."""
    out: list[str] = []
    for line in lines:
        if line.startswith("  ") and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def test_progress_into_a_log_is_one_line_per_bar_wrapped_at_words(capsys, monkeypatch):
    """Piped or redirected (pytest's capture is not a terminal): no bars, no box drawing, no cut
    descriptions (a long one wraps at words, at 80 columns); a bar is written once, when it completes, or at
    the end as far as it got."""
    from posfair.cli.terminal_progress import progress_bars

    monkeypatch.delenv("COLUMNS", raising=False)

    long = "aligned[eng-Latn]: documents (late-mean (64-token windows)) " + "x" * 60
    with progress_bars() as bar:
        tick = bar(long, 54)
        for _ in range(54):
            tick(1)
        cached = bar("queries (stock)", 159, done=159)  # answered from the cache: written at once
        short = bar("shards", 10)
        short(4)
        del cached
        printed = capsys.readouterr().err.splitlines()
        assert all(len(line) <= 80 for line in printed) and len(printed) > 2  # the long one wrapped
        so_far = _logical(printed)
        assert [line.split(" in ")[0] for line in so_far] == [f"{long}: 54/54", "queries (stock): 159/159"]
    err = so_far + capsys.readouterr().err.splitlines()
    assert err[2].split(" in ")[0] == "shards: 4/10" and len(err) == 3
    assert not BOX & set("".join(err)) and all(line.endswith(" s") for line in err)
    with progress_bars(complete_on_exit=True) as bar:
        bar("filled from the cache", 7, done=3)(2)
    assert capsys.readouterr().err.split(" in ")[0] == "filled from the cache: 7/7"


def test_a_table_a_little_too_wide_stacks_its_headers_words_before_it_breaks_into_blocks():
    header = ["setting", "seg 1", "seg 2", "seg 3", "Harm", "PSI", "nDCG@10", "calibrated share", "highest Harm"]
    rows = [["B16-L0.5-a0.5", "60.77", "64.04", "76.54", "66.46", "0.206", "67.12", "1.000", "yes"]]
    lines = table_text("", header, rows, width=80).split("\n")
    assert all(len(line) <= 80 for line in lines) and len(lines) == 4  # two header lines, the rule, the row
    assert lines[0].split() == ["calibrated", "highest"] and lines[1].split()[-2:] == ["share", "Harm"]
    assert lines[3].split() == rows[0]
    assert table_text("", header, rows, width=200).split("\n")[0].split() == " ".join(header).split()  # room: one line
