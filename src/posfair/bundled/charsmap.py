"""A per-code-point character map as a SentencePiece "precompiled charsmap".

The ``tokenizers`` library's ``Precompiled`` normalizer reads SentencePiece's binary
normalisation map: a 4-byte little-endian size, a double-array trie (darts-clone units)
over the UTF-8 bytes of each key, and a blob of NUL-terminated replacement strings that
the trie's values point into.  :func:`build_charsmap` writes that format for a map whose
keys are single code points; :func:`lookup` walks the trie the way the normalizer does
(a common-prefix search), so a test can check every key without the tokenizer.

Unit layout (darts-clone): bits 0-7 the label of the byte that leads to the unit, bit 8
"this node has a value", bit 9 "offset extended" (never used here: the trie is small),
bits 10-30 the XOR offset from the unit's position to its node's base, bit 31 "this unit
is a value" (value in bits 0-30).  A node's children sit at ``base ^ byte``; its value,
when it has one, at ``base`` itself.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

__all__ = ["build_charsmap", "lookup"]

_BLOCK = 256
_MAX_OFFSET = 1 << 21  # offsets above this would need the extended encoding


def _encode_node(label: int, has_value: bool, offset: int) -> int:
    if not 0 <= offset < _MAX_OFFSET:
        raise ValueError(f"trie offset {offset} does not fit the compact unit encoding")
    return (offset << 10) | (int(has_value) << 8) | label


def build_charsmap(mapping: Mapping[int, str]) -> bytes:
    """The precompiled-charsmap bytes mapping each code point of ``mapping`` to its string."""
    # replacement strings, each once, NUL-terminated
    blob = bytearray()
    where: dict[str, int] = {}
    for out in sorted(set(mapping.values())):
        if "\0" in out:
            raise ValueError("a replacement string cannot hold NUL")
        where[out] = len(blob)
        blob += out.encode("utf-8") + b"\0"

    # the byte trie: node = dict of children, plus the value (offset into blob) of a complete key
    root: dict = {}
    for cp, out in mapping.items():
        node = root
        for byte in chr(cp).encode("utf-8"):
            node = node.setdefault(byte, {})
        node[None] = where[out]

    units: list[int] = [0] * _BLOCK  # block 0 holds the root unit at position 0
    occupied = [1]  # per block: bit i set = slot i holds a unit
    bases: set[int] = set()  # a base serves one node only (two nodes sharing one would alias their children)
    first = [0]  # blocks before this one are (nearly) full

    def place(slots: list[int]) -> int:
        """A fresh base whose slots ``base ^ s`` are all free (first fit over the blocks)."""
        masks: list[int | None] = [None] * _BLOCK  # the slots of offset x as bits, made when first needed
        blk = first[0]
        while True:
            if blk == len(occupied):
                occupied.append(0)
                units.extend([0] * _BLOCK)
            occ = occupied[blk]
            for x in range(_BLOCK):
                mask = masks[x]
                if mask is None:
                    mask = masks[x] = sum(1 << (x ^ s) for s in slots)
                base = blk * _BLOCK + x
                if not occ & mask and base not in bases:
                    occupied[blk] = occ | mask
                    bases.add(base)
                    return base
            if blk == first[0] and bin(occ).count("1") > _BLOCK - 16:
                first[0] += 1
            blk += 1

    # breadth-first: give each node a base, then write its children's units and its value unit
    queue: list[tuple[dict, int]] = [(root, 0)]  # (node, position of the unit that leads to it)
    while queue:
        node, pos = queue.pop(0)
        labels = sorted(k for k in node if k is not None)
        has_value = None in node
        base = place(labels + ([0] if has_value else []))
        parent_label = units[pos] & 0xFF
        units[pos] = _encode_node(parent_label if pos else 0, has_value and pos != 0, pos ^ base)
        if has_value:
            units[base] = (1 << 31) | node[None]
        for lab in labels:
            child = base ^ lab
            units[child] = lab  # label now; offset and value flag once the child is placed
            queue.append((node[lab], child))
    trie = struct.pack(f"<{len(units)}I", *units)
    return struct.pack("<I", len(trie)) + trie + bytes(blob)


def lookup(charsmap: bytes, text: str) -> str | None:
    """The replacement of the shortest key that prefixes ``text`` (as the normalizer finds it), or None."""
    (size,) = struct.unpack_from("<I", charsmap, 0)
    units = struct.unpack_from(f"<{size // 4}I", charsmap, 4)
    blob = charsmap[4 + size :]

    def offset(u: int) -> int:
        return (u >> 10) << ((u & (1 << 9)) >> 6)

    pos = offset(units[0])
    for byte in text.encode("utf-8"):
        pos ^= byte
        unit = units[pos]
        if unit & ((1 << 31) | 0xFF) != byte:
            return None
        pos ^= offset(unit)
        if (unit >> 8) & 1:
            start = units[pos] & ((1 << 31) - 1)
            return blob[start : blob.index(b"\0", start)].decode("utf-8")
    return None
