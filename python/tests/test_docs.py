"""The documentation's Python examples stay true.

Every ```python block of README.md and docs/*.md compiles. A block is a whole script unless its
fence says ```python fragment: WHY (a part of a script, which cannot run alone); every whole
script runs as each worker of a `pushpull local` job of 2 workers and 2 servers and must exit
0. The other kinds of blocks (cluster files, command lines, compression maps) and the links are
checked by tests/docs.rs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, run_job


@dataclass
class Block:
    """A fenced code block: where it is, its fence's info words, its text."""

    page: str
    line: int
    info: list[str]
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


FENCE = re.compile(r"^(\s*)```(.*)$")


def blocks(text: str, page: str) -> list[Block]:
    """The fenced code blocks of a markdown text, their fence's indentation removed."""
    out: list[Block] = []
    current: tuple[int, int, list[str], list[str]] | None = None
    for i, line in enumerate(text.splitlines(), start=1):
        m = FENCE.match(line)
        if current is None:
            if m:
                current = (i, len(m.group(1)), m.group(2).split(), [])
        elif m:
            start, _, info, code = current
            out.append(Block(page, start, info, "".join(code)))
            current = None
        else:
            indent = current[1]
            cut = len(line) - len(line.lstrip(" "))
            current[3].append(line[min(cut, indent):] + "\n")
    assert current is None, f"{page}: a code block is never closed"
    return out


def pages() -> list[Path]:
    """README.md and every docs/*.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def python_blocks() -> list[Block]:
    """Every ```python block of the documentation."""
    found = []
    for path in pages():
        page = str(path.relative_to(REPO))
        found += [b for b in blocks(path.read_text(), page) if b.info[:1] == ["python"]]
    return found


def is_fragment(block: Block) -> bool:
    return len(block.info) > 1 and block.info[1].rstrip(":") == "fragment"


BLOCKS = python_blocks()
SCRIPTS = [b for b in BLOCKS if not is_fragment(b)]


def test_the_documentation_has_python_examples():
    assert SCRIPTS, "no whole Python script in README.md or docs/"


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_every_block_compiles(block: Block):
    compile(block.code, str(block), "exec")


@pytest.mark.parametrize("block", [b for b in BLOCKS if is_fragment(b)], ids=str)
def test_a_fragment_says_why_it_cannot_run(block: Block):
    assert len(block.info) > 2, f"{block}: write ```python fragment: WHY"


@pytest.mark.parametrize("block", SCRIPTS, ids=str)
def test_every_script_runs_in_a_job(block: Block, pushpull, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(block.code)
    p = run_job(pushpull, str(script), workers=2, servers=2)
    assert p.returncode == 0, f"{block} failed:\n{p.stdout}\n{p.stderr}"


def test_the_checkers_fail_on_broken_examples(tmp_path, pushpull):
    """A block that does not compile, and a script that fails in the job, are caught."""
    broken = blocks("```python\nimport torch\nbps.init(\n```\n", "broken.md")
    assert len(broken) == 1
    with pytest.raises(SyntaxError):
        compile(broken[0].code, str(broken[0]), "exec")
    script = tmp_path / "fails.py"
    script.write_text("import pushpull.torch as bps\nbps.init()\nraise SystemExit(3)\n")
    assert run_job(pushpull, str(script), workers=2, servers=2).returncode != 0
    silent = blocks("```python fragment\nx = 1\n```\n", "silent.md")[0]
    assert is_fragment(silent) and len(silent.info) <= 2
