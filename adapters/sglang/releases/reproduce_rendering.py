"""The recorded statements (reproduce_recording.py) as the file's lines: each object named where a
later line uses it, written into the line that alone uses it, and long lines wrapped."""

import keyword
import re
import textwrap
from collections import defaultdict

from .reproduce_recording import Proxy, ReproductionError, Statement


def identifier(name: str, taken: set[str]) -> str:
    """A Python name for a request id: the id itself where it is one."""
    base = re.sub(r"\W", "_", name)
    if not base.isidentifier() or keyword.iskeyword(base) or base in RESERVED:
        base = f"req_{base}".replace("__", "_")
    chosen, number = base, 2
    while chosen in taken:
        chosen, number = f"{base}_{number}", number + 1
    return chosen


RESERVED = frozenset({"torch", "array", "os", "sys", "allocator", "kvcache", "tree_cache", "req_to_token_pool",
                      "batch", "queue", "check", "server_args", "paged"})
"""Names the file's own code uses, which a request's id must not take."""


NAMES = {"SWAKVPool": "kvcache"}
"""What the file calls an object of these classes (else its class's name in snake case)."""


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", name).lower()


WIDTH = 110
"""The file's longest line of code."""


def wrap(line: str, width: int = WIDTH) -> list[str]:
    """A line longer than `width` broken at the commas inside its first bracket, each
    continuation under the first item (or four spaces in, where that is far right)."""
    if len(line) <= width or line.lstrip().startswith("#"):
        return [line]
    opened, closed, commas = brackets(line)
    if closed is None or not commas:
        return [line]
    items = [line[start + 1:stop].strip() for start, stop in zip([opened, *commas], [*commas, closed])]
    items = [item + "," for item in items[:-1]] + [items[-1] + line[closed:]]
    hanging = opened + 1 > width // 2
    margin = len(line) - len(line.lstrip()) + 4 if hanging else opened + 1
    lines = [line[:opened + 1]] + ([" " * margin] if hanging else [])
    for item in items:
        bare = lines[-1] == line[:opened + 1] or not lines[-1].strip()
        if not bare and len(lines[-1]) + 1 + len(item) > width:
            lines.append(" " * margin)
            bare = True
        lines[-1] += item if bare else " " + item
    return [piece for text in lines for piece in wrap(text, width)]


def brackets(line: str) -> tuple[int | None, int | None, list[int]]:
    """The first bracket of a line (outside strings) with commas directly inside it: where it
    opens, where it closes, and those commas."""
    code, quote = [], None  # whether each character is code, not inside a string
    for index, char in enumerate(line):
        code.append(quote is None and char not in "\"'")
        if quote and char == quote and line[index - 1] != "\\":
            quote = None
        elif quote is None and char in "\"'":
            quote = char
    for start, char in enumerate(line):
        if not (code[start] and char in "([{"):
            continue
        depth, commas = 0, []
        for index in range(start, len(line)):
            if not code[index]:
                continue
            depth += (line[index] in "([{") - (line[index] in ")]}")
            if depth == 0:
                if commas:
                    return start, index, commas
                break
            if line[index] == "," and depth == 1:
                commas.append(index)
    return None, None, []


INLINE = 60
"""The longest call written into the line that uses it; a longer one gets a name."""


def render(statements: list[Statement], preset: dict[Proxy, str]) -> list[str]:
    """The file's lines. A call's result is named where a later line uses it (`preset` names
    first: the requests, the tree, each batch), written into the next line where only that
    line uses it, and left unnamed where nothing does. A name is taken again once its last
    holder is used no more (`sampling_params` of each request)."""
    uses: dict[Proxy, list[int]] = defaultdict(list)
    for index, statement in enumerate(statements):
        for part in statement.parts:
            if isinstance(part, Proxy):
                uses[part._origin()].append(index)
    last_use: dict[str, int] = {}
    lines = []

    def text(parts) -> str:
        return "".join(part if isinstance(part, str) else expression(part) for part in parts)

    def expression(proxy: Proxy) -> str:
        if proxy._parent is not None:
            return f"{expression(proxy._parent)}.{proxy._attribute}"
        if proxy._inline is not None:
            return proxy._inline
        if proxy._name is None:
            raise ReproductionError(f"a line names an object no earlier line made: {proxy!r}")
        return proxy._name

    for index, statement in enumerate(statements):
        line = text(statement.parts)
        result = statement.result
        if result is not None and (result in preset or uses.get(result)):
            used = uses.get(result, [])
            following = statements[index + 1] if index + 1 < len(statements) else None
            if result not in preset and used == [index + 1] and following.indent == statement.indent \
                    and not statement.note and len(line) <= INLINE:
                object.__setattr__(result, "_inline", line)
                continue
            base = preset.get(result) or NAMES.get(type(result._target).__name__) or snake(type(result._target).__name__)
            name, number = base, 2
            while last_use.get(name, -1) >= index:
                name, number = f"{base}_{number}", number + 1
            last_use[name] = max(used, default=index)
            object.__setattr__(result, "_name", name)
            line = f"{name} = {line}"
        margin = "    " * statement.indent
        if statement.note:
            if statement.note.startswith("\n") and lines and lines[-1]:
                lines.append("")  # a new paragraph
            lines += [margin + f"# {words}" for words in textwrap.wrap(
                statement.note.strip(), WIDTH - len(margin) - 2, break_on_hyphens=False)]
        if statement.raised is not None:
            lines.append(margin + "# here SGLang raised, on the release this file was written on: "
                         f"{type(statement.raised).__name__}")
        if line or not statement.note:
            lines += wrap(margin + line) if line else [""]
    return lines
