"""The answer of a program sandgym runs in a sandbox (a scorer, a verifier, the judge's
harness): one line, last, of a mark and a JSON document (`print(MARK + json.dumps(answer))`),
so that nothing else the program or the code it runs prints is taken for it. Each program
has its own mark."""

from __future__ import annotations

import json
from typing import Any


def marked_json(stdout: str, mark: str) -> Any:
    """The JSON after `mark` on the last line that starts with it, or None when none does."""
    for line in reversed(stdout.split("\n")):
        if line.startswith(mark):
            return json.loads(line[len(mark) :])
    return None
