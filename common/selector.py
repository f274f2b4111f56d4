"""JMS message selectors (JMS 2.0 section 3.8.1.1): parsed once, evaluated per message (pure, sans-IO).

Theory of operation
-------------------
A subscription may carry a selector, an SQL-92 conditional expression over a message's header fields
and application properties (`apache.org:selector-filter:string` on an AMQP receiver's source). The
router asks ``Selector.matches`` once per message per selecting subscription, so the work is split:
``parse`` reads the text once, checks it and compiles it to nested closures; ``matches`` only calls
them. A selector the router cannot take raises ``SelectorError`` (a ``ValueError``) whose message
names what is wrong and where ("at column 12: expected ')'"); the adapter refuses the attach with
``SelectorError.condition`` (``amqp:invalid-field``) and that text.

The language
------------
- Literals: strings in single quotes (``'it''s'``: a quote is doubled); exact numerics (``57``; a
  sign is the unary operator, so ``-957`` is minus 957; within a Java long); approximate numerics
  (``7E3``, ``-57.9E2``, ``7.``, ``.5``); ``TRUE``/``FALSE``. Keywords are case-insensitive.
- Identifiers follow Java's rules (a letter, ``_`` or ``$``, then letters, digits, ``_``, ``$``) and
  are case-sensitive; ``NULL TRUE FALSE NOT AND OR BETWEEN LIKE IN IS ESCAPE`` are not identifiers.
  An identifier names a field of the mapping given to ``matches``; an absent one is NULL.
- Operators, from the tightest: unary ``+ -``; ``* /``; ``+ -``; the comparisons ``= <> < <= > >=``,
  ``[NOT] BETWEEN a AND b``, ``[NOT] IN ('x', ...)`` (string literals only), ``[NOT] LIKE 'pattern'
  [ESCAPE 'c']`` (``%`` any run of characters, ``_`` one character; case-sensitive), ``IS [NOT]
  NULL``; ``NOT``; ``AND``; ``OR``. Comparisons do not chain (``a = b = c`` is refused).

Evaluation: SQL's three values
------------------------------
Every condition is TRUE, FALSE or UNKNOWN (``True``, ``False``, ``None`` here); ``matches`` is true
only for TRUE. A NULL operand makes a comparison or an arithmetic result UNKNOWN/NULL; ``NOT
UNKNOWN`` is UNKNOWN; ``FALSE AND UNKNOWN`` is FALSE; ``TRUE OR UNKNOWN`` is TRUE. Values have three
types: numbers (``int`` and ``float`` compare and compute together, as Java's numeric promotion),
strings and booleans (``bool`` is not a number here, although Python says it is an ``int``).
Comparing values of different types is UNKNOWN, as are arithmetic on a non-number, ``LIKE``/``IN`` on
a non-string, and a bare identifier used as a condition that is not a boolean. Strings and booleans
take only ``=`` and ``<>``: with a literal, the other comparisons are refused at parse time; with an
identifier holding one, they are UNKNOWN. Division by zero (exact or approximate) is UNKNOWN, not
Java's exception or infinity; exact divided by exact truncates toward zero, as Java's long division
(exact arithmetic does not wrap at 64 bits, as Java's would).
A value of any other Python type (bytes, UUID, ...) is present (not NULL) but compares as UNKNOWN.

Limits: the text is at most ``MAX_TEXT`` (4,096) characters, and its tree at most ``MAX_DEPTH`` (100)
levels deep, counting each operator and each pair of parentheses as a level (``a = 1`` is two levels
deep, ``(a = 1)`` three; a run of ``AND``, ``OR``, ``+``/``-`` or ``*``/``/`` is one level, however
long). The parser (precedence climbing, hand-written: no parser library is worth a dependency for
this grammar) spends a few Python frames per level and evaluation one closure call per level, so
neither can exhaust Python's stack: a deeper selector is refused before it is descended into.
Ill-typed selectors are refused too, at the column of the operator that cannot take its operand
(``a + 'x' = 1``, ``NOT 3``, ``'x' < a``, a number as the whole selector).

Message fields
--------------
``message_fields`` reads the identifiers of an encoded AMQP message the way Qpid JMS shows them to a
JMS application (its ``AmqpJmsMessageFacade``, ``AmqpHeader``, ``AmqpMessageIdHelper``):

- application properties by name (symbols and chars as strings, every integer type as ``int``,
  float and double as ``float``; other types, such as binary, UUID, lists, maps, are left out);
- ``JMSDeliveryMode``: ``'PERSISTENT'`` when the header's ``durable`` is true, else
  ``'NON_PERSISTENT'``; ``JMSPriority``: the header's priority (4 when absent, at most 9);
- ``JMSMessageID``: the ``message-id`` as Qpid JMS renders it: a string starting ``ID:`` as it is
  (``ID:AMQP_STRING:`` before it if it then starts with one of Qpid JMS's type prefixes), any other
  string after ``ID:AMQP_NO_PREFIX:``, a UUID as ``ID:AMQP_UUID:<uuid>``, a ulong as
  ``ID:AMQP_ULONG:<n>``, binary as ``ID:AMQP_BINARY:<HEX>``; absent: NULL;
- ``JMSCorrelationID``: the ``correlation-id``, the same way except that a string without ``ID:`` is
  taken as it is;
- ``JMSTimestamp``: ``creation-time`` in milliseconds (0 when absent, as Qpid JMS says);
- ``JMSType``: the ``subject`` (Qpid JMS maps JMSType there, not to an annotation); absent: NULL;
- ``JMSExpiration``: ``absolute-expiry-time`` in milliseconds; 0 when neither it nor the header's
  ``ttl`` is set; NULL when only ``ttl`` is (Qpid JMS then counts from the moment the client
  receives the message, which a router cannot know);
- ``JMSXGroupID`` (``group-id``), ``JMSXGroupSeq`` (``group-sequence``, when a group is named),
  ``JMSXUserID`` (``user-id`` as UTF-8), ``JMSXDeliveryCount`` (the header's delivery count plus 1).

These header names win over application properties of the same name, as in Qpid JMS. Only the
sections before the body are decoded. Bytes that do not decode as a message give an empty mapping
(every comparison UNKNOWN), never an exception.
Proton is imported by ``message_fields`` only, so the sans-IO core may import this module.
"""

