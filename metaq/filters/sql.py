"""SQL92 filters: RocketMQ's message selector over a message's properties, compiled once, evaluated per message.

``compile_sql(text)`` parses an expression (a hand-written tokenizer and recursive-descent parser of RocketMQ's
``SelectorParser`` grammar) into a ``SqlFilter`` whose ``matches(properties)`` says whether a message with those
properties (a dict of strings; TAGS, KEYS and the user's own) is wanted. A bad expression raises
``BadFilterExpression`` naming the character index (0-based) and what the grammar expected there, as do the named
limits: ``limits.MAX_SQL_FILTER_CHARS``, ``MAX_SQL_FILTER_DEPTH``, ``MAX_SQL_FILTER_IN_ITEMS``.

The grammar (keywords in any case), loosest first::

    OR, AND                                   n-ary, left to right, stopping at the first TRUE / FALSE
    =  <>  IS [NOT] NULL                      chains allowed: (a = b) = c
    >  >=  <  <=  [NOT] BETWEEN x AND y  [NOT] IN ('s', ...)  [NOT] CONTAINS|STARTSWITH|ENDSWITH 's'
    NOT  +  -                                 prefix: ``NOT a = 1`` is ``(NOT a) = 1``, as RocketMQ parses it;
                                              write ``NOT (a = 1)``
    literals: 12, 12L, 1.5, 1., .5, 1E3, 'it''s', TRUE, FALSE, NULL; names [A-Za-z_$][A-Za-z0-9_$]*
    comments: -- to the end of the line, /* ... */

Evaluation is RocketMQ's (its ComparisonExpression, LogicExpression, UnaryExpression), SQL's three-valued logic:
a missing property is NULL, a comparison with NULL is unknown, AND/OR/NOT carry unknown, and only TRUE matches
(``a <> 'x'`` does not match a message without ``a``; ``a IS NULL`` does). Property values are strings, converted
to the other side's type: to a 32-bit int against an integer literal that fits one (Java's Integer.valueOf: an
optional sign and decimal digits), to a 64-bit long against a larger one, to a double against a float literal
(Java's Double.valueOf: surrounding spaces, NaN, Infinity, an f/d suffix; not hexadecimal), to a boolean against
TRUE/FALSE (``'true'`` in any case is TRUE, anything else FALSE). Numbers are widened to each other (a double
against an int compares as doubles; NaN above everything, -0.0 below 0.0, as Java's Double.compareTo). ``=``
between two strings is exact (``a = '10'`` does not match ``010``; ``a = 10`` does); two strings under ``<``
``>`` ... are both read as doubles. A failed conversion anywhere makes the whole message not match (RocketMQ's
broker logs the exception and skips the message), whatever OR's other side says -- unless evaluation stopped
before it. IN and CONTAINS / STARTSWITH / ENDSWITH see only strings: on NULL, IN is unknown and the
CONTAINS family FALSE (``NOT CONTAINS`` too); an empty search string never matches. A property on its own where
a condition is wanted (``a AND b = 1``) is unknown when missing and FALSE otherwise (a string is no boolean).
Compile errors as RocketMQ's: NULL beside ``=``/``<>``, a string or boolean literal beside ``<`` ``>`` ...,
BETWEEN with a NULL bound or its low bound above its high one, IN after anything but a property, a float literal
of 0 or below Double.MIN_VALUE, an integer past the 64-bit range.

Pure: no socket, log or clock.
"""

import functools
import math
import operator
import re

from metaq.filters import limits as filters_limits
from metaq.errors import BadFilterExpression

__all__ = ["SqlFilter", "compile_sql", "compiled"]

_KEYWORDS = frozenset(["NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS",
                       "STARTSWITH", "ENDSWITH"])
