"""User-supplied patterns: every regex and glob a rule names, compiled with RE2.

A rule's patterns (``client_id``, ``group_id``, ``transactional_id``, ``topic`` regexes and
globs, ``rewrite_addresses.pattern``) are matched on the event loop against texts a client
chooses. Python's ``re`` backtracks: ``(a+)+$`` against ``'a' * 50 + '!'`` runs for hours and
stops every connection. RE2 (the ``google-re2`` bindings) matches in time linear in the text
whatever the pattern, and refuses at compile time what it cannot do that way.

Contract of :func:`compile_pattern`:

* the pattern is RE2 syntax, matched against the whole text (:meth:`UserPattern.fullmatch`);
* a pattern RE2 cannot take (backreferences, lookaround, atomic groups, possessive
  quantifiers, ``\\Z``, verbose mode...) raises :class:`ValueError` whose text says why and
  what RE2 offers instead, which the loader reports as ``file:line: path: reason``;
* a pattern over :data:`MAX_PATTERN_CHARS` characters or :data:`MAX_UNICODE_CLASSES` Unicode
  classes, or whose compiled program would need more than :data:`MAX_PATTERN_MEMORY` bytes, is
  refused before (or while) it is built, so no rule file or admin request can make kproxy
  allocate without bound or hold the GIL long building one (RE2 compiles holding it).

Where RE2 differs from Python's ``re`` on what both accept (rules/README.md says so too):
``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII-only (``\\pN``, ``\\pL`` are the Unicode
classes); ``x{,n}`` is the literal text, not a repetition (write ``x{0,n}``), so it is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

# RE2 builds a pattern holding the GIL, so the time to compile one is bounded too (not only its
# matching): these limits keep the worst pattern's compile short (docs/PERFORMANCE.md), where
# a pattern of thousands of \\pL classes holds the loop for seconds.
# A client-id alternation of 300 names fits; a megabyte of pattern text does not.
MAX_PATTERN_CHARS = 4096
# Each Unicode property class (\pL, \p{Greek}, \PN...) is the costliest part of a pattern to build.
MAX_UNICODE_CLASSES = 8
# RE2's budget for one pattern: its compiled program and the DFA cache it fills while matching
# (a DFA that outgrows it falls back to RE2's NFA, still linear). A program that would not fit
# is refused at compile time ("pattern too large").
MAX_PATTERN_MEMORY = 256 * 1024

SYNTAX_HINT = "kproxy matches with RE2, in linear time; its syntax is in rules/README.md"


def _options(captures: bool) -> Any:
    options = re2.Options()
    options.max_mem = MAX_PATTERN_MEMORY
    options.log_errors = False  # the error is the ValueError's text; RE2 would also print it to stderr
    # Without capturing groups a whole match is one DFA pass; rewrite_addresses needs its groups.
    options.never_capture = not captures
    return options


_MATCH_OPTIONS = _options(captures=False)
_SUB_OPTIONS = _options(captures=True)


# Characters that mean themselves in RE2's syntax wherever they stand (outside a class): a pattern
# made only of them is a literal.
_LITERAL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-:@/")


class UserPattern:
    """A compiled user pattern. Equal (and hashed) by its source text, as ``re.Pattern`` is."""

    __slots__ = ("_literal", "_regexp", "groupindex", "groups", "pattern")

    def __init__(self, pattern: str, regexp: Any, captures: bool) -> None:
        """Made by :func:`compile_pattern` or :func:`compile_glob`: ``regexp`` is RE2's."""
        self.pattern = pattern
        self._regexp = regexp
        # A pattern of plain characters matches only itself: compared as a string, far cheaper than
        # a call into RE2. It matters where patterns are many: 100,000 rules each naming one client id
        # are checked on the loop at a client's first request.
        self._literal = pattern if pattern and _LITERAL_CHARS.issuperset(pattern) else None
        self.groups: int = regexp.groups if captures else 0
        self.groupindex: dict[str, int] = dict(regexp.groupindex) if captures else {}

    def fullmatch(self, text: str) -> bool:
        """Whether the pattern matches all of ``text``; linear in ``len(text)``."""
        if self._literal is not None:
            return text == self._literal
        # Bytes in: the binding then skips its character-offset bookkeeping (a third of the cost).
        # surrogatepass: a str that is not valid Unicode still gets an answer, not an exception.
        return self._regexp.fullmatch(text.encode("utf-8", "surrogatepass")) is not None

    def finditer(self, text: str) -> Iterator[Any]:
        """The non-overlapping matches in ``text`` (``re2`` match objects: ``span()``, ``group()``)."""
        return self._regexp.finditer(text)  # type: ignore[no-any-return]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UserPattern) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"UserPattern({self.pattern!r})"