from __future__ import annotations

import operator
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from .amqpmsg import Unreadable, skip
from .errors import RemoteProtocolError

if TYPE_CHECKING:
    from proton import Message

MAX_TEXT = 4_096
"""The longest selector, in characters."""
MAX_DEPTH = 100
"""The deepest tree: each operator and each pair of parentheses one level."""
_LONG_MIN, _LONG_MAX = -(2 ** 63), 2 ** 63 - 1

Fields = Mapping[str, object]
Truth = bool | None  # TRUE, FALSE, UNKNOWN
_Eval = Callable[[Fields], object]


class SelectorError(RemoteProtocolError, ValueError):
    """A selector that does not parse or is ill-typed: the subscriber's fault; the attach is refused
    (with RemoteProtocolError's condition, amqp:invalid-field)."""


# ---------------------------------------------------------------------------------------- tokens

_KEYWORDS = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"})
_OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",")
_APPROX = re.compile(r"(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+")
_EXACT = re.compile(r"[0-9]+")
_DIGITS = frozenset("0123456789")
_SPACE = " \t\n\r\f"


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "kw" (value upper-cased), "id", "str", "int", "float", "op", "end"
    value: object
    col: int  # 1-based column of its first character
    text: str  # as written, for messages


def _is_start(c: str) -> bool:
    return c.isalpha() or c in "_$"


