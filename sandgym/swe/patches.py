"""Unified diffs as data: parse a git-style patch into files and hunks, apply hunks to
text, and turn a patch into editor operations (used by the agentic env's oracle)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """The patch cannot be parsed or does not fit the text it is applied to."""


@dataclass
class Hunk:
    old_start: int
    old: list[str] = field(default_factory=list)  # context + removed lines, with their "\n"
    new: list[str] = field(default_factory=list)  # context + added lines
    old_len: int = 0  # the line counts its header gives
    new_len: int = 0
    ends_in_context: bool = False  # the last line read was a context line (for "\ No newline")

    @property
    def complete(self) -> bool:
        """Every line the header promises is there (a patch cut off mid-hunk is not)."""
        return len(self.old) >= self.old_len and len(self.new) >= self.new_len


@dataclass
class FilePatch:
    old_path: str | None  # None: a new file
    new_path: str | None  # None: a deleted file
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def _strip_prefix(p: str) -> str | None:
    p = p.split("\t")[0].strip()
    if p == "/dev/null":
        return None
    return p[2:] if p[:2] in ("a/", "b/") else p


def parse_patch(text: str) -> list[FilePatch]:
    files: list[FilePatch] = []
    cur: FilePatch | None = None
    hunk: Hunk | None = None
    last: list[str] | None = None  # the list the previous +/-/space line went to
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            m = re.match(r"^diff --git a/(\S+) b/(\S+)", line)
            cur = FilePatch(m.group(1) if m else None, m.group(2) if m else None)
            files.append(cur)
            hunk = None
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ") and (hunk is None or not _in_hunk(hunk)):
            old, new = _strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])
            if cur is None or cur.hunks:
                cur = FilePatch(old, new)
                files.append(cur)
            else:
                cur.old_path, cur.new_path = old, new
            hunk = None
            i += 2
            continue
        elif cur is not None and line.startswith("new file mode"):
            cur.old_path = None
        elif cur is not None and line.startswith("deleted file mode"):
            cur.new_path = None
        elif cur is not None and line.startswith("rename from "):
            cur.old_path = line[len("rename from "):].strip()
        elif cur is not None and line.startswith("rename to "):
            cur.new_path = line[len("rename to "):].strip()
        elif cur is not None and (line.startswith("Binary files") or line.startswith("GIT binary patch")):
            cur.binary = True
        elif line.startswith("@@"):
            m = _HUNK.match(line)
            if not m or cur is None:
                raise PatchError(f"bad hunk header: {line.strip()!r}")
            hunk = Hunk(int(m.group(1)), old_len=int(m.group(2) or 1), new_len=int(m.group(4) or 1))
            cur.hunks.append(hunk)
        elif hunk is not None and line.startswith("\\"):
            # "\ No newline at end of file": the previous line has no "\n".
            if last is not None and last and last[-1].endswith("\n"):
                last[-1] = last[-1][:-1]
                if last is hunk.old and hunk.new and hunk.new[-1] == last[-1] + "\n" and _was_context(hunk):
                    hunk.new[-1] = hunk.new[-1][:-1]
        elif hunk is not None and _in_hunk(hunk) and line[:1] in (" ", "-", "+", "\n"):
            body = line[1:] if line[:1] != "\n" else "\n"
            if line[:1] in (" ", "\n"):
                hunk.old.append(body)
                hunk.new.append(body)
                hunk.ends_in_context = True
                last = hunk.old
            elif line[0] == "-":
                hunk.old.append(body)
                hunk.ends_in_context = False
                last = hunk.old
            else:
                hunk.new.append(body)
                hunk.ends_in_context = False
                last = hunk.new
        i += 1
    return files


def _in_hunk(h: Hunk) -> bool:
    return not h.complete


def cut_short(text: str) -> list[str]:
    """The hunks of a patch that end before their header says (a patch cut off), one line
    each; a hunk header that cannot be read counts too."""
    try:
        files = parse_patch(text)
    except PatchError as exc:
        return [str(exc)]
    return [
        f"hunk {i} of {fp.path} has {len(h.old)} of its {h.old_len} old and {len(h.new)} of its {h.new_len} new lines"
        for fp in files for i, h in enumerate(fp.hunks, 1) if not h.complete
    ]


def _was_context(h: Hunk) -> bool:
    return h.ends_in_context


def apply_hunks(text: str, fp: FilePatch) -> str:
    """The text after `fp`'s hunks; each hunk is placed at its line number (shifted by the
    earlier hunks), or, failing that, wherever its old lines occur."""
    lines = text.splitlines(keepends=True)
    delta = 0
    for h in fp.hunks:
        n = len(h.old)
        pos = (h.old_start - 1 if n else h.old_start) + delta
        if lines[pos:pos + n] != h.old:
            pos = _find(lines, h.old)
            if pos < 0:
                raise PatchError(f"{fp.path}: hunk at line {h.old_start} does not match the file")
        lines[pos:pos + n] = h.new
        delta += len(h.new) - n
    return "".join(lines)


def _find(lines: list[str], block: list[str]) -> int:
    n = len(block)
    for i in range(len(lines) - n + 1):
        if lines[i:i + n] == block:
            return i
    return -1
