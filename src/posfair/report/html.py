"""A self-contained HTML report assembled from sections, and the HTML fragments of its parts.

Each :class:`Section` has a title, an HTML fragment (trusted, produced by the
templates of this package or of an area), optional figures (PNG bytes embedded
as base64) and optional sub-sections.  Areas add their own sections (e.g. the
audit's summary, the attention profile) by appending to the list passed to
:func:`render_report`; this module knows nothing about them.

Every fragment is rendered by Jinja with autoescaping: a value is escaped as
:func:`html.escape` does (quotes included) unless the template marks it ``| safe``
-- which is how a fragment (a ``str`` of HTML returned by one of these functions)
nests in another.  An area keeps its markup beside its code as a template string
rendered with :func:`render_string`; generic fragments (tables, key-value tables)
are the template files under ``report/templates``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from posfair.files.atomic import atomic_write_text

__all__ = [
    "FigureRef",
    "Section",
    "render_report",
    "write_report",
    "key_value_html",
    "render_fragment",
    "render_string",
    "environment",
]


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
        return (
            self.anchor or f"s{i}-" + "".join(ch if ch.isalnum() else "-" for ch in self.title.lower()).strip("-")[:40]
        )


def _escape_once(value: Any) -> Any:
    """Jinja ``finalize``: markup (``| safe``) passes, anything else becomes ``html.escape(str(value))``."""
    if hasattr(value, "__html__"):
        return value
    return Markup(html.escape(str(value)))


@cache
def environment() -> jinja2.Environment:
    """The Jinja environment of every posfair HTML fragment (autoescaping, templates from ``report/templates``)."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("posfair.report", "templates"),
        autoescape=True,
        finalize=_escape_once,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )


def render_fragment(name: str, **context: Any) -> str:
    """Render the template file ``name`` of ``report/templates``."""
    return environment().get_template(name).render(**context)


@cache
def _compiled(source: str) -> jinja2.Template:
    return environment().from_string(source)


def render_string(source: str, **context: Any) -> str:
    """Render a template string (an area's section markup) in the same autoescaping environment."""
    return _compiled(source).render(**context)


def key_value_html(items: Mapping[str, Any]) -> str:
    """A two-column table of parameters (keys and values escaped)."""
    return render_fragment("key_value.html.j2", items=list(items.items()))


def render_report(title: str, sections: Sequence[Section], *, subtitle: str = "", generated: str | None = None) -> str:
    generated = generated or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    numbered = [(s.slug(i), s) for i, s in enumerate(sections)]
    return (
        environment()
        .get_template("report.html.j2")
        .render(title=title, subtitle=subtitle, sections=numbered, generated=generated)
    )


def write_report(path: str | os.PathLike, title: str, sections: Sequence[Section], **kwargs) -> Path:
    return atomic_write_text(path, render_report(title, sections, **kwargs))