def _is_part(c: str) -> bool:
    return c.isalnum() or c in "_$"


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _SPACE:
            i += 1
        if i >= n:
            out.append(_Token("end", None, n + 1, "the end"))
            return out
        c, col = text[i], i + 1
        if c == "'":
            j, parts = i + 1, []
            while True:
                k = text.find("'", j)
                if k < 0:
                    raise SelectorError(f"at column {col}: unterminated string literal")
                parts.append(text[j:k])
                if text.startswith("''", k):
                    parts.append("'")
                    j = k + 2
                    continue
                i = k + 1
                break
            out.append(_Token("str", "".join(parts), col, text[col - 1:i]))
            continue
        if c in _DIGITS or (c == "." and i + 1 < n and text[i + 1] in _DIGITS):
            m = _APPROX.match(text, i)
            if m:
                out.append(_Token("float", float(m.group()), col, m.group()))
            else:
                m = _EXACT.match(text, i)
                assert m is not None
                v = int(m.group())
                if v > _LONG_MAX + 1:  # + 1: '-9223372036854775808' is minus this literal
                    raise SelectorError(f"at column {col}: the number {m.group()} is beyond a 64-bit long")
                out.append(_Token("int", v, col, m.group()))
            i = m.end()
            if i < n and _is_start(text[i]):
                raise SelectorError(f"at column {i + 1}: unexpected {text[i]!r} after the number {m.group()}")
            continue
        if _is_start(c):
            j = i + 1
            while j < n and _is_part(text[j]):
                j += 1
            word = text[i:j]
            up = word.upper()
            if up in _KEYWORDS:
                out.append(_Token("kw", up, col, word))
            else:
                out.append(_Token("id", word, col, word))
            i = j
            continue
        for op in _OPERATORS:
            if text.startswith(op, i):
                out.append(_Token("op", op, col, op))
                i += len(op)
                break
        else:
            raise SelectorError(f"at column {col}: unexpected character {c!r}")


# ------------------------------------------------------------------------------ runtime values

_NULL, _BOOL, _NUM, _STR, _OTHER = 0, 1, 2, 3, 4
_CLASS_OF_TYPE: dict[type, int] = {bool: _BOOL, int: _NUM, float: _NUM, str: _STR, type(None): _NULL}


def _cls(v: object) -> int:
    c = _CLASS_OF_TYPE.get(type(v))
    if c is not None:
        return c
    if isinstance(v, bool):
        return _BOOL
    if isinstance(v, (int, float)):
        return _NUM
    if isinstance(v, str):
        return _STR
    return _OTHER


def _compare(op: str, a: object, b: object) -> Truth:
    """A comparison of two values: UNKNOWN on NULL or when their types differ."""
    ca, cb = _cls(a), _cls(b)
    if ca != cb or ca in (_NULL, _OTHER):
        return None
    if op == "=":
        return a == b
    if op == "<>":
        return a != b
    if ca != _NUM:
        return None
    x, y = a, b
    assert isinstance(x, (int, float)) and isinstance(y, (int, float))
    if op == "<":
        return x < y
    if op == "<=":
        return x <= y
    if op == ">":
        return x > y
    return x >= y


def _arith(op: str, a: object, b: object) -> object:
    """Arithmetic on two values: NULL unless both are numbers; NULL on a division by zero."""
    if _cls(a) != _NUM or _cls(b) != _NUM:
        return None
    x, y = a, b
    assert isinstance(x, (int, float)) and isinstance(y, (int, float))
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if y == 0:
        return None
    if type(x) is int and type(y) is int:
        q = abs(x) // abs(y)  # Java's long division: truncate toward zero
        return q if (x < 0) == (y < 0) else -q
    return x / y


_PLAIN_NUMBERS = (int, float)
_ORDER: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}

# ------------------------------------------------------------------------------------- parser

# static kinds of a compiled expression: what it can evaluate to
_K_BOOL, _K_NUM, _K_STR, _K_ANY = "a condition", "a number", "a string", "an identifier"


@dataclass(slots=True)
class _Expr:
    kind: str
    fn: _Eval
    col: int
    ident: str | None = None  # the name, when the expression is a bare identifier
    const: object = field(default=None)
    is_const: bool = False
    depth: int = 1  # levels of the tree below and including it, parentheses counted


def _const(kind: str, value: object, col: int) -> _Expr:
    def constant(_f: Fields) -> object:
        return value
    return _Expr(kind, constant, col, const=value, is_const=True)


def _cond(e: _Expr) -> Callable[[Fields], Truth]:
    """The expression as a condition: a bare identifier counts only when it holds a boolean."""
    if e.kind == _K_BOOL:
        return cast(Callable[[Fields], Truth], e.fn)  # (a boolean expression's evaluator returns a Truth)
    name = e.ident
    assert name is not None

    def ident_truth(f: Fields) -> Truth:
        v = f.get(name)
        return v if type(v) is bool else None
    return ident_truth