_STRING_OPS = ("CONTAINS", "STARTSWITH", "ENDSWITH")
_SPACE = " \t\n\r\f"
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_DECIMAL = re.compile(r"0|[1-9][0-9]*[lL]?")
_FLOAT = re.compile(r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+")
_OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "(", ")", ",", "+", "-")
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_DOUBLE_MIN = 5e-324  # Java's Double.MIN_VALUE
_JAVA_SPACE = "".join(chr(c) for c in range(33))  # what Java's Double.valueOf trims
_JAVA_INT = re.compile(r"[+-]?[0-9]+\Z")
_JAVA_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)\Z")


class _NoMatch(Exception):
    """A conversion that failed while evaluating: the message does not match (RocketMQ's evaluation error)."""


# -- tokens -----------------------------------------------------------------------------------------------------

class _Token:
    __slots__ = ("kind", "text", "value", "pos")

    def __init__(self, kind, text, value, pos):
        self.kind = kind  # "id", "kw", "int", "long", "double", "str", "op", "end"
        self.text = text
        self.value = value
        self.pos = pos

    def describe(self):
        if self.kind == "end":
            return "the end"
        return repr(self.text if len(self.text) <= 40 else self.text[:40] + "...")


def _error(pos, expected, found=None):
    got = "" if found is None else ", found %s" % found
    return BadFilterExpression("bad SQL92 filter at character %d: expected %s%s" % (pos, expected, got), pos, expected)


def _tokens(text):
    """The tokens of ``text``, ending with an ``end`` token; BadFilterExpression at an unknown character, an
    unterminated string or comment, an integer past 64 bits, a float literal out of Java's double range."""
    out = []
    i, n = 0, len(text)
    while True:
        i = _skip_blank(text, i)
        if i >= n:
            out.append(_Token("end", "", None, n))
            return out
        c = text[i]
        if c == "'":
            token, i = _string_token(text, i)
        elif c.isdigit() and c.isascii() or (c == "." and text[i + 1:i + 2].isdigit() and text[i + 1:i + 2].isascii()):
            token, i = _number_token(text, i)
        elif c.isascii() and (c.isalpha() or c in "_$"):
            token, i = _word_token(text, i)
        else:
            token, i = _operator_token(text, i)
        out.append(token)


def _skip_blank(text, i):
    """The position of the next token at or after ``i``: spaces, ``--`` line comments and ``/* */`` comments
    passed over; BadFilterExpression at an unterminated ``/*``."""
    n = len(text)
    while i < n:
        if text[i] in _SPACE:
            i += 1
        elif text.startswith("--", i):
            j = text.find("\n", i)
            k = text.find("\r", i)
            ends = [x for x in (j, k) if x >= 0]
            i = min(ends) + 1 if ends else n
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise _error(n, "'*/' closing the comment opened at character %d" % i, "the end")
            i = j + 2
        else:
            break
    return i


def _string_token(text, i):
    """The string literal opening at ``i`` (``''`` inside is one quote) and the position after it."""
    j = i + 1
    parts = []
    while True:
        k = text.find("'", j)
        if k < 0:
            raise _error(len(text), "a quote closing the string opened at character %d" % i, "the end")
        parts.append(text[j:k])
        if text.startswith("''", k):
            parts.append("'")
            j = k + 2
            continue
        j = k + 1
        break
    return _Token("str", text[i:j], "".join(parts), i), j


def _number_token(text, i):
    """The number literal at ``i`` (the longer of a float and an integer reading) and the position after it:
    a double within Java's range (RocketMQ refuses 0.0), an int, or a long up to 64 bits."""
    f = _FLOAT.match(text, i)
    d = _DECIMAL.match(text, i) if text[i] != "." else None
    if f is not None and (d is None or f.end() > d.end()):
        word = f.group()
        value = float(word)
        if math.isinf(value):
            raise _error(i, "a float literal at most 1.7976931348623157E308", repr(word))
        if value < _DOUBLE_MIN:
            raise _error(i, "a float literal at least 4.9E-324 (RocketMQ refuses 0.0)", repr(word))
        return _Token("double", word, value, i), f.end()
    word = d.group()
    value = int(word.rstrip("lL"))
    if value > _LONG_MAX:
        raise _error(i, "an integer literal at most %d" % _LONG_MAX, repr(word))
    return _Token("int" if value <= _INT_MAX else "long", word, value, i), d.end()


