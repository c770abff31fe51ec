"""Topic-pattern subscriptions: Java regex syntax, checked, then matched in linear time by RE2.

kafka-rest hands ``topic_pattern`` to ``java.util.regex.Pattern`` and a topic is
subscribed when the whole name matches (``Matcher.matches``). We match with RE2
(``google-re2``): its time is linear in the name's length whatever the pattern,
so a pattern such as ``(a+)+$`` cannot stall the coordinator, and its memory
is capped (``max_mem``). The group store never evaluates a pattern inside its
write transaction either (see ``coordinator.groups.store``).

What is supported (same meaning in Java and here): literals and escapes
(``\\t \\n \\r \\f \\a \\x41 \\x{41}``, ``\\Q...\\E`` quoting), ``.``, character
classes ``[a-z]``/``[^...]``, ``\\d \\D \\s \\S \\w \\W`` (ASCII, as Java's
defaults), ``\\b \\B``, ``^ $ \\A \\z``, Unicode categories ``\\p{L}``, greedy and
reluctant quantifiers (``* + ? {n} {n,} {n,m}``, ``*?`` ...), alternation,
capturing, non-capturing and named groups (``(?<name>...)``), and the flags
``i``, ``m``, ``s`` (``(?i)``, ``(?i:...)``, ``(?-i)``).

What is refused with a clear message (InvalidTopicPatternError, REST 422):
Java constructs RE2 cannot run in linear time or that mean something else
there: lookahead and lookbehind, atomic groups ``(?>...)``, possessive
quantifiers (``a*+``), back-references (``\\1``, ``\\k<n>``), class union,
intersection and subtraction (``[a[b]]``, ``[a-z&&[^x]]``), the flags
``x d u c U`` (RE2's ``U`` means "ungreedy", Java's means Unicode classes),
``\\G \\Z \\R \\X \\h \\H \\v \\V`` and anything else RE2's parser rejects
(``\\p{Lower}``-style POSIX names, ``\\uXXXX``: write ``\\x{XXXX}``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import re2

from segments.errors import InvalidTopicPatternError

#: Longest pattern accepted (Kafka has no limit; REST bodies are bounded anyway).
MAX_PATTERN_LENGTH = 4096
#: Memory RE2 may use for one compiled pattern (its default is 8 MiB).
MAX_PATTERN_MEMORY = 2 << 20

_FLAGS_OK = frozenset("ims-")
_BOUNDS = re.compile(r"\{\d+(?:,\d*)?\}")
_FLAG_NAMES = {
    "x": "comments mode (x)",
    "d": "UNIX_LINES (d)",
    "u": "UNICODE_CASE (u)",
    "c": "CANON_EQ (c)",
    "U": "UNICODE_CHARACTER_CLASS (U)",
}
_ESCAPES_REFUSED = {
    "G": r"\G (end of the previous match)",
    "Z": r"\Z (use \z)",
    "R": r"\R (linebreak matcher)",
    "X": r"\X (grapheme cluster)",
    "h": r"\h (horizontal whitespace)",
    "H": r"\H",
    "v": r"\v (vertical whitespace in Java, a vertical tab in RE2)",
    "V": r"\V",
    "k": r"\k<name> (back-reference)",
}


def _refuse(pattern: str, what: str) -> InvalidTopicPatternError:
    return InvalidTopicPatternError(
        f"Invalid topic_pattern {pattern!r}: {what} is not supported (topic patterns are "
        "Java regexes without lookaround, back-references, atomic groups, possessive "
        "quantifiers, nested classes or the flags x, d, u, c, U)."
    )


def check_java_pattern(pattern: str) -> None:
    """Refuse the Java constructs RE2 would reject or read differently.

    Raises:
        InvalidTopicPatternError: naming the first such construct.
    """
    n = len(pattern)
    i = 0
    in_class = False
    class_start = 0
    quantified = False  # the previous token was a quantifier
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise _refuse(pattern, "a trailing backslash")
            d = pattern[i + 1]
            if d == "Q":  # \Q...\E: everything up to \E is literal
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
                quantified = False
                continue
            if d in _ESCAPES_REFUSED:
                raise _refuse(pattern, _ESCAPES_REFUSED[d])
            if not in_class and d in "123456789":
                raise _refuse(pattern, f"the back-reference \\{d}")
            i += 2
            quantified = False
            continue
        if in_class:
            if c == "[":
                raise _refuse(pattern, "a nested character class or [:posix:] class")
            if c == "&" and pattern.startswith("&&", i):
                raise _refuse(pattern, "character class intersection (&&)")
            if c == "]" and i > class_start:
                in_class = False
            i += 1
            continue
        if c == "[":
            in_class = True
            i += 1
            if pattern.startswith("^", i):
                i += 1
            class_start = i  # a "]" right after "[" or "[^" is a literal
            quantified = False
            continue
        if c == "(" and pattern.startswith("(?", i):
            _check_group(pattern, i + 2)
            i += 2
            quantified = False
            continue
        if c == "{":
            m = _BOUNDS.match(pattern, i)
            if m is not None:  # a {n}, {n,} or {n,m} quantifier
                i = m.end()
                quantified = True
                continue
        if c == "+" and quantified:
            raise _refuse(pattern, "a possessive quantifier")
        # "*?", "+?", "??": the reluctant suffix ends the quantifier.
        quantified = c in "*+?" and not (c == "?" and quantified)
        i += 1
    if in_class:
        raise InvalidTopicPatternError(
            f"Invalid topic_pattern {pattern!r}: unclosed character class."
        )


def _check_group(pattern: str, j: int) -> None:
    """Check the group construct after ``(?`` at ``pattern[j:]``."""
    rest = pattern[j:]
    if rest.startswith(("=", "!")):
        raise _refuse(pattern, "lookahead")
    if rest.startswith(("<=", "<!")):
        raise _refuse(pattern, "lookbehind")
    if rest.startswith(">"):
        raise _refuse(pattern, "an atomic group")
    if rest.startswith((":", "<", "P<")):
        return
    for ch in rest:
        if ch in ":)":
            return
        if ch not in _FLAGS_OK:
            raise _refuse(pattern, f"the flag {_FLAG_NAMES.get(ch, repr(ch))}")


@functools.lru_cache(maxsize=256)
def compile_topic_pattern(pattern: str) -> re2._Regexp:
    """The RE2 program for a Java topic pattern (cached).

    Raises:
        InvalidTopicPatternError: not a string, too long, a refused construct, or
            RE2 cannot parse or fit it into ``MAX_PATTERN_MEMORY``.
    """
    if not isinstance(pattern, str):
        raise InvalidTopicPatternError(f"topic_pattern must be a string, not {pattern!r}.")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidTopicPatternError(
            f"topic_pattern is {len(pattern)} characters long; at most {MAX_PATTERN_LENGTH}."
        )
    check_java_pattern(pattern)
    options = re2.Options()
    options.log_errors = False
    options.max_mem = MAX_PATTERN_MEMORY
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        detail = e.args[0] if e.args else e
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise InvalidTopicPatternError(f"Invalid topic_pattern {pattern!r}: {detail}.") from None


def match_topics(pattern: str, names: Iterable[str]) -> tuple[str, ...]:
    """The names the whole of which ``pattern`` matches, in the order given.

    Raises:
        InvalidTopicPatternError: see ``compile_topic_pattern``.
    """
    rx = compile_topic_pattern(pattern)
    return tuple(name for name in names if rx.fullmatch(name) is not None)
