"""The sha256 sums that data/README.md gives for ud_ewt/ and sick/ match the files."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"
_ROW = re.compile(r"^  \| `([^`]+)` \|(?: [0-9,]+ \|)? `([0-9a-f]{64})` \|$")


def _section_sums(title: str) -> dict[str, str]:
    text = (DATA / "README.md").read_text(encoding="utf-8")
    section = text.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in map(_ROW.match, section.splitlines()) if m}


def test_readme_checksums_match_the_files() -> None:
    for folder, count in (("ud_ewt", 4), ("sick", 16)):
        sums = _section_sums(f"{folder}/")
        assert len(sums) == count
        on_disk = {p.relative_to(DATA / folder).as_posix()
                   for p in (DATA / folder).rglob("*") if p.is_file()}
        assert on_disk == set(sums), folder  # every file listed, nothing unlisted
        for name, digest in sums.items():
            assert hashlib.sha256((DATA / folder / name).read_bytes()).hexdigest() == digest
