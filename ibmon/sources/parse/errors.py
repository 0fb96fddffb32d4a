"""The one way a parser says no: ``ParseError``, raised for the whole input.

Every parser in this package reads its format exactly or not at all. A line it does not know,
a field it has already seen, a value that does not fit its field, a block cut short, bytes left
over: any of these rejects the whole input, because a half-used output is worse than none. A
counter-shaped junk line that is accepted once becomes a permanent error in a total (the next
real value looks like a reset), while a rejected output costs one poll of that node.
"""

from __future__ import annotations

__all__ = ["SAMPLE_CHARS", "ParseError", "require_whole_lines", "sample"]

#: How much of an offending line a message quotes: enough to recognise it, never a flood.
SAMPLE_CHARS = 120


def sample(text: str, limit: int = SAMPLE_CHARS) -> str:
    """``text`` cut to ``limit`` characters and quoted with every control or non-ASCII
    character escaped, so a hostile line cannot reach a log or a terminal raw."""
    cut = text[:limit]
    quoted = cut.encode("ascii", "backslashreplace").decode("ascii")
    quoted = "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in quoted)
    return f"'{quoted}'" + ("..." if len(text) > limit else "")


class ParseError(ValueError):
    """An input that is not exactly what its format allows; nothing of it may be used.

    ``problem`` says what is wrong, ``line`` (1-based) where, ``text`` the offending line (the
    message quotes it through ``sample``).
    """

    def __init__(self, problem: str, *, line: int | None = None, text: str | None = None) -> None:
        self.problem = problem
        self.line = line
        self.text = text
        where = f"line {line}: " if line is not None else ""
        quote = f": {sample(text)}" if text is not None else ""
        super().__init__(f"{where}{problem}{quote}")


def require_whole_lines(text: str) -> None:
    """Tools end every line they print with a newline: text that does not was cut short."""
    if text and not text.endswith("\n"):
        raise ParseError("output ends in the middle of a line (cut short)",
                         line=text.count("\n") + 1, text=text.rsplit("\n", 1)[-1])