# binding powers, loosest first; an operator takes operands that bind tighter than it does
_BP_OR, _BP_AND, _BP_NOT, _BP_CMP, _BP_ADD, _BP_MUL, _BP_SIGN = 1, 2, 3, 4, 5, 6, 7
_CMP_OPS = ("=", "<>", "<", "<=", ">", ">=")
_CMP_WORDS = ("NOT", "BETWEEN", "IN", "LIKE", "IS")


class _Parser:
    """Precedence climbing (a Pratt parser): one `expr` frame per operand it descends into, so the
    Python stack it uses grows with the nesting of the selector only, never with its length; the
    nesting is counted on the way down (`level`) and on the way up (`_Expr.depth`) and refused past
    `MAX_DEPTH`."""

    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.level = 0

    # -- token helpers
    @property
    def tok(self) -> _Token:
        return self.toks[self.i]

    def take(self) -> _Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def is_kw(self, *words: str) -> bool:
        return self.tok.kind == "kw" and self.tok.value in words

    def is_op(self, *ops: str) -> bool:
        return self.tok.kind == "op" and self.tok.value in ops

    def fail(self, what: str) -> SelectorError:
        t = self.tok
        found = "the end" if t.kind == "end" else repr(t.text)
        return SelectorError(f"at column {t.col}: expected {what}, found {found}")

    def need(self, e: _Expr, kinds: tuple[str, ...], what: str, col: int) -> None:
        if e.kind not in kinds:
            raise SelectorError(f"at column {col}: {what}, found {e.kind}")

    def node(self, kind: str, fn: _Eval, col: int, at: int, *children: _Expr) -> _Expr:
        depth = 1 + max(c.depth for c in children)
        if depth > MAX_DEPTH:
            raise SelectorError(f"at column {at}: nesting deeper than {MAX_DEPTH} levels")
        return _Expr(kind, fn, col, depth=depth)

    def infix_bp(self) -> int:
        t = self.tok
        if t.kind == "op":
            v = t.value
            return _BP_CMP if v in _CMP_OPS else _BP_ADD if v in ("+", "-") else _BP_MUL if v in ("*", "/") else 0
        if t.kind == "kw":
            v = t.value
            return _BP_OR if v == "OR" else _BP_AND if v == "AND" else _BP_CMP if v in _CMP_WORDS else 0
        return 0

    # -- the grammar
    def selector(self) -> _Expr:
        e = self.expr(0)
        if self.tok.kind != "end":
            raise self.fail("an operator or the end")
        self.need(e, (_K_BOOL, _K_ANY), "the selector must be a condition", e.col)
        return e

    def expr(self, min_bp: int) -> _Expr:
        self.level += 1
        if self.level > MAX_DEPTH:
            raise SelectorError(f"at column {self.tok.col}: nesting deeper than {MAX_DEPTH} levels")
        left = self.prefix(min_bp)
        compared = False
        while True:
            bp = self.infix_bp()
            if bp <= min_bp:
                break
            if bp == _BP_CMP:
                if compared:
                    raise SelectorError(f"at column {self.tok.col}: comparisons do not chain; join them with AND")
                left, compared = self.comparison(left), True
            elif bp in (_BP_OR, _BP_AND):
                left = self.logical(left, "OR" if bp == _BP_OR else "AND", bp)
            else:
                left = self.arithmetic(left, ("+", "-") if bp == _BP_ADD else ("*", "/"), bp)
        self.level -= 1
        return left

    def prefix(self, min_bp: int) -> _Expr:
        t = self.tok
        if t.kind == "kw" and t.value == "NOT" and min_bp <= _BP_NOT:
            self.take()
            inner = self.expr(_BP_NOT)
            self.need(inner, (_K_BOOL, _K_ANY), "NOT takes a condition", t.col)
            g = _cond(inner)

            def not_(f: Fields) -> Truth:
                v = g(f)
                return None if v is None else not v
            return self.node(_K_BOOL, not_, t.col, t.col, inner)
        if t.kind == "op" and t.value in ("+", "-"):
            return self.sign(self.take())
        if t.kind == "op" and t.value == "(":
            self.take()
            inner = self.expr(0)
            if not self.is_op(")"):
                raise self.fail("')'")
            self.take()
            if inner.depth + 1 > MAX_DEPTH:
                raise SelectorError(f"at column {t.col}: nesting deeper than {MAX_DEPTH} levels")
            inner.depth += 1  # parentheses only group: no node, but a level (a bare identifier stays one)
            return inner
        if t.kind == "int":
            self.take()
            if t.value == _LONG_MAX + 1:
                raise SelectorError(f"at column {t.col}: the number {t.text} is beyond a 64-bit long")
            return _const(_K_NUM, t.value, t.col)
        if t.kind == "float":
            self.take()
            return _const(_K_NUM, t.value, t.col)
        if t.kind == "str":
            self.take()
            return _const(_K_STR, t.value, t.col)
        if t.kind == "kw" and t.value in ("TRUE", "FALSE"):
            self.take()
            return _const(_K_BOOL, t.value == "TRUE", t.col)
        if t.kind == "kw" and t.value == "NULL":
            raise SelectorError(f"at column {t.col}: NULL is not a value; test with IS NULL or IS NOT NULL")
        if t.kind == "id":
            self.take()
            name = str(t.value)
            return _Expr(_K_ANY, lambda f: f.get(name), t.col, ident=name)
        raise self.fail("a value, an identifier or '('")

    def sign(self, t: _Token) -> _Expr:
        if t.value == "-" and self.tok.kind == "int" and self.tok.value == _LONG_MAX + 1:
            return _const(_K_NUM, _LONG_MIN, self.take().col)  # the one long written only with its sign
        inner = self.expr(_BP_MUL)
        self.need(inner, (_K_NUM, _K_ANY), f"unary {t.value!r} takes a number", t.col)
        if inner.is_const:
            assert isinstance(inner.const, (int, float))
            return _const(_K_NUM, inner.const if t.value == "+" else -inner.const, t.col)
        g = inner.fn
        if t.value == "+":
            def plus(f: Fields) -> object:
                v = g(f)
                return v if _cls(v) == _NUM else None
            return self.node(_K_NUM, plus, t.col, t.col, inner)

        def neg(f: Fields) -> object:
            v = g(f)
            return -cast(float, v) if _cls(v) == _NUM else None
        return self.node(_K_NUM, neg, t.col, t.col, inner)

    def logical(self, first: _Expr, word: str, bp: int) -> _Expr:
        """A run of ANDs (or ORs): one node whose closure loops, however long the run."""
        parts, at = [first], self.tok.col
        while self.is_kw(word):
            t = self.take()
            parts.append(self.expr(bp))
            for p in (parts[0], parts[-1]):
                self.need(p, (_K_BOOL, _K_ANY), f"{word} takes conditions", t.col)
        fns = tuple(_cond(p) for p in parts)
        neutral = word == "AND"  # TRUE for AND, FALSE for OR: the value that decides nothing

        def run(f: Fields) -> Truth:
            unknown = False
            for g in fns:
                v = g(f)
                if v is None:
                    unknown = True
                elif v is not neutral:
                    return v  # FALSE decides an AND, TRUE an OR, whatever the rest
            return None if unknown else neutral
        return self.node(_K_BOOL, run, first.col, at, *parts)

    def arithmetic(self, first: _Expr, ops: tuple[str, ...], bp: int) -> _Expr:
        """A run of + and - (or * and /), left to right in a loop."""
        steps: list[tuple[str, _Eval]] = []
        parts, at = [first], self.tok.col
        while self.is_op(*ops):
            t = self.take()
            nxt = self.expr(bp)
            for e in (first, nxt):
                self.need(e, (_K_NUM, _K_ANY), f"{t.value!r} takes numbers", t.col)
            steps.append((str(t.value), nxt.fn))
            parts.append(nxt)
        head, tail = first.fn, tuple(steps)

        def run(f: Fields) -> object:
            v = head(f)
            for op, g in tail:
                v = _arith(op, v, g(f))
            return v
        return self.node(_K_NUM, run, first.col, at, *parts)

    def comparison(self, left: _Expr) -> _Expr:
        t = self.take()
        if t.kind == "op":
            return self.compare(str(t.value), left, self.expr(_BP_CMP), t)
        negate = False
        if t.value == "NOT":
            if not self.is_kw("BETWEEN", "IN", "LIKE"):
                raise SelectorError(f"at column {self.tok.col}: expected BETWEEN, IN or LIKE after NOT, found "
                                    + ("the end" if self.tok.kind == "end" else repr(self.tok.text)))
            negate, t = True, self.take()
        if t.value == "BETWEEN":
            return self.between(left, negate, t)
        if t.value == "IN":
            return self.in_list(left, negate, t)
        if t.value == "LIKE":
            return self.like(left, negate, t)
        return self.is_null(left, t)

    def compare(self, op: str, left: _Expr, right: _Expr, t: _Token) -> _Expr:
        for side in (left, right):
            if side.kind in (_K_STR, _K_BOOL) and op not in ("=", "<>"):
                raise SelectorError(f"at column {t.col}: {op!r} compares numbers only, found {side.kind}")
        a, b, o = left, right, op
        if a.is_const and b.ident is not None:  # 10 < qty: the identifier on the left
            a, b, o = b, a, {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)
        if a.ident is not None and b.is_const:
            return self.node(_K_BOOL, _ident_vs_const(o, a.ident, b.const), left.col, t.col, left, right)
        lf, rf = left.fn, right.fn
        return self.node(_K_BOOL, lambda f: _compare(op, lf(f), rf(f)), left.col, t.col, left, right)

    def between(self, left: _Expr, negate: bool, t: _Token) -> _Expr:
        low = self.expr(_BP_CMP)
        if not self.is_kw("AND"):
            raise self.fail("AND in BETWEEN")
        self.take()
        high = self.expr(_BP_CMP)
        for e in (left, low, high):
            self.need(e, (_K_NUM, _K_ANY), "BETWEEN takes numbers", t.col)
        x, lo, hi = left.fn, low.fn, high.fn

        def between_(f: Fields) -> Truth:
            v, low_v, high_v = x(f), lo(f), hi(f)
            if type(v) in _PLAIN_NUMBERS and type(low_v) in _PLAIN_NUMBERS and type(high_v) in _PLAIN_NUMBERS:
                return (cast(float, low_v) <= cast(float, v) <= cast(float, high_v)) != negate
            a = _compare(">=", v, low_v)
            if a is False:
                return negate
            b = _compare("<=", v, high_v)
            if b is False:
                return negate
            if a is None or b is None:
                return None
            return not negate
        return self.node(_K_BOOL, between_, left.col, t.col, left, low, high)

    def in_list(self, left: _Expr, negate: bool, t: _Token) -> _Expr:
        self.need(left, (_K_STR, _K_ANY), "IN takes a string", t.col)
        if not self.is_op("("):
            raise self.fail("'(' after IN")
        self.take()
        values: set[str] = set()
        while True:
            if self.tok.kind != "str":
                raise self.fail("a string literal (IN takes string literals only)")
            values.add(str(self.take().value))
            if self.is_op(","):
                self.take()
                continue
            if not self.is_op(")"):
                raise self.fail("',' or ')'")
            self.take()
            break
        x, frozen = left.fn, frozenset(values)

        def in_(f: Fields) -> Truth:
            v = x(f)
            if _cls(v) != _STR:
                return None
            return (v in frozen) != negate
        return self.node(_K_BOOL, in_, left.col, t.col, left)

    def like(self, left: _Expr, negate: bool, t: _Token) -> _Expr:
        self.need(left, (_K_STR, _K_ANY), "LIKE takes a string", t.col)
        if self.tok.kind != "str":
            raise self.fail("a string literal pattern after LIKE")
        pat_tok = self.take()
        escape: str | None = None
        if self.is_kw("ESCAPE"):
            self.take()
            if self.tok.kind != "str":
                raise self.fail("a string literal after ESCAPE")
            e = self.take()
            escape = str(e.value)
            if len(escape) != 1:
                raise SelectorError(f"at column {e.col}: ESCAPE takes one character, found {e.text}")
        test = _like_test(str(pat_tok.value), escape, pat_tok.col)
        x = left.fn

        def like_(f: Fields) -> Truth:
            v = x(f)
            if _cls(v) != _STR:
                return None
            return test(cast(str, v)) != negate
        return self.node(_K_BOOL, like_, left.col, t.col, left)

    def is_null(self, left: _Expr, t: _Token) -> _Expr:
        negate = False
        if self.is_kw("NOT"):
            self.take()
            negate = True
        if not self.is_kw("NULL"):
            raise self.fail("NULL after IS NOT" if negate else "NULL after IS")
        self.take()
        x = left.fn
        return self.node(_K_BOOL, lambda f: (x(f) is None) != negate, left.col, t.col, left)