def _word_token(text, i):
    """The keyword or property name at ``i`` and the position after it."""
    word = _IDENT.match(text, i).group()
    upper = word.upper()
    if upper in _KEYWORDS:
        return _Token("kw", word, upper, i), i + len(word)
    return _Token("id", word, word, i), i + len(word)


def _operator_token(text, i):
    """The operator at ``i`` (the first of ``_OPERATORS`` it starts with) and the position after it."""
    for op in _OPERATORS:
        if text.startswith(op, i):
            return _Token("op", op, op, i), i + len(op)
    raise _error(i, "an operator, a name, a literal or '('", repr(text[i]))


# -- values: what evaluating an operand gives ---------------------------------------------------------------------
#
# An operand compiles to ``(kind, fn)``: fn(properties) -> its value. Kinds: "prop" (a str or None), "bool"
# (True, False or None: a condition), "const" (fn gives a literal; ``const`` holds (java_type, value)),
# "null" (always None: a sign before something that is no number, as RocketMQ negates it).

class _Operand:
    __slots__ = ("kind", "fn", "jtype", "value", "name", "pos")

    def __init__(self, kind, fn, pos, jtype=None, value=None, name=None):
        self.kind = kind
        self.fn = fn
        self.pos = pos
        self.jtype = jtype  # a const's Java type: "int", "long", "double", "str", "bool", "null"
        self.value = value
        self.name = name  # a property's name


def _const(jtype, value, pos):
    return _Operand("const", lambda props, v=value: v, pos, jtype, value)


def _jtype(value):
    """The Java type of a value met at run time that is no literal (a property's str, a condition's bool)."""
    if value.__class__ is str:
        return "str"
    if value.__class__ is bool:
        return "bool"
    return "double" if value.__class__ is float else "long"


def _to_int(text, low, high):
    if not (text.isascii() and text.isdigit()) and _JAVA_INT.match(text) is None:
        raise _NoMatch(text)
    value = int(text)
    if not low <= value <= high:
        raise _NoMatch(text)
    return value


def _to_double(text):
    if text.isascii() and text.replace(".", "", 1).isdigit():  # plain digits with at most one point: fast
        return float(text)
    s = text.strip(_JAVA_SPACE)
    if _JAVA_DOUBLE.match(s) is None:
        raise _NoMatch(text)
    return float(s.rstrip("fFdD").replace("Infinity", "inf"))


def _convert(text, jtype):
    """A property's string as a value of Java type ``jtype`` (Integer/Long/Double/Boolean.valueOf)."""
    if jtype == "int":
        return _to_int(text, _INT_MIN, _INT_MAX)
    if jtype == "long":
        return _to_int(text, _LONG_MIN, _LONG_MAX)
    if jtype == "double":
        return _to_double(text)
    return text.lower() == "true"  # bool


def _cmp_double(a, b):
    """Java's Double.compareTo: NaN above everything and equal to itself, -0.0 below 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        if a == 0.0:
            return (math.copysign(1.0, a) > math.copysign(1.0, b)) - (math.copysign(1.0, a) < math.copysign(1.0, b))
        return 0
    return (math.isnan(a)) - (math.isnan(b))


_NUMERIC = ("int", "long", "double")


def _compare(lv, lt, rv, rt):
    """RocketMQ's ComparisonExpression.__compare (string conversion on): an int, or _NoMatch."""
    if lt != rt:
        if lt == "bool":
            if rt == "str":  # RocketMQ casts the boolean to a string here and fails
                raise _NoMatch(rv)
            return -1
        if lt in _NUMERIC:
            if rt in _NUMERIC:
                if "double" in (lt, rt):
                    return _cmp_double(float(lv), float(rv))
            elif rt == "str":
                rv = _convert(rv, lt)
                rt = lt
            else:
                return -1
        elif lt == "str":
            if rt == "bool" or rt in _NUMERIC:
                lv = _convert(lv, rt)
                lt = rt
            else:
                return -1
        else:
            return -1
    if lt == "double" or rt == "double":
        return _cmp_double(float(lv), float(rv))
    return (lv > rv) - (lv < rv)


