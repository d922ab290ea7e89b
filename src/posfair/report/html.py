"""A self-contained HTML report assembled from sections.

Each :class:`Section` has a title, an HTML fragment (trusted, produced by our
own writers), optional figures (PNG bytes embedded as base64) and optional
sub-sections.  Other parts of posfair add their own sections (e.g. the
attention profile) by appending to the list passed to :func:`render_report`.
"""

from __future__ import annotations

import base64
import datetime as _dt
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posfair.io import atomic_write_text

__all__ = ["FigureRef", "Section", "render_report", "write_report", "key_value_html"]


@dataclass
class FigureRef:
    png: bytes
    caption: str = ""
    alt: str = ""

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


@dataclass
class Section:
    title: str
    html: str = ""
    figures: list[FigureRef] = field(default_factory=list)
    subsections: list[Section] = field(default_factory=list)
    anchor: str = ""

    def slug(self, i: int) -> str:
        return self.anchor or f"s{i}-" + "".join(ch if ch.isalnum() else "-" for ch in self.title.lower()).strip("-")[:40]


def key_value_html(items: dict[str, Any]) -> str:
    """A two-column table of parameters (values escaped)."""
    from html import escape

    rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in items.items())
    return f'<table class="kv">{rows}</table>'


def _env():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("posfair.report", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_report(title: str, sections: Sequence[Section], *, subtitle: str = "", generated: str | None = None) -> str:
    generated = generated or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    numbered = [(s.slug(i), s) for i, s in enumerate(sections)]
    return _env().get_template("report.html.j2").render(title=title, subtitle=subtitle, sections=numbered, generated=generated)


def write_report(path: str | os.PathLike, title: str, sections: Sequence[Section], **kwargs) -> Path:
    return atomic_write_text(path, render_report(title, sections, **kwargs))