def _ident_vs_const(op: str, name: str, c: object) -> Callable[[Fields], Truth]:
    """The common case (`region = 'eu'`, `qty > 10`): one lookup, one type test, one comparison."""
    want = _cls(c)
    if op in ("=", "<>"):
        eq = op == "="
        fast = (str,) if want == _STR else (bool,) if want == _BOOL else (int, float)

        def eq_(f: Fields) -> Truth:
            v = f.get(name)
            if type(v) in fast:
                return (v == c) == eq
            if v is None or _cls(v) != want:  # NULL, another type, or a subclass (checked slowly)
                return None
            return (v == c) == eq
        return eq_
    cmp = _ORDER[op]
    cn = cast(float, c)  # (a number: an order with another literal is refused at parse time)

    def order_(f: Fields) -> Truth:
        v = f.get(name)
        t = type(v)
        if t is int or t is float:
            return cmp(cast(float, v), cn)
        return _compare(op, v, c)
    return order_


def _like_test(pattern: str, escape: str | None, col: int) -> Callable[[str], bool]:
    """A LIKE pattern as a test of a string: the common shapes (`abc`, `abc%`, `%abc`, `%abc%`) as
    string methods, anything else as a regular expression matched whole."""
    pieces: list[str | None] = []  # a literal character, or None for %, or "" for _
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape:
            if i + 1 >= len(pattern):
                raise SelectorError(f"at column {col}: the LIKE pattern ends with its escape character")
            pieces.append(pattern[i + 1])
            i += 2
            continue
        pieces.append(None if ch == "%" else "" if ch == "_" else ch)
        i += 1
    lead = bool(pieces) and pieces[0] is None
    trail = len(pieces) > 1 and pieces[-1] is None
    middle = pieces[int(lead):len(pieces) - int(trail)]
    if all(p for p in middle):  # only literal characters between the optional % at each end
        lit = "".join(p for p in middle if p)
        if lead and trail:
            return lambda v: lit in v
        if lead:
            return lambda v: v.endswith(lit)
        if trail:
            return lambda v: v.startswith(lit)
        return lambda v: v == lit
    rx = re.compile("".join(".*" if p is None else "." if p == "" else re.escape(p) for p in pieces), re.S)
    return lambda v: rx.fullmatch(v) is not None