def compile_pattern(pattern: str, *, captures: bool = False) -> UserPattern:
    """``pattern`` compiled for matching (see the module's contract); ValueError when refused.
    ``captures``: keep its groups (for :func:`substitute`); matching without them is faster."""
    _check_length(pattern, "pattern")
    empty_lower_bound, unicode_classes = _scan(pattern)
    if empty_lower_bound:
        raise ValueError("x{,n} is literal text in RE2, not a repetition: write x{0,n}")
    if unicode_classes > MAX_UNICODE_CLASSES:
        raise ValueError(f"{unicode_classes} Unicode classes (\\p, \\P), more than the {MAX_UNICODE_CLASSES} allowed")
    return UserPattern(pattern, _compile(pattern, _SUB_OPTIONS if captures else _MATCH_OPTIONS), captures)


def compile_glob(glob: str) -> UserPattern:
    """A topic glob (:func:`glob_to_regex`) compiled for matching; ValueError when too big.
    Its ``pattern`` is the RE2 translation."""
    _check_length(glob, "glob")
    source = glob_to_regex(glob)
    return UserPattern(source, _compile(source, _MATCH_OPTIONS), False)


def _check_length(text: str, what: str) -> None:
    if len(text) > MAX_PATTERN_CHARS:
        raise ValueError(f"{what} is {len(text)} characters, more than the {MAX_PATTERN_CHARS} allowed")


def _compile(pattern: str, options: Any) -> Any:
    try:
        pattern.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode text ({exc.reason} at character {exc.start})") from None
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "cannot be compiled"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(f"{reason}{_hint(reason)}") from None


def _hint(reason: str) -> str:
    """What to write instead, for what RE2 refuses and Python's ``re`` would have taken."""
    if "too large" in reason:
        return f" (the compiled pattern would need more than {MAX_PATTERN_MEMORY} bytes)"
    kind, _, operator = reason.partition(": ")
    if kind == "bad repetition operator" and operator.endswith("+"):
        return f" (possessive quantifiers are not supported: {SYNTAX_HINT})"
    for prefix, hint in _HINTS:
        if operator.startswith(prefix):
            return f" ({hint}: {SYNTAX_HINT})"
    if kind in ("invalid perl operator", "invalid escape sequence", "bad repetition operator"):
        return f" ({SYNTAX_HINT})"
    return ""


# (the start of what RE2's error names, what to say): Python re features that RE2 leaves out.
_HINTS: tuple[tuple[str, str], ...] = (
    ("(?=", "lookahead is not supported"), ("(?!", "lookahead is not supported"),
    ("(?<=", "lookbehind is not supported"), ("(?<!", "lookbehind is not supported"),
    ("(?>", "atomic groups are not supported"), ("(?x", "verbose mode is not supported"),
    ("(?#", "comments are not supported"), ("(?P", "backreferences are not supported"),
    ("\\Z", "write \\z for the end of the text"),
    ("\\u", "write \\x{hex} for a code point"), ("\\U", "write \\x{hex} for a code point"),
    ("\\N", "write the character or \\x{hex}"),
    *((f"\\{d}", "backreferences are not supported") for d in "123456789"),
)


def _scan(pattern: str) -> tuple[bool, int]:
    """Whether ``pattern`` has ``{,n}`` unescaped outside a character class (Python's ``re`` reads
    it as ``{0,n}``, RE2 as the literal text: a rule written for one would silently mean another
    thing to the other), and how many Unicode property classes (``\\p``, ``\\P``) it has."""
    i, n, in_class, empty_lower_bound, unicode_classes = 0, len(pattern), False, False, 0
    while i < n:
        c = pattern[i]
        if c == "\\":
            if pattern[i + 1:i + 2] in ("p", "P"):
                unicode_classes += 1
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            # A ']' first in the class (after an optional '^') is a literal member.
            if i + 1 < n and pattern[i + 1] == "^":
                i += 1
            if i + 1 < n and pattern[i + 1] == "]":
                i += 1
        elif c == "{" and pattern.startswith("{,", i):
            j = i + 2
            while j < n and pattern[j].isdigit():
                j += 1
            if j > i + 2 and j < n and pattern[j] == "}":
                empty_lower_bound = True
        i += 1
    return empty_lower_bound, unicode_classes


# ------------------------------------------------------------------------------------- globs

