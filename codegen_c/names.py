"""Strings from a model (tensor, node, graph and file names) made safe for the text they land in.

A model file is untrusted input: a tensor named `x */ int evil; /*` must stay a comment, never
become code in the user's firmware. Every model string that reaches generated text goes through
one of these: `c_comment` inside /* ... */, `c_identifier` as (part of) a C name, `c_string` as
a C string literal, `printable` on a terminal (`mcuforge info`, error messages)."""
from __future__ import annotations

import re
import unicodedata

# C99 keywords, plus names the generated code or its headers use by themselves
C_KEYWORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while _Bool _Complex _Imaginary
    main arena state NULL""".split())


def _escaped(ch: str) -> str:
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def c_comment(text, limit: int = 160) -> str:
    """`text` as it can stand inside a C block comment on one line: printable ASCII only
    (anything else, newlines and CR too, as a \\xNN / \\uNNNN escape), no comment delimiter
    (`*/`, `/*`), no trigraph (`??/` is a backslash in C99, and backslash-newline splices
    lines), at most `limit` characters."""
    s = "".join("\\\\" if ch == "\\" else ch if " " <= ch <= "~" else _escaped(ch)
                for ch in str(text))
    if len(s) > limit:
        s = s[:limit - 3] + "..."
    # after each pass a pattern can only reappear where an inserted space is not: repeat
    while "*/" in s or "/*" in s or "??" in s:
        s = s.replace("*/", "* /").replace("/*", "/ *").replace("??", "? ?")
    return s


def c_identifier(text, taken: set | None = None, limit: int = 40) -> str:
    """A C identifier made of `text`'s letters and digits (runs of anything else become one
    '_'), never a keyword, never starting with a digit or '_'. With `taken`, it is made unique
    among the names in it (by a numeric suffix) and added to it."""
    s = re.sub(r"[^0-9A-Za-z]+", "_", str(text)).strip("_")[:limit].rstrip("_") or "t"
    if s[0].isdigit() or s in C_KEYWORDS:
        s = "t_" + s
    if taken is None:
        return s
    base, k = s, 1
    while s in taken:
        s = f"{base}_{k}"
        k += 1
    taken.add(s)
    return s


def c_string(text) -> str:
    """`text` as a C string literal (with its quotes): its UTF-8 bytes, printable ASCII as
    itself, the rest as octal escapes (at most 3 digits, so a following digit cannot join
    them); '?' escaped against trigraphs."""
    out = []
    for b in str(text).encode("utf-8", "backslashreplace"):
        ch = chr(b)
        if ch in '"\\?':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def printable(text, keep_newlines: bool = False) -> str:
    """`text` for a terminal: control and format characters (escape sequences, CR, NUL,
    bidirectional overrides, ...) as escapes; other Unicode letters stay readable."""
    return "".join(ch if (ch in "\n\t" and keep_newlines) or unicodedata.category(ch)[0] != "C"
                   else _escaped(ch) for ch in str(text))