# ------------------------------------------------------------------------------------ public API

@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed selector: `matches` is true only when the expression is TRUE for `fields`."""

    text: str
    _fn: Callable[[Fields], Truth] = field(repr=False, compare=False)

    def matches(self, fields: Fields) -> bool:
        return self._fn(fields) is True


def parse(text: str) -> Selector:
    """Parse and compile a selector; raises `SelectorError` saying what is wrong and at which column."""
    if len(text) > MAX_TEXT:
        raise SelectorError(f"the selector is {len(text)} characters, more than {MAX_TEXT}")
    p = _Parser(text)
    e = p.selector()
    return Selector(text, _cond(e))


# -------------------------------------------------------------------------------- message fields

_QPID_TYPE_PREFIXES = ("AMQP_BINARY:", "AMQP_UUID:", "AMQP_ULONG:", "AMQP_STRING:", "AMQP_NO_PREFIX:")


def jms_id(value: object, *, correlation: bool = False) -> str | None:
    """An AMQP message-id or correlation-id as Qpid JMS shows it (JMSMessageID, JMSCorrelationID)."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.startswith("ID:"):
            return value if correlation else "ID:AMQP_NO_PREFIX:" + value
        if value.startswith(_QPID_TYPE_PREFIXES, 3):
            return "ID:AMQP_STRING:" + value
        return value
    if isinstance(value, uuid.UUID):
        return f"ID:AMQP_UUID:{value}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "ID:AMQP_BINARY:" + bytes(value).hex().upper()
    if isinstance(value, int) and not isinstance(value, bool):
        return f"ID:AMQP_ULONG:{value}"
    return None