def glob_to_regex(glob: str) -> str:
    """The RE2 pattern of a topic glob, with :func:`fnmatch.fnmatchcase`'s meaning.

    ``*`` is any run of characters (newlines too), ``?`` one character, ``[abc]`` / ``[a-z]``
    one of a set, ``[!abc]`` one not in it; a ``-`` first or last in a set, or right after a
    range, is itself; a ``]`` first in a set is itself; a reversed range (``z-a``) is empty; a
    ``[`` with no closing ``]`` is itself. No glob character can be escaped (as in fnmatch).
    """
    out = ["(?s)"]
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            if out[-1] != ".*":
                out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            end = _class_end(glob, i)
            if end < 0:
                out.append(re2.escape("["))
            else:
                out.append(_glob_class(glob[i:end]))
                i = end + 1
        else:
            out.append(re2.escape(c))
    return "".join(out)


def _class_end(glob: str, start: int) -> int:
    """The index of the ``]`` closing the set whose content starts at ``start``, or -1."""
    j = start
    if j < len(glob) and glob[j] == "!":
        j += 1
    if j < len(glob) and glob[j] == "]":
        j += 1
    return glob.find("]", j)


def _glob_class(content: str) -> str:
    negate = content.startswith("!")
    if negate:
        content = content[1:]
    members: list[str] = []
    i, n = 0, len(content)
    while i < n:
        lo = content[i]
        if i + 2 < n and content[i + 1] == "-":
            hi = content[i + 2]
            if lo <= hi:
                members.append(f"{_class_char(lo)}-{_class_char(hi)}")
            i += 3
            # A '-' right after a range is itself, not the start of another range.
            if i < n and content[i] == "-":
                if i + 2 < n and content[i + 1] == "-":
                    continue  # '--x': a range from '-' (fnmatch reads it so)
                members.append(_class_char("-"))
                i += 1
            continue
        members.append(_class_char(lo))
        i += 1
    if not members:
        return "(?s:.)" if negate else r"[^\x00-\x{10FFFF}]"  # any one character / nothing
    return f"[{'^' if negate else ''}{''.join(members)}]"


def _class_char(c: str) -> str:
    return f"\\x{{{ord(c):x}}}"


# ------------------------------------------------------------------------------ replacements

Template = tuple[str | int, ...]  # literal text and group numbers, in order


def parse_replacement(pattern: UserPattern, template: str) -> Template:
    """A replacement (``rewrite_addresses``) checked against ``pattern``'s groups, once, at load.

    ``\\1`` to ``\\99`` and ``\\g<1>`` / ``\\g<name>`` insert a group (empty when it did not
    take part), ``\\\\`` is a backslash; any other backslash, or a group the pattern does not
    have, raises ValueError, so nothing is left to fail when a response is rewritten.
    """
    pieces: list[str | int] = []
    text: list[str] = []
    i, n = 0, len(template)
    while i < n:
        c = template[i]
        if c != "\\":
            text.append(c)
            i += 1
            continue
        nxt = template[i + 1] if i + 1 < n else ""
        if nxt == "\\":
            text.append("\\")
            i += 2
            continue
        if nxt.isdigit() and nxt.isascii():
            j = i + 2 if not (i + 2 < n and template[i + 2].isascii() and template[i + 2].isdigit()) else i + 3
            group: str = template[i + 1:j]
        elif nxt == "g" and template.startswith("<", i + 2) and template.find(">", i + 3) > 0:
            j = template.find(">", i + 3) + 1
            group = template[i + 3:j - 1]
        else:
            raise ValueError(f"bad escape at character {i} of the replacement: only \\1..\\99, \\g<name> and "
                             "\\\\ are allowed")
        number = int(group) if group.isascii() and group.isdigit() else pattern.groupindex.get(group)
        if number is None or not 0 <= number <= pattern.groups:
            raise ValueError(f"the replacement names group {group!r}, which the pattern does not have "
                             f"({pattern.groups} groups)")
        if text:
            pieces.append("".join(text))
            text = []
        pieces.append(number)
        i = j
    if text:
        pieces.append("".join(text))
    return tuple(pieces)


def substitute(pattern: UserPattern, template: Template, text: str) -> str:
    """``text`` with every non-overlapping match of ``pattern`` replaced by ``template`` expanded."""
    out: list[str] = []
    end = 0
    for found in pattern.finditer(text):
        start, stop = found.span()
        out.append(text[end:start])
        out.extend(p if isinstance(p, str) else (found.group(p) or "") for p in template)
        end = stop
    out.append(text[end:])
    return "".join(out)