def _typer(op):
    """A function value -> Java type for operand ``op`` (a literal's own, else the value's at run time)."""
    if op.kind == "const":
        jt = op.jtype
        return lambda v: jt
    return _jtype


def _equal(left, right):
    """RocketMQ's doCreateEqual: NULL on the left is unknown, on the right FALSE, on both TRUE."""
    lf, rf, lt, rt = left.fn, right.fn, _typer(left), _typer(right)
    if left.kind == "prop" and right.kind == "const" and right.jtype == "str":  # the common case, fast
        name, want = left.name, right.value

        def eq_str(props):
            v = props.get(name)
            return None if v is None else v == want
        return eq_str

    def eq(props):
        lv = lf(props)
        rv = rf(props)
        if lv is None or rv is None:
            if lv is None and rv is None:
                return True
            return None if lv is None else False
        a, b = lt(lv), rt(rv)
        if a == b and lv == rv:
            return True
        return _compare(lv, a, rv, b) == 0
    return eq


_DIRECT = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_ORDER = {">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0}


def _order(op, left, right):
    """``>``, ``>=``, ``<``, ``<=``: NULL either side is unknown; two strings compare as doubles."""
    test = _ORDER[op]
    lf, rf, lt, rt = left.fn, right.fn, _typer(left), _typer(right)
    if left.kind == "prop" and right.kind == "const" and right.jtype in _NUMERIC:  # the common case, fast
        name, want, jt = left.name, right.value, right.jtype
        if jt == "double":
            def order_double(props):
                v = props.get(name)
                if v is None:
                    return None
                return test(_cmp_double(_to_double(v), want))
            return order_double

        direct = _DIRECT[op]
        low, high = (_INT_MIN, _INT_MAX) if jt == "int" else (_LONG_MIN, _LONG_MAX)

        def order_num(props):
            v = props.get(name)
            if v is None:
                return None
            return direct(_to_int(v, low, high), want)
        return order_num

    def order(props):
        lv = lf(props)
        if lv is None:
            return None
        rv = rf(props)
        if rv is None:
            return None
        a, b = lt(lv), rt(rv)
        if a == "str" and b == "str":
            return test(_cmp_double(_to_double(lv), _to_double(rv)))
        return test(_compare(lv, a, rv, b))
    return order


def _not(fn):
    def neg(props):
        v = fn(props)
        return None if v is None else not v
    return neg


def _and(fns):
    def all_of(props):
        unknown = False
        for f in fns:
            v = f(props)
            if v is False:
                return False
            if v is None:
                unknown = True
        return None if unknown else True
    return all_of


def _or(fns):
    def any_of(props):
        unknown = False
        for f in fns:
            v = f(props)
            if v is True:
                return True
            if v is None:
                unknown = True
        return None if unknown else False
    return any_of


# -- the parser -------------------------------------------------------------------------------------------------

class _Parser:
    def __init__(self, text, max_depth, max_in_items):
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0
        self.max_depth = max_depth
        self.max_in_items = max_in_items

    @property
    def tok(self):
        return self.toks[self.i]

    def take(self):
        t = self.toks[self.i]
        self.i += 1
        return t

    def is_kw(self, word):
        t = self.toks[self.i]
        return t.kind == "kw" and t.value == word

    def is_op(self, op):
        t = self.toks[self.i]
        return t.kind == "op" and t.value == op

    def expect_kw(self, word, expected):
        if not self.is_kw(word):
            raise _error(self.tok.pos, expected, self.tok.describe())
        return self.take()

    def expect_op(self, op, expected):
        if not self.is_op(op):
            raise _error(self.tok.pos, expected, self.tok.describe())
        return self.take()

    def deeper(self, pos):
        self.depth += 1
        if self.depth > self.max_depth:
            raise _error(pos, "nesting at most %d levels deep (parentheses, NOT, signs, chained comparisons)"
                         % self.max_depth)

    def boolean(self, op):
        """``op`` as a condition: RocketMQ's asBooleanExpression (a property is cast, a value refused)."""
        if op.kind == "bool" or (op.kind == "const" and op.jtype in ("bool", "null")):
            return op.fn
        if op.kind == "prop":
            name = op.name

            def cast(props):
                return None if props.get(name) is None else False  # a string is no boolean
            return cast
        raise _error(op.pos, "a condition (a comparison, IN, IS NULL, TRUE...), not a value")

    def parse(self):
        op = self.or_expr()
        if self.tok.kind != "end":
            raise _error(self.tok.pos, "AND, OR, a comparison or the end", self.tok.describe())
        return self.boolean(op)

    def or_expr(self):
        first = self.and_expr()
        if not self.is_kw("OR"):
            return first
        fns = [self.boolean(first)]
        while self.is_kw("OR"):
            self.take()
            fns.append(self.boolean(self.and_expr()))
        return _Operand("bool", _or(fns), first.pos)

    def and_expr(self):
        first = self.equality()
        if not self.is_kw("AND"):
            return first
        fns = [self.boolean(first)]
        while self.is_kw("AND"):
            self.take()
            fns.append(self.boolean(self.equality()))
        return _Operand("bool", _and(fns), first.pos)

    def equality(self):
        left = self.comparison()
        saved, steps = self.depth, 0
        while True:
            t = self.tok
            if t.kind == "op" and t.value in ("=", "<>"):
                self.take()
                steps = self.chained(steps, t)
                right = self.comparison()
                for side in (left, right):
                    if side.kind == "const" and side.jtype == "null":
                        raise _error(side.pos, "a value beside %s (use IS NULL / IS NOT NULL for NULL)" % t.value)
                if (left.kind == "const" and right.kind == "const" and left.jtype == "bool"
                        and right.jtype != "bool"):
                    raise _error(right.pos, "a boolean to compare with %s" % left.value)
                fn = _equal(left, right)
                left = _Operand("bool", fn if t.value == "=" else _not(fn), left.pos)
            elif t.kind == "kw" and t.value == "IS":
                self.take()
                steps = self.chained(steps, t)
                negate = False
                if self.is_kw("NOT"):
                    self.take()
                    negate = True
                self.expect_kw("NULL", "NULL or NOT NULL after IS")
                lf = left.fn

                def is_null(props, lf=lf):
                    return lf(props) is None
                left = _Operand("bool", _not(is_null) if negate else is_null, left.pos)
            else:
                self.depth = saved
                return left

    def chained(self, steps, t):
        """Each comparison chained after the first nests the tree one level deeper: counted as nesting."""
        if steps:
            self.deeper(t.pos)
        return steps + 1

    def comparison(self):
        left = self.unary()
        saved, steps = self.depth, 0
        while True:
            t = self.tok
            if t.kind == "op" and t.value in _ORDER:
                self.take()
                steps = self.chained(steps, t)
                right = self.unary()
                self.orderable(left, t)
                self.orderable(right, t)
                left = _Operand("bool", _order(t.value, left, right), left.pos)
                continue
            negate = t.kind == "kw" and t.value == "NOT"
            nxt = self.toks[self.i + 1] if negate else t
            if nxt.kind != "kw" or nxt.value not in ("BETWEEN", "IN") + _STRING_OPS:
                self.depth = saved
                return left
            if negate:
                self.take()
            self.take()
            steps = self.chained(steps, t)
            if nxt.value == "BETWEEN":
                left = self.between(left, nxt, negate)
            elif nxt.value == "IN":
                left = self.in_list(left, nxt, negate)
            else:
                s = self.tok
                if s.kind != "str":
                    raise _error(s.pos, "a string literal after %s" % nxt.value, s.describe())
                self.take()
                left = _Operand("bool", _string_test(left.fn, nxt.value, s.value, negate), left.pos)

    def orderable(self, side, t):
        if side.kind == "bool" or (side.kind == "const" and side.jtype not in _NUMERIC):
            raise _error(side.pos, "a number or a property beside %s" % t.value)

    def between(self, left, kw, negate):
        low = self.unary()
        self.expect_kw("AND", "AND between BETWEEN's bounds")
        high = self.unary()
        self.orderable(left, kw)
        for side in (low, high):
            if side.kind == "const" and side.jtype == "null":
                raise _error(side.pos, "a bound of BETWEEN that is not NULL")
            self.orderable(side, kw)
        if low.kind == "const" and high.kind == "const" and _compare(high.value, high.jtype, low.value,
                                                                     low.jtype) < 0:
            raise _error(low.pos, "BETWEEN's low bound (%s) at most its high bound (%s)" % (low.value, high.value))
        if (left.kind == "prop" and low.kind == "const" and high.kind == "const" and low.jtype in ("int", "long")
                and high.jtype in ("int", "long")):  # the common case, fast: one lookup and one conversion
            return _Operand("bool", _int_between(left.name, low, high, negate), left.pos)
        if negate:
            fn = _or([_order("<", left, low), _order(">", left, high)])
        else:
            fn = _and([_order(">=", left, low), _order("<=", left, high)])
        return _Operand("bool", fn, left.pos)

    def in_list(self, left, kw, negate):
        if left.kind != "prop":
            raise _error(left.pos, "a property name before IN")
        self.expect_op("(", "'(' after IN")
        items = []
        while True:
            s = self.tok
            if s.kind != "str":
                raise _error(s.pos, "a string literal in IN's list", s.describe())
            if len(items) >= self.max_in_items:
                raise _error(s.pos, "at most %d items in IN's list" % self.max_in_items)
            self.take()
            items.append(s.value)
            if self.is_op(","):
                self.take()
                continue
            self.expect_op(")", "',' or ')' in IN's list")
            break
        wanted, name = frozenset(items), left.name

        def member(props):
            v = props.get(name)
            if v is None:
                return None
            return (v in wanted) != negate
        return _Operand("bool", member, left.pos)

    def unary(self):
        t = self.tok
        if t.kind == "op" and t.value in ("+", "-"):
            self.take()
            self.deeper(t.pos)
            inner = self.unary()
            self.depth -= 1
            if t.value == "+":
                return inner
            if inner.kind == "const" and inner.jtype in _NUMERIC:
                return _const(inner.jtype, -inner.value, t.pos)
            return _Operand("null", lambda props: None, t.pos)  # RocketMQ negates only numbers
        if t.kind == "kw" and t.value == "NOT":
            self.take()
            self.deeper(t.pos)
            inner = self.boolean(self.unary())
            self.depth -= 1
            return _Operand("bool", _not(inner), t.pos)
        return self.primary()

    def primary(self):
        t = self.tok
        if t.kind == "op" and t.value == "(":
            self.take()
            self.deeper(t.pos)
            inner = self.or_expr()
            self.expect_op(")", "')' closing the '(' at character %d" % t.pos)
            self.depth -= 1
            inner.pos = t.pos  # errors about the group name its '('
            return inner
        if t.kind == "id":
            self.take()
            name = t.value
            return _Operand("prop", lambda props: props.get(name), t.pos, name=name)
        if t.kind in ("int", "long", "double", "str"):
            self.take()
            return _const(t.kind, t.value, t.pos)
        if t.kind == "kw" and t.value in ("TRUE", "FALSE", "NULL"):
            self.take()
            if t.value == "NULL":
                return _const("null", None, t.pos)
            return _const("bool", t.value == "TRUE", t.pos)
        raise _error(t.pos, "a property name, a literal or '('", t.describe())


def _int_between(name, low, high, negate):
    """``name [NOT] BETWEEN low AND high`` with integer bounds: the two comparisons it stands for, each converting
    the property to its bound's type (RocketMQ's AND / OR of them), in one step."""
    lo, lo_min, lo_max = low.value, *((_INT_MIN, _INT_MAX) if low.jtype == "int" else (_LONG_MIN, _LONG_MAX))
    hi, hi_min, hi_max = high.value, *((_INT_MIN, _INT_MAX) if high.jtype == "int" else (_LONG_MIN, _LONG_MAX))

    def between(props):
        v = props.get(name)
        if v is None:
            return None
        n = _to_int(v, lo_min, lo_max)
        if negate:
            return n < lo or _to_int(v, hi_min, hi_max) > hi
        return n >= lo and _to_int(v, hi_min, hi_max) <= hi
    return between


def _string_test(fn, op, search, negate):
    """CONTAINS / STARTSWITH / ENDSWITH: FALSE on NULL, a value that is no string or an empty search."""
    if op == "CONTAINS":
        def test(v):
            return search in v
    elif op == "STARTSWITH":
        def test(v):
            return v.startswith(search)
    else:
        def test(v):
            return v.endswith(search)

    def string_test(props):
        v = fn(props)
        if not search or v.__class__ is not str:
            return False
        return test(v) != negate
    return string_test


# -- the compiled filter ----------------------------------------------------------------------------------------

class SqlFilter:
    """A compiled SQL92 expression: ``matches(properties)`` is True only when it evaluates to TRUE."""

    __slots__ = ("expression", "_fn")

    def __init__(self, expression, fn):
        self.expression = expression
        self._fn = fn

    def evaluate(self, properties):
        """True, False or None (unknown) for a message with ``properties`` (a dict of str); False when a value
        fails its conversion (RocketMQ's evaluation error)."""
        try:
            return self._fn(properties)
        except _NoMatch:
            return False

    def matches(self, properties):
        """Whether a message with ``properties`` is wanted: its expression is TRUE for them."""
        try:
            return self._fn(properties) is True
        except _NoMatch:
            return False

    def __eq__(self, other):  # two compilations of one expression decide alike
        return isinstance(other, SqlFilter) and other.expression == self.expression

    def __hash__(self):
        return hash(self.expression)

    def __repr__(self):
        return "SqlFilter(%r)" % self.expression


@functools.lru_cache(maxsize=filters_limits.SQL_FILTER_CACHE)
def compiled(expression):
    """``compile_sql(expression)`` with the broker's limits, kept for the ``limits.SQL_FILTER_CACHE`` expressions
    used last (a compiled filter is immutable: any request may share it); errors are raised, never kept."""
    return compile_sql(expression)


def compile_sql(expression, max_chars=filters_limits.MAX_SQL_FILTER_CHARS,
                max_depth=filters_limits.MAX_SQL_FILTER_DEPTH,
                max_in_items=filters_limits.MAX_SQL_FILTER_IN_ITEMS):
    """The ``SqlFilter`` of ``expression`` (str); BadFilterExpression (a ClientError) naming the position and
    what was expected when it does not parse, is empty, or passes one of the limits."""
    if len(expression) > max_chars:
        raise _error(max_chars, "at most %d characters (the expression has %d)" % (max_chars, len(expression)))
    parser = _Parser(expression, max_depth, max_in_items)
    if parser.tok.kind == "end":
        raise _error(parser.tok.pos, "an expression", "the end")
    return SqlFilter(expression, parser.parse())
