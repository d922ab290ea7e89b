"""What the held-out experiments (``family_holdout.py``, ``retrieval_holdout.py``) share: the search-space options
and their :class:`~posfair.tuning.SearchSpace`, and the one output, a table printed and written as ``holdout.csv`` /
``holdout.md`` (imported from this folder, which a script's own folder is on ``sys.path``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from posfair.tuning import SearchSpace


def add_space_options(ap: argparse.ArgumentParser, variants: str, layers: str) -> None:
    """The grid's options: variants, baskets, layer sets, strengths, self-shares, schedules, trailing policies."""
    ap.add_argument("--variants", default=variants)
    ap.add_argument("--baskets", default="16,64")
    ap.add_argument("--layers", default=layers)
    ap.add_argument("--strengths", default="0.5,1.0")
    ap.add_argument("--self-shares", default="0.5,1.0", help="self-attention shares of self and its combinations")
    ap.add_argument("--schedules", default="flat", help="per-layer strength schedules: flat,rising,falling")
    ap.add_argument("--trailings", default="basket", help="trailing-basket policies: basket,merge,weighted")
    ap.add_argument("--fine-rounds", type=int, default=1)


def search_space(args: argparse.Namespace) -> SearchSpace:
    """The :class:`SearchSpace` of :func:`add_space_options`' values (BOS/EOS kept at their original mass)."""
    return SearchSpace(
        basket_sizes=tuple(int(x) for x in args.baskets.split(",")),
        layer_sets=tuple(float(x) if "." in x else int(x) for x in args.layers.split(",")),
        strengths=tuple(float(x) for x in args.strengths.split(",")),
        fine_rounds=args.fine_rounds,
        variants=tuple(args.variants.split(",")),
        self_shares=tuple(float(x) for x in args.self_shares.split(",")),
        special_shares=("original",),
        schedules=tuple(args.schedules.split(",")),
        trailings=tuple(args.trailings.split(",")),
    )


def write_holdout_table(table: pd.DataFrame, out: Path) -> None:
    table.to_csv(out / "holdout.csv", index=False)
    (out / "holdout.md").write_text(table.to_markdown(index=False) + "\n", encoding="utf-8")
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table.to_string(index=False))
