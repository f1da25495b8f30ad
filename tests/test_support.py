"""The support table has one source: every op the importer takes has notes, and the README
shows exactly the generated table."""
from __future__ import annotations

from pathlib import Path

from aicfc.ir import support

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_claimed_op_has_notes_and_nothing_else_does():
    assert set(support.NOTES) == set(support.claimed())


def test_readme_table_is_the_generated_one():
    text = README.read_text()
    assert support.with_table(text) == text, "README's support table is stale: run `make readme-ops`"