def _property(v: object) -> object:
    """An application property's value as a selector sees it; `None` leaves it out."""
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return str(v)
    return None


def _skip_value(b: bytes, i: int) -> int:
    """The offset after the value at `i`, walking descriptors in a loop (`amqpmsg.skip` recurses once
    per descriptor, and a payload of many 0x00 bytes would exhaust the stack)."""
    pending = 1
    while pending:
        if i >= len(b):
            raise Unreadable(f"value expected at {i}, the bytes end")
        if b[i] == 0x00:  # a described value: its descriptor, then itself
            i += 1
            pending += 1
        else:
            i = skip(b, i)  # no descriptor here: compound values are skipped by their size
            pending -= 1
    return i


_BARE_HEAD = range(0x70, 0x75)  # header, annotations, properties, application-properties


def _head_sections(payload: bytes) -> bytes | None:
    """The sections a selector reads (all but the body and footer), or None when the bytes are not
    whole described sections end to end. Proton's decoder takes what it can read and drops the rest
    silently, so malformed bytes are told apart here; and the body, however large, is not decoded."""
    i, n, keep = 0, len(payload), []
    if n == 0:
        return None
    try:
        while i < n:
            if payload[i] != 0x00:
                return None
            d = payload[i + 1]
            code = payload[i + 2] if d == 0x53 else int.from_bytes(payload[i + 2:i + 10], "big") if d == 0x80 else None
            end = _skip_value(payload, i)
            if code is None or code in _BARE_HEAD:  # a symbolic descriptor: Proton knows its name
                keep.append(payload[i:end])
            i = end
    except (Unreadable, IndexError):
        return None
    return b"".join(keep)


