"""JMS message selectors (common/selector.py): the spec's examples, SQL's three values, every refusal
with its message, the limits, random selectors against SQLite as a reference, and the identifiers
read from messages made with Proton.

How the SQLite reference is made to speak JMS (where the two differ):
- Types. SQLite converts between numbers and text and has no booleans; JMS says a comparison of
  different types is UNKNOWN. Each identifier's row holds its value and its JMS type ('n', 's', 'b' or
  NULL when absent; booleans stored as 0/1), and the translation guards each use of an identifier by
  the type its context needs (`CASE WHEN ta = 'n' THEN a END`): another type is NULL, i.e. UNKNOWN. A
  comparison of two bare identifiers compares when their types agree (any type for = and <>, numbers
  only for the others).
- LIKE. SQLite's LIKE ignores ASCII case and its case_sensitive_like pragma is deprecated; JMS's LIKE is
  case-sensitive. The reference uses GLOB (case-sensitive) with the pattern translated (% -> *,
  _ -> ?, an escaped character -> itself); the alphabet has no GLOB special character.
- Division. SQLite divides integers truncating toward zero and gives NULL on a division by zero, as the
  module does (Java's long division; UNKNOWN on zero): modelled by nothing, compared as they are.
- Overflow. Java's long wraps, SQLite turns to a float, Python's int grows: literals stay small (at
  most 20, and 70.0) and expressions shallow, so no product leaves 2**53.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import Message, char, float32, symbol, timestamp, ubyte, ulong

from oncemesh.common.selector import MAX_DEPTH, MAX_TEXT, SelectorError, message_fields, parse


def m(text: str, **fields: object) -> bool:
    return parse(text).matches(fields)


# ------------------------------------------------------------------ the spec's examples (JMS 2.0 3.8.1.1)


def test_the_spec_first_example_type_colour_and_weight() -> None:
    s = "JMSType = 'car' AND color = 'blue' AND weight > 2500"
    assert m(s, JMSType="car", color="blue", weight=2501)
    assert not m(s, JMSType="car", color="blue", weight=2500)
    assert not m(s, JMSType="car", color="red", weight=3000)
    assert not m(s, color="blue", weight=3000)  # JMSType NULL: UNKNOWN


@pytest.mark.parametrize("age, yes", [(14, False), (15, True), (17, True), (19, True), (20, False),
                                      (19.5, False), (15.0, True)])
def test_between_is_the_pair_of_comparisons(age: float, yes: bool) -> None:
    assert m("age BETWEEN 15 AND 19", age=age) is yes
    assert m("age >= 15 AND age <= 19", age=age) is yes
    assert m("age NOT BETWEEN 15 AND 19", age=age) is not yes
    assert m("age < 15 OR age > 19", age=age) is not yes


@pytest.mark.parametrize("country, yes", [("UK", True), ("US", True), ("France", True), ("Peru", False),
                                          ("uk", False), (" UK", False)])
def test_in_a_list_of_strings(country: str, yes: bool) -> None:
    assert m("Country IN ('UK', 'US', 'France')", Country=country) is yes
    assert m("Country NOT IN ('UK', 'US', 'France')", Country=country) is not yes


@pytest.mark.parametrize("pattern, value, yes", [
    ("12%3", "123", True), ("12%3", "12993", True), ("12%3", "1234", False),
    ("l_se", "lose", True), ("l_se", "loose", False),
    ("%", "", True), ("_", "", False), ("a%", "A", False),  # case-sensitive, unlike SQLite's LIKE
    ("a.b", "a.b", True), ("a.b", "axb", False),  # no regular-expression meaning leaks through
    ("%\n%", "x\ny", True),  # % spans line breaks
    # the shapes tested without a regular expression: literal, prefix, suffix, infix
    ("", "", True), ("", "a", False), ("ab", "ab", True), ("ab", "abc", False), ("ab%", "abc", True),
    ("ab%", "xab", False), ("%ab", "xab", True), ("%ab", "abx", False), ("%ab%", "xaby", True),
    ("%ab%", "a b", False), ("%%", "", True), ("%", "anything", True),
])
def test_like_patterns(pattern: str, value: str, yes: bool) -> None:
    assert m(f"phone LIKE '{pattern}'", phone=value) is yes
    assert m(f"phone NOT LIKE '{pattern}'", phone=value) is not yes


def test_like_with_an_escape_character() -> None:
    s = r"underscored LIKE '\_%' ESCAPE '\'"
    assert m(s, underscored="_foo")
    assert not m(s, underscored="bar")
    assert m("p LIKE '!%!!' ESCAPE '!'", p="%!")
    assert not m("p LIKE '!%!!' ESCAPE '!'", p="x!")


def test_is_null_and_is_not_null() -> None:
    assert m("prop_name IS NULL")
    assert not m("prop_name IS NULL", prop_name="")
    assert m("prop_name IS NOT NULL", prop_name=0)
    assert not m("prop_name IS NOT NULL")


@pytest.mark.parametrize("literal, value", [
    ("'it''s'", "it's"), ("''", ""), ("''''", "'"), ("57", 57), ("-957", -957), ("+62", 62),
    ("7E3", 7000.0), ("-57.9E2", -5790.0), ("7.", 7.0), (".5", 0.5), ("1.5e-1", 0.15),
    ("TRUE", True), ("true", True), ("False", False),
    ("-9223372036854775808", -(2 ** 63)), ("9223372036854775807", 2 ** 63 - 1),
])
def test_literals(literal: str, value: object) -> None:
    assert m(f"x = {literal}", x=value)
    assert not m(f"x <> {literal}", x=value)


def test_keywords_ignore_case_identifiers_do_not() -> None:
    assert m("a = 1 and not b = 2 Or c iS nUlL", a=1, b=3)
    assert not m("Region = 'eu'", region="eu")
    assert m("$x = 1 AND _y = 2 AND ünï = 3", **{"$x": 1, "_y": 2, "ünï": 3})


# ------------------------------------------------------------------ three values

T, F, U = "t", "f", None  # an identifier holding TRUE, FALSE, or absent (UNKNOWN)


def _fields(**vals: str | None) -> dict[str, object]:
    return {k: v == "t" for k, v in vals.items() if v is not None}


@pytest.mark.parametrize("a, b, and_, or_", [
    (T, T, True, True), (T, F, False, True), (T, U, None, True),
    (F, F, False, False), (F, U, False, None), (U, U, None, None),
])
def test_and_or_follow_sql_three_valued_logic(a: str | None, b: str | None, and_: bool | None,
                                              or_: bool | None) -> None:
    for x, y in ((a, b), (b, a)):
        f = _fields(a=x, b=y)
        assert parse("a AND b").matches(f) is (and_ is True)
        assert parse("NOT (a AND b)").matches(f) is (and_ is False)
        assert parse("a OR b").matches(f) is (or_ is True)
        assert parse("NOT (a OR b)").matches(f) is (or_ is False)


def test_not_unknown_is_unknown() -> None:
    assert not m("x > 1") and not m("NOT x > 1") and not m("NOT NOT x > 1")
    assert m("NOT x > 1", x=1) and not m("NOT x > 1", x=2)


@pytest.mark.parametrize("text, fields", [
    ("b = 1", {"b": True}), ("b <> 1", {"b": True}), ("n = TRUE", {"n": 1}), ("s = 1", {"s": "1"}),
    ("s <> 1", {"s": "1"}), ("n = '1'", {"n": 1}), ("s > 1", {"s": "2"}), ("b > 0", {"b": True}),
    ("s < t", {"s": "a", "t": "b"}), ("b >= c", {"b": True, "c": False}), ("s + 1 = 2", {"s": "1"}),
    ("b", {"b": 1}), ("b", {"b": "TRUE"}), ("s LIKE '%'", {"s": 5}), ("s IN ('5')", {"s": 5}),
    ("s NOT IN ('5')", {"s": 5}), ("s NOT LIKE 'x'", {"s": 5}), ("x = 1", {"x": b"1"}),
    ("x BETWEEN 1 AND 3", {"x": "2"}), ("-s = -1", {"s": "1"}), ("+s = 1", {"s": "1"}),
])
def test_comparing_different_types_is_unknown(text: str, fields: dict[str, object]) -> None:
    """Neither the expression nor its negation matches: a type mismatch is UNKNOWN, not FALSE."""
    assert not parse(text).matches(fields)
    assert not parse(f"NOT ({text})").matches(fields)


def test_numbers_compare_across_int_and_float_booleans_and_strings_only_equal() -> None:
    assert m("x = 2", x=2.0) and m("x < 2.5", x=2) and m("x / 2 = 1.5", x=3.0)
    assert m("b = TRUE", b=True) and m("b <> FALSE", b=True) and m("s = 'a' AND s <> 'b'", s="a")
    assert m("a = b", a="x", b="x") and m("a = b", a=True, b=True) and m("a = b", a=1, b=1.0)
    assert m("(x > 1) = TRUE", x=2) and not m("(x > 1) = TRUE") and not m("NOT ((x > 1) = TRUE)")


def test_division_by_zero_is_unknown_and_exact_division_truncates_toward_zero() -> None:
    for text in ("x / 0 = 0", "x / 0.0 > 1", "x / 0 IS NULL", "1.5 / z > 0"):
        assert not m(text, x=1, z=0) or text.endswith("IS NULL")
    assert m("x / 0 IS NULL", x=1)  # the NULL it makes is a value like any other NULL
    assert not m("NOT (x / 0 = 0)", x=1)
    assert m("x / 2 = -3", x=-7) and m("x / 2 = 3", x=7) and m("x / -2 = -3", x=7) and m("x / 2.0 = -3.5", x=-7)


def test_arithmetic_precedence() -> None:
    assert m("1 + 2 * 3 = 7") and m("(1 + 2) * 3 = 9") and m("10 - 4 - 3 = 3") and m("8 / 4 / 2 = 1")
    assert m("- 2 * 3 = -6") and m("-x * -x = 4", x=2) and m("x - -1 = 3", x=2)
    assert m("a = 1 OR a = 2 AND b = 3", a=1)  # AND binds tighter than OR
    assert not m("(a = 1 OR a = 2) AND b = 3", a=1)
    assert m("NOT a = 2 AND b = 3", a=1, b=3)  # NOT binds tighter than AND


def test_a_property_of_another_type_is_present_but_compares_unknown() -> None:
    f = {"x": uuid.UUID(int=1)}
    assert parse("x IS NOT NULL").matches(f)
    assert not parse("x = 'a'").matches(f) and not parse("x <> 'a'").matches(f)


def test_subclasses_of_the_value_types_count_as_the_type() -> None:
    assert m("s = 'a' AND n = 3 AND n > 2 AND f > 1.4", s=symbol("a"), n=ubyte(3), f=float32(1.5))
    assert m("a = b", a=symbol("a"), b="a")


# ------------------------------------------------------------------ refusals

@pytest.mark.parametrize("text, message", [
    ("", "at column 1: expected a value, an identifier or '(', found the end"),
    ("   ", "at column 4: expected a value, an identifier or '(', found the end"),
    ("a = 'x", "at column 5: unterminated string literal"),
    ("a = 1 #", "at column 7: unexpected character '#'"),
    ("a = 1 AND (b = 2", "at column 17: expected ')', found the end"),
    ("a = 1 b", "at column 7: expected an operator or the end, found 'b'"),
    ("(a = 1))", "at column 8: expected an operator or the end, found ')'"),
    ("a = b = c", "at column 7: comparisons do not chain; join them with AND"),
    ("(a < b < c)", "at column 8: comparisons do not chain; join them with AND"),
    ("a = NULL", "at column 5: NULL is not a value; test with IS NULL or IS NOT NULL"),
    ("NULL = 1", "at column 1: NULL is not a value; test with IS NULL or IS NOT NULL"),
    ("AND = 1", "at column 1: expected a value, an identifier or '(', found 'AND'"),
    ("a = 1 AND", "at column 10: expected a value, an identifier or '(', found the end"),
    ("a IN (1, 2)", "at column 7: expected a string literal (IN takes string literals only), found '1'"),
    ("a IN ('x' 'y')", "at column 11: expected ',' or ')', found \"'y'\""),
    ("a IN 'x'", "at column 6: expected '(' after IN, found \"'x'\""),
    ("a IN ()", "at column 7: expected a string literal (IN takes string literals only), found ')'"),
    ("a LIKE b", "at column 8: expected a string literal pattern after LIKE, found 'b'"),
    ("a LIKE 'x' ESCAPE '!!'", "at column 19: ESCAPE takes one character, found '!!'"),
    ("a LIKE 'x' ESCAPE ''", "at column 19: ESCAPE takes one character, found ''"),
    ("a LIKE 'x' ESCAPE b", "at column 19: expected a string literal after ESCAPE, found 'b'"),
    ("a LIKE 'x!' ESCAPE '!'", "at column 8: the LIKE pattern ends with its escape character"),
    ("a BETWEEN 1 OR 2", "at column 13: expected AND in BETWEEN, found 'OR'"),
    ("a IS 1", "at column 6: expected NULL after IS, found '1'"),
    ("a IS NOT 1", "at column 10: expected NULL after IS NOT, found '1'"),
    ("a NOT = 1", "at column 7: expected BETWEEN, IN or LIKE after NOT, found '='"),
    ("a + 1", "at column 1: the selector must be a condition, found a number"),
    ("'x'", "at column 1: the selector must be a condition, found a string"),
    ("a = 1 AND 2", "at column 7: AND takes conditions, found a number"),
    ("'x' OR a", "at column 5: OR takes conditions, found a string"),
    ("NOT 3", "at column 1: NOT takes a condition, found a number"),
    ("a + 'x' = 1", "at column 3: '+' takes numbers, found a string"),
    ("(a = 1) * 2 = 2", "at column 9: '*' takes numbers, found a condition"),
    ("-'x' = 1", "at column 1: unary '-' takes a number, found a string"),
    ("a < 'x'", "at column 3: '<' compares numbers only, found a string"),
    ("TRUE >= a", "at column 6: '>=' compares numbers only, found a condition"),
    ("'x' BETWEEN 1 AND 2", "at column 5: BETWEEN takes numbers, found a string"),
    ("1 LIKE 'x'", "at column 3: LIKE takes a string, found a number"),
    ("1 IN ('x')", "at column 3: IN takes a string, found a number"),
    ("a = 9223372036854775808", "at column 5: the number 9223372036854775808 is beyond a 64-bit long"),
    ("a = 99999999999999999999", "at column 5: the number 99999999999999999999 is beyond a 64-bit long"),
    ("a = 12abc", "at column 7: unexpected 'a' after the number 12"),
    ("a = 1.5.5", "at column 8: expected an operator or the end, found '.5'"),
    ("a = 1 AND b ! 2", "at column 13: unexpected character '!'"),
])
def test_a_bad_selector_is_refused_saying_what_and_where(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as e:
        parse(text)
    assert str(e.value) == message
    assert isinstance(e.value, ValueError) and e.value.condition == "amqp:invalid-field"


def test_the_text_is_at_most_4096_characters() -> None:
    ok = "a = 1" + " " * (MAX_TEXT - 5)
    assert len(ok) == MAX_TEXT and parse(ok).matches({"a": 1})
    with pytest.raises(SelectorError, match=f"the selector is {MAX_TEXT + 1} characters, more than {MAX_TEXT}"):
        parse(ok + " ")


@pytest.mark.parametrize("opening, closing", [("(", ")"), ("NOT ", ""), ("-", "")])
def test_nesting_is_at_most_100_levels(opening: str, closing: str) -> None:
    """`a = 1` is two levels; each parenthesis, NOT or sign around it (or around `a`) one more."""
    def nested(k: int) -> str:
        if opening == "-":
            return "-" * k + "a = 1"
        return opening * k + "a = 1" + closing * k
    assert MAX_DEPTH == 100
    k = MAX_DEPTH - 2
    want = opening == "(" or k % 2 == 0
    assert parse(nested(k)).matches({"a": 1 if opening != "-" else (-1) ** k}) is want
    with pytest.raises(SelectorError, match=f"nesting deeper than {MAX_DEPTH} levels"):
        parse(nested(k + 1))
    with pytest.raises(SelectorError, match=f"nesting deeper than {MAX_DEPTH} levels"):
        parse(nested(1000))  # refused on the way down, before the stack runs out


CONDITION_LEVELS = ("a OR b AND NOT (", ") = TRUE")  # OR, AND, NOT, =, parentheses: 5 levels a round
NUMBER_LEVELS = ("d + e * -(", ")")  # +, *, -, parentheses: 4 levels a round


def _rounds(unit: tuple[str, str], k: int, core: str) -> str:
    return unit[0] * k + core + unit[1] * k


def test_nesting_counts_operators_of_every_level() -> None:
    """Nested operators of different precedence count as levels without parentheses too: the depth
    of the tree is what evaluation descends."""
    assert not parse(_rounds(CONDITION_LEVELS, 19, "x")).matches({})  # 19 * 5 + 1 = 96
    with pytest.raises(SelectorError, match=f"nesting deeper than {MAX_DEPTH} levels"):
        parse(_rounds(CONDITION_LEVELS, 20, "x"))  # 101
    assert parse(_rounds(NUMBER_LEVELS, 24, "f") + " = 1").matches({"f": 1, "d": 0, "e": 1})  # 24 * 4 + 3 = 99
    with pytest.raises(SelectorError, match=f"nesting deeper than {MAX_DEPTH} levels"):
        parse(_rounds(NUMBER_LEVELS, 25, "f") + " = 1")


def test_at_the_limit_parsing_and_evaluating_fit_in_a_stack_already_much_used() -> None:
    """The deepest selectors allowed parse and evaluate with all but 400 frames of the stack used."""
    import inspect
    import sys
    worst = ["(" * 98 + "a = 1" + ")" * 98, "NOT " * 98 + "a = 1", _rounds(CONDITION_LEVELS, 19, "a"),
             _rounds(NUMBER_LEVELS, 24, "a") + " = 1"]

    def at_depth(n: int, text: str) -> bool:
        return parse(text).matches({"a": 1}) if n == 0 else at_depth(n - 1, text)
    for text in worst:
        at_depth(sys.getrecursionlimit() - len(inspect.stack()) - 400, text)


@pytest.mark.parametrize("op", ["AND", "OR"])
def test_long_chains_evaluate_in_loops_not_recursion(op: str) -> None:
    n = MAX_TEXT // 8
    text = f" {op} ".join(f"x{i % 10} = 1" for i in range(n))[:MAX_TEXT].rsplit(f" {op} ", 1)[0]
    fields = {f"x{i}": 1 for i in range(10)}
    assert parse(text).matches(fields)
    arith = "x" + " + x" * ((MAX_TEXT - 10) // 4) + " > 0"
    assert len(arith) <= MAX_TEXT and parse(arith).matches({"x": 1})


@given(st.text(max_size=60) | st.text(alphabet="ab()'=<>NOTANDORISNUL 1.5E-+*/,%_\\", max_size=60))
def test_any_text_parses_or_is_refused_with_a_selector_error(text: str) -> None:
    try:
        s = parse(text)
    except SelectorError as e:
        assert str(e)
    else:
        s.matches({"a": 1, "b": "x"})


# ------------------------------------------------------------------ random selectors against SQLite

IDS = ("a", "b", "c")
STR_ALPHABET = "aAb%_!"


@dataclass(frozen=True)
class Ex:
    jms: str
    sql: str
    ident: str | None = None  # a bare identifier


def _num_guard(name: str) -> str:
    return f"(CASE WHEN t{name} = 'n' THEN {name} END)"


def _num_leaf() -> st.SearchStrategy[Ex]:
    ints = st.integers(0, 20).map(lambda v: Ex(str(v), str(v)))
    floats = st.sampled_from([("7.", "7.0"), (".5", "0.5"), ("2.5", "2.5"), ("7E1", "70.0"), ("1.5e-1", "0.15"),
                              ("0.0", "0.0")]).map(lambda p: Ex(p[0], p[1]))
    idents = st.sampled_from(IDS).map(lambda n: Ex(n, _num_guard(n), n))
    return ints | floats | idents


def _num_extend(inner: st.SearchStrategy[Ex]) -> st.SearchStrategy[Ex]:
    binary = st.tuples(inner, st.sampled_from("+-*/"), inner).map(
        lambda t: Ex(f"({t[0].jms} {t[1]} {t[2].jms})", f"({t[0].sql} {t[1]} {t[2].sql})"))
    negated = inner.map(lambda e: Ex(f"-({e.jms})", f"(-({e.sql}))"))
    return binary | negated


NUM = st.recursive(_num_leaf(), _num_extend, max_leaves=5)
KW = {w: st.sampled_from([w, w.lower(), w.capitalize()]) for w in ("AND", "OR", "NOT", "BETWEEN", "IN", "LIKE",
                                                                      "IS", "NULL", "ESCAPE", "TRUE", "FALSE")}


@st.composite
def _num_comparison(draw: st.DrawFn) -> Ex:
    left, op, right = draw(NUM), draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="])), draw(NUM)
    if left.ident and right.ident:  # two bare identifiers: they compare when their types agree
        a, b = left.ident, right.ident
        guard = f"t{a} = t{b}" if op in ("=", "<>") else f"t{a} = 'n' AND t{b} = 'n'"
        return Ex(f"{a} {op} {b}", f"(CASE WHEN {guard} THEN {a} {op} {b} END)")
    return Ex(f"{left.jms} {op} {right.jms}", f"({left.sql} {op} {right.sql})")


def _str_lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


@st.composite
def _typed_comparison(draw: st.DrawFn) -> Ex:
    name, op = draw(st.sampled_from(IDS)), draw(st.sampled_from(["=", "<>"]))
    if draw(st.booleans()):
        lit = draw(st.text(STR_ALPHABET, max_size=2))
        jms, sql, kind = _str_lit(lit), _str_lit(lit), "s"
    else:
        b = draw(st.booleans())
        jms, sql, kind = draw(KW["TRUE" if b else "FALSE"]), str(int(b)), "b"
    expr = f"{name} {op} {jms}" if draw(st.booleans()) else f"{jms} {op} {name}"
    return Ex(expr, f"(CASE WHEN t{name} = '{kind}' THEN {name} {op} {sql} END)")


def _maybe_not(draw: st.DrawFn) -> tuple[str, str]:
    """(" NOT" as the selector spells it, " NOT" for SQLite), or two empty strings."""
    return (f" {draw(KW['NOT'])}", " NOT") if draw(st.booleans()) else ("", "")


@st.composite
def _between(draw: st.DrawFn) -> Ex:
    x, lo, hi = draw(NUM), draw(NUM), draw(NUM)
    n_j, n_s = _maybe_not(draw)
    return Ex(f"{x.jms}{n_j} {draw(KW['BETWEEN'])} {lo.jms} {draw(KW['AND'])} {hi.jms}",
              f"({x.sql}{n_s} BETWEEN {lo.sql} AND {hi.sql})")


@st.composite
def _in_list(draw: st.DrawFn) -> Ex:
    name, (n_j, n_s) = draw(st.sampled_from(IDS)), _maybe_not(draw)
    items = ", ".join(_str_lit(v) for v in draw(st.lists(st.text(STR_ALPHABET, max_size=2), min_size=1, max_size=3)))
    return Ex(f"{name}{n_j} {draw(KW['IN'])} ({items})", f"(CASE WHEN t{name} = 's' THEN {name}{n_s} IN ({items}) END)")


@st.composite
def _like(draw: st.DrawFn) -> Ex:
    name, (n_j, n_s), escaped = draw(st.sampled_from(IDS)), _maybe_not(draw), draw(st.booleans())
    pieces = draw(st.lists(st.sampled_from(["a", "A", "b", "%", "_"] + (["!%", "!_", "!!"] if escaped else ["!"])),
                           max_size=4))
    pattern = "".join(pieces)
    glob = "".join(p[1] if len(p) == 2 else "*" if p == "%" else "?" if p == "_" else p for p in pieces)
    esc = f" {draw(KW['ESCAPE'])} '!'" if escaped else ""
    return Ex(f"{name}{n_j} {draw(KW['LIKE'])} '{pattern}'{esc}",
              f"(CASE WHEN t{name} = 's' THEN {name}{n_s} GLOB '{glob}' END)")


@st.composite
def _is_null(draw: st.DrawFn) -> Ex:
    name, (n_j, n_s) = draw(st.sampled_from(IDS)), _maybe_not(draw)
    return Ex(f"{name} {draw(KW['IS'])}{n_j} {draw(KW['NULL'])}", f"({name} IS{n_s} NULL)")


@st.composite
def _bare(draw: st.DrawFn) -> Ex:
    if draw(st.booleans()):
        name = draw(st.sampled_from(IDS))
        return Ex(name, f"(CASE WHEN t{name} = 'b' THEN {name} END)")
    b = draw(st.booleans())
    return Ex(draw(KW["TRUE" if b else "FALSE"]), str(int(b)))


def _cond_extend(inner: st.SearchStrategy[Ex]) -> st.SearchStrategy[Ex]:
    @st.composite
    def joined(draw: st.DrawFn) -> Ex:
        parts = draw(st.lists(inner, min_size=2, max_size=3))
        word = draw(st.sampled_from(["AND", "OR"]))
        return Ex(f" {draw(KW[word])} ".join(f"({p.jms})" for p in parts), "(" + f" {word} ".join(p.sql for p in parts) + ")")

    @st.composite
    def negated(draw: st.DrawFn) -> Ex:
        e = draw(inner)
        return Ex(f"{draw(KW['NOT'])} ({e.jms})", f"(NOT {e.sql})")
    return joined() | negated()


COND = st.recursive(_num_comparison() | _typed_comparison() | _between() | _in_list() | _like() | _is_null() | _bare(),
                    _cond_extend, max_leaves=6)
VALUE = st.one_of(st.none(), st.integers(-20, 20), st.sampled_from([-2.5, -1.0, 0.0, 0.5, 2.0, 7.25]),
                  st.text(STR_ALPHABET, max_size=3), st.booleans())


@pytest.fixture(scope="module")
def sqlite() -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (" + ", ".join(f"{n}, t{n}" for n in IDS) + ")")  # no affinity: values as given
    yield db
    db.close()


def _jms_type(v: object) -> str | None:
    return None if v is None else "b" if isinstance(v, bool) else "s" if isinstance(v, str) else "n"


@settings(max_examples=600, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(COND, st.tuples(VALUE, VALUE, VALUE))
def test_random_selectors_agree_with_sqlite(sqlite: sqlite3.Connection, expr: Ex,
                                            values: tuple[object, object, object]) -> None:
    row: list[object] = []
    for v in values:
        row += [int(v) if isinstance(v, bool) else v, _jms_type(v)]
    sqlite.execute("DELETE FROM t")
    sqlite.execute(f"INSERT INTO t VALUES ({', '.join('?' * len(row))})", row)
    (want,) = sqlite.execute(f"SELECT CASE WHEN {expr.sql} THEN 1 ELSE 0 END FROM t").fetchone()
    fields = {n: v for n, v in zip(IDS, values, strict=True) if v is not None}
    assert parse(expr.jms).matches(fields) is bool(want), (expr.jms, expr.sql, fields)


def test_the_reference_itself_tells_the_cases_apart(sqlite: sqlite3.Connection) -> None:
    """SQLite as set up says what the module must: a guard makes a type mismatch NULL; GLOB keeps case."""
    sqlite.execute("DELETE FROM t")
    sqlite.execute("INSERT INTO t VALUES ('1', 's', 'A', 's', NULL, NULL)")
    q = "SELECT CASE WHEN {} THEN 1 WHEN NOT ({}) THEN 0 END FROM t"
    assert sqlite.execute(q.format(*[f"{_num_guard('a')} = 1"] * 2)).fetchone() == (None,)
    assert sqlite.execute(q.format(*["b GLOB 'a'"] * 2)).fetchone() == (0,)
    assert sqlite.execute("SELECT -7 / 2, 7 / 0, 7.0 / 0").fetchone() == (-3, None, None)


# ------------------------------------------------------------------ message fields

def _encoded(**attrs: object) -> bytes:
    msg = Message(body="x")
    for k, v in attrs.items():
        setattr(msg, k, v)
    return msg.encode()


def test_application_properties_by_name_with_their_types() -> None:
    f = message_fields(_encoded(properties={"region": "eu", "qty": 11, "big": ulong(2 ** 63), "f": float32(1.5),
                                            "d": 2.25, "on": True, "sym": symbol("s"), "ch": char("c"),
                                            "ts": timestamp(5), "bin": b"\x01", "u": uuid.UUID(int=7)}))
    for k, v in {"region": "eu", "qty": 11, "big": 2 ** 63, "f": 1.5, "d": 2.25, "on": True, "sym": "s", "ch": "c",
                 "ts": 5}.items():
        assert f[k] == v and type(f[k]) is type(v), k
    assert "bin" not in f and "u" not in f
    assert parse("region = 'eu' AND qty > 10 AND on AND sym = 's'").matches(f)


def test_jms_headers_of_a_bare_message() -> None:
    f = message_fields(_encoded())
    assert f == {"JMSDeliveryMode": "NON_PERSISTENT", "JMSPriority": 4, "JMSTimestamp": 0, "JMSExpiration": 0,
                 "JMSXDeliveryCount": 1}
    assert parse("JMSMessageID IS NULL AND JMSType IS NULL AND JMSCorrelationID IS NULL").matches(f)


def test_jms_headers_from_header_and_properties() -> None:
    f = message_fields(_encoded(durable=True, priority=7, id="ID:abc", correlation_id="req-1", subject="car",
                                creation_time=1700000000.123, expiry_time=1700000060.5, group_id="g",
                                group_sequence=3, user_id=b"bob", delivery_count=2))
    assert f == {"JMSDeliveryMode": "PERSISTENT", "JMSPriority": 7, "JMSMessageID": "ID:abc",
                 "JMSCorrelationID": "req-1", "JMSType": "car", "JMSTimestamp": 1700000000123,
                 "JMSExpiration": 1700000060500, "JMSXGroupID": "g", "JMSXGroupSeq": 3, "JMSXUserID": "bob",
                 "JMSXDeliveryCount": 3}
    assert parse("JMSDeliveryMode = 'PERSISTENT' AND JMSPriority > 5 AND JMSType = 'car'").matches(f)


def test_priority_above_nine_reads_as_nine_and_ttl_alone_leaves_expiration_null() -> None:
    f = message_fields(_encoded(priority=200, ttl=30.0))
    assert f["JMSPriority"] == 9 and "JMSExpiration" not in f


@pytest.mark.parametrize("value, message_id, correlation_id", [
    ("ID:abc", "ID:abc", "ID:abc"),
    ("abc", "ID:AMQP_NO_PREFIX:abc", "abc"),
    ("ID:AMQP_UUID:x", "ID:AMQP_STRING:ID:AMQP_UUID:x", "ID:AMQP_STRING:ID:AMQP_UUID:x"),
    (uuid.UUID(int=1), "ID:AMQP_UUID:00000000-0000-0000-0000-000000000001",
     "ID:AMQP_UUID:00000000-0000-0000-0000-000000000001"),
    (ulong(42), "ID:AMQP_ULONG:42", "ID:AMQP_ULONG:42"),
    (b"\x01\xab", "ID:AMQP_BINARY:01AB", "ID:AMQP_BINARY:01AB"),
])
def test_message_and_correlation_ids_as_qpid_jms_renders_them(value: object, message_id: str,
                                                              correlation_id: str) -> None:
    f = message_fields(_encoded(id=value, correlation_id=value))
    assert f["JMSMessageID"] == message_id and f["JMSCorrelationID"] == correlation_id


def test_header_names_win_over_application_properties() -> None:
    f = message_fields(_encoded(priority=2, properties={"JMSPriority": 8, "JMSType": "fake", "other": 1}))
    assert f["JMSPriority"] == 2 and "JMSType" not in f and f["other"] == 1


@pytest.mark.parametrize("payload", [b"", b"\x00", b"garbage", b"\x00\x53\x77\xa1\x05ab", b"\x00\x53\x74\xc1\x03\x02"])
def test_bytes_that_do_not_decode_give_no_fields(payload: bytes) -> None:
    assert message_fields(payload) == {}


@settings(max_examples=500)
@given(st.data())
def test_mangled_messages_never_raise(data: st.DataObject) -> None:
    good = _encoded(durable=True, id="ID:x", subject="s", properties={"a": 1, "s": "x"})
    cut = data.draw(st.integers(0, len(good)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(good) - 1), st.integers(0, 255)), max_size=3))
    b = bytearray(good[:cut] if data.draw(st.booleans()) else good)
    for i, v in flips:
        if i < len(b):
            b[i] = v
    f = message_fields(bytes(b))
    assert isinstance(f, dict)
    parse("a = 1 OR s LIKE 'x%' OR JMSType = 's'").matches(f)


def _nested_lists(levels: int) -> bytes:
    """A list of a list of ... of an empty list, `levels` deep (list32 encodings)."""
    heads, size = [], 1
    for _ in range(levels):
        heads.append(b"\xd0" + (4 + size).to_bytes(4, "big") + (1).to_bytes(4, "big"))
        size += 9
    return b"".join(reversed(heads)) + b"\x45"


@pytest.mark.parametrize("payload", [
    b"\x00" * 5000,  # descriptors of descriptors: a recursive walk would exhaust the stack
    b"\x00\x53\x74" + _nested_lists(2000),  # application properties nested deeper than Proton's Python can
])
def test_deeply_nested_bytes_give_no_fields_and_no_recursion_error(payload: bytes) -> None:
    assert message_fields(payload) == {}


def test_application_properties_that_are_not_a_map_give_no_properties() -> None:
    f = message_fields(b"\x00\x53\x74" + b"\x00\x53\x01" * 3000 + b"\x40")  # described values, nested
    assert f == {"JMSDeliveryMode": "NON_PERSISTENT", "JMSPriority": 4, "JMSTimestamp": 0, "JMSExpiration": 0,
                 "JMSXDeliveryCount": 1}


@pytest.mark.parametrize("value", [_nested_lists(2000), b"\x00\x53\x01" * 3000 + b"\x40"])
def test_the_body_is_not_decoded_however_it_is_made(value: bytes) -> None:
    head = _encoded(subject="car", properties={"a": 1})
    at = head.index(b"\x00\x53\x77")  # the encoded body of `_encoded`, replaced by one Proton could
    f = message_fields(head[:at] + b"\x00\x53\x77" + value)  # not turn into Python values
    assert f["JMSType"] == "car" and f["a"] == 1


def test_importing_the_module_loads_no_proton() -> None:
    """The sans-IO core may import it: Proton comes with `message_fields` only."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import sys, oncemesh.common.selector as s; "
                          "s.parse(\"a = 'x'\"); print('proton' in sys.modules)"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "False"
