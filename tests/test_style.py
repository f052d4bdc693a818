"""House style that no linter rule of ruff's keeps: lines join inside brackets, never with a
backslash (a trailing space after one breaks the file; brackets also read as one unit)."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_FOLDERS = {".venv", "build", ".git", ".gpu", ".test-data", "node_modules"}


def _python_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py")
                  if not SKIPPED_FOLDERS.intersection(p.relative_to(ROOT).parts))


def backslash_continuations(source: str) -> list[int]:
    """The lines of ``source`` that end in a backslash continuation. Python's tokenizer emits
    NL inside brackets and NEWLINE at a statement's end, and nothing for a backslash: a token
    that starts on a later line than the one before it ended, with no line break between,
    follows one."""
    lines, previous = [], None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        if (previous is not None and token.start[0] > previous.end[0]
                and previous.type not in (tokenize.NEWLINE, tokenize.NL)):
            lines.append(previous.end[0])
        previous = token
    return lines


def test_the_checker_finds_a_continuation_and_nothing_else():
    source = ('x = 1 + \\\n    2\ny = (1 +\n     2)\ns = """a \\\nb"""\nif x:\n    pass\n'
              '# comment \\\nz = 3\n')
    assert backslash_continuations(source) == [1]


def test_no_backslash_continuations():
    found = [f"{path.relative_to(ROOT)}:{line}" for path in _python_files()
             for line in backslash_continuations(path.read_text(encoding="utf-8"))]
    assert found == [], "join these lines inside brackets instead"
