"""The token-level grammar every IR level prints and parses.

All three levels share one lexical syntax, so one tokenizer and one cursor serve every parser:

    %name  %"any name"     values (quoted when not a plain identifier)
    ident  123  -4  1.5e-3  inf  nan  "json string"
    ( ) [ ] { } , = : @ + * | ;

Each level's printer builds lines from `name()`, `number()`, `attrs()` and `ttype()`; each
parser walks a `Cursor` over `tokenize(text)`. Parse errors name the line and the token.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from aicfc.errors import AicfError
from aicfc.ir.types import DTYPES, TensorType

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_TOKEN = re.compile(r"""
    (?P<ws>[ \t]+|\#[^\n]*)
  | (?P<nl>\n)
  | (?P<value>%(?:[A-Za-z_0-9][A-Za-z0-9_.]*|"(?:[^"\\]|\\.)*"))
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<number>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+|inf\b|nan\b))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[()\[\]{},=:@+*|;])
""", re.VERBOSE)


class Token(tuple):
    kind: str
    text: str
    line: int

    def __new__(cls, kind: str, text: str, line: int) -> Token:
        t = super().__new__(cls, (kind, text, line))
        t.kind, t.text, t.line = kind, text, line
        return t


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise AicfError(f"IR text line {line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind == "nl":
            line += 1
        elif kind != "ws":
            tokens.append(Token(kind, m.group(), line))
        pos = m.end()
    tokens.append(Token("eof", "", line))
    return tokens


class Cursor:
    """A parser's position in the token list, with the few primitives every level needs."""

    def __init__(self, text: str):
        self.tokens = tokenize(text)
        self.pos = 0

    @property
    def peek(self) -> Token:
        return self.tokens[self.pos]

    def fail(self, what: str) -> AicfError:
        tok = self.peek
        return AicfError(f"IR text line {tok.line}: expected {what}, found {tok.text or 'end of text'!r}")

    def next(self) -> Token:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def accept(self, text: str) -> bool:
        if self.peek.text == text and self.peek.kind in ("punct", "ident"):
            self.pos += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.accept(text):
            raise self.fail(repr(text))

    def ident(self) -> str:
        if self.peek.kind != "ident":
            raise self.fail("an identifier")
        return self.next().text

    def value(self) -> str:
        if self.peek.kind != "value":
            raise self.fail("a %value")
        body = self.next().text[1:]
        return json.loads(body) if body.startswith('"') else body

    def string(self) -> str:
        if self.peek.kind != "string":
            raise self.fail("a string")
        return json.loads(self.next().text)

    def integer(self) -> int:
        tok = self.peek
        if tok.kind != "number" or not re.fullmatch(r"-?\d+", tok.text):
            raise self.fail("an integer")
        self.pos += 1
        return int(tok.text)

    def number(self) -> int | float:
        tok = self.peek
        if tok.kind != "number":
            raise self.fail("a number")
        self.pos += 1
        return int(tok.text) if re.fullmatch(r"-?\d+", tok.text) else float(tok.text)

    def int_list(self, open_: str = "[", close: str = "]") -> tuple[int, ...]:
        self.expect(open_)
        items: list[int] = []
        while not self.accept(close):
            items.append(self.integer())
            if not self.accept(","):
                self.expect(close)
                break
        return tuple(items)

    def ttype(self) -> TensorType:
        dtype = self.ident()
        if dtype not in DTYPES:
            raise AicfError(f"IR text line {self.tokens[self.pos - 1].line}: unknown dtype {dtype!r}")
        return TensorType(dtype, self.int_list())

    def attr_value(self) -> Any:
        tok = self.peek
        if tok.kind == "string":
            return self.string()
        if tok.kind == "number":
            return self.number()
        if tok.text == "[":
            self.next()
            items = []
            while not self.accept("]"):
                items.append(self.attr_value())
                if not self.accept(","):
                    self.expect("]")
                    break
            return tuple(items)
        if tok.kind == "ident":
            return self.next().text
        raise self.fail("an attribute value")

    def attrs(self) -> dict[str, Any]:
        """`{key=value, ...}`, or nothing at all (an empty dict)."""
        out: dict[str, Any] = {}
        if not self.accept("{"):
            return out
        while not self.accept("}"):
            key = self.ident()
            self.expect("=")
            out[key] = self.attr_value()
            if not self.accept(","):
                self.expect("}")
                break
        return out

    def at_end(self) -> bool:
        return self.peek.kind == "eof"


def name(n: str) -> str:
    """Print a value name: bare when it is a plain identifier, JSON-quoted otherwise."""
    return f"%{n}" if _PLAIN.match(n) or re.fullmatch(r"\d+", n) else f"%{json.dumps(n)}"


def number(x: int | float) -> str:
    """Print a number so that parsing gives back the same value (repr round-trips floats)."""
    if isinstance(x, bool):
        return str(int(x))
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    r = repr(float(x))
    return r if ("." in r or "e" in r) else r + ".0"


def attr_value(v: Any) -> str:
    if isinstance(v, str):
        return v if _PLAIN.match(v) and v not in ("inf", "nan") else json.dumps(v)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(attr_value(x) for x in v) + "]"
    return number(v)


def attrs(d: dict[str, Any] | tuple[tuple[str, Any], ...]) -> str:
    items = sorted(dict(d).items())
    if not items:
        return ""
    return "{" + ", ".join(f"{k}={attr_value(v)}" for k, v in items) + "}"