def message_fields(payload: bytes) -> dict[str, object]:
    """The identifiers a selector may name, read from an encoded AMQP message (see the module's
    docstring); `{}` when the bytes do not decode."""
    from proton import Message, ProtonException  # only here: the sans-IO core imports this module

    head = _head_sections(payload)
    if head is None:
        return {}
    msg = Message()
    try:
        msg.decode(head)
        return _fields_of(msg)
    # Proton decodes some fields only when they are read, and what it raises on malformed bytes is
    # not one type (the fuzz test in tests/unit/test_selector.py found these); its Python side
    # recurses once per level of nested lists or maps (RecursionError)
    except (ProtonException, ValueError, TypeError, KeyError, IndexError, OverflowError, AttributeError,
            RecursionError):
        return {}


def _fields_of(msg: Message) -> dict[str, object]:
    out: dict[str, object] = {}
    props = msg.properties
    if isinstance(props, dict):
        for k, v in props.items():
            if isinstance(k, str):
                pv = _property(v)
                if pv is not None:
                    out[str(k)] = pv
    out["JMSDeliveryMode"] = "PERSISTENT" if msg.durable else "NON_PERSISTENT"
    out["JMSPriority"] = min(int(msg.priority), 9)
    for name, val in (("JMSMessageID", jms_id(msg.id)),
                      ("JMSCorrelationID", jms_id(msg.correlation_id, correlation=True))):
        if val is None:
            out.pop(name, None)
        else:
            out[name] = val
    out["JMSTimestamp"] = round(float(msg.creation_time) * 1000)
    if msg.subject is None:
        out.pop("JMSType", None)
    else:
        out["JMSType"] = str(msg.subject)
    if msg.expiry_time:
        out["JMSExpiration"] = round(float(msg.expiry_time) * 1000)
    elif msg.ttl:
        out.pop("JMSExpiration", None)
    else:
        out["JMSExpiration"] = 0
    if msg.group_id is None:
        out.pop("JMSXGroupID", None)
        out.pop("JMSXGroupSeq", None)
    else:
        out["JMSXGroupID"] = str(msg.group_id)
        out["JMSXGroupSeq"] = int(msg.group_sequence)
    user = msg.user_id
    if user:
        out["JMSXUserID"] = bytes(user).decode("utf-8", "replace")
    else:
        out.pop("JMSXUserID", None)
    out["JMSXDeliveryCount"] = int(msg.delivery_count) + 1
    return out
