"""Every fenced code block of the documentation site (docs/**/*.md) runs as written,
as the README's do (test_readme.py, readme_blocks.py say how).

A page's blocks run in page order in one fresh, empty directory, so a later block uses
the files an earlier one wrote (``# shop.py: ...``) and a ``delayq worker`` the app
that a block saved. A page added later is picked up by the glob. A block is excused
only by a ``<!-- not run: reason -->`` comment right above its fence; a bare fence (or
``text``) shows output or a diagram and is not code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from readme_blocks import LANGUAGES, Block, read_blocks
from test_readme import run_as_written

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = {
    page.relative_to(DOCS).as_posix(): read_blocks(page.read_text(encoding="utf-8"))
    for page in sorted(DOCS.glob("**/*.md"))
}
#: Fences that are not code: output shown, a diagram.
NOT_CODE = ("", "text")
#: What a python block prints, for the block whose code holds the key: the output the
#: page shows in its comments (the rest of a page's story depends on timing).
PRINTED = {
    'App("memory://").cron("*/2 * * * * *")': [
        'cron has no seconds: for every 2 s use @app.every("2s")'
    ],
    'print(place_order(1, window="1s"))': ["cancel:1", "True", "scheduled"],
    "print(q.cancel(h))    # True": ["send the receipt", "True"],
    "print(msg.payload, msg.attempts)   # {'order': 42} 1": ["{'order': 42} 1"],
}
#: Blocks of all the pages together that may be excused with a "not run" comment.
MAX_NOT_RUN = 8


def runnable(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.not_run is None and b.lang not in NOT_CODE]


RUN = {name: runnable(blocks) for name, blocks in PAGES.items() if runnable(blocks)}


def test_every_code_block_runs_or_says_why_not() -> None:
    assert {"index.md", "tutorial.md", "choosing-a-backend.md"} <= set(PAGES)
    excused = [(name, b) for name, blocks in PAGES.items() for b in blocks if b.not_run]
    assert len(excused) <= MAX_NOT_RUN, f"too many blocks marked 'not run': {excused}"
    for name, block in excused:
        assert len(block.not_run or "") > 20, f"docs/{name} line {block.line}: say why"
    unknown = [
        (name, block.line, block.lang)
        for name, blocks in RUN.items()
        for block in blocks
        if block.lang not in LANGUAGES
    ]
    assert not unknown, f"blocks in a language no test runs: {unknown}"
    assert len(RUN["tutorial.md"]) >= 6


@pytest.mark.parametrize("page", list(RUN))
def test_page_runs_as_written(page: str, tmp_path: Path) -> None:
    source = f"docs/{page}"
    by_line = {block.line: block for block in RUN[page]}
    for step in run_as_written(RUN[page], tmp_path / "work", source):
        shown = [lines for key, lines in PRINTED.items() if key in by_line[step["line"]].code]
        if step["what"] == "python" and shown:
            printed = step["stdout"].splitlines()
            assert len(printed) == len(shown[0]), step
            for line, expected in zip(printed, shown[0], strict=True):
                assert expected in line, f"{source} line {step['line']} printed {line!r}"


def test_the_printed_outputs_are_on_the_pages() -> None:
    """Each PRINTED key names one block of a page: an edit of the page that drops it
    makes this table change with it."""
    codes = [block.code for blocks in PAGES.values() for block in blocks]
    for key in PRINTED:
        assert sum(key in code for code in codes) == 1, key


#: The pages a newcomer reads first, and the width of a code line that a code block
#: shows whole on a 1280-pixel screen with both sidebars (longer ones scroll).
FIRST_PAGES = ("index.md", "tutorial.md", "guide/testing.md")
CODE_WIDTH = 80


@pytest.mark.parametrize("page", FIRST_PAGES)
def test_the_first_pages_code_fits_its_block(page: str) -> None:
    wide = [
        (block.line + number, line)
        for block in PAGES[page]
        for number, line in enumerate(block.code.splitlines(), start=1)
        if len(line) > CODE_WIDTH
    ]
    assert not wide, f"docs/{page}: lines wider than {CODE_WIDTH}: {wide}"
