"""The largest cluster this machine holds, and a capacity model past it (issue 48): see
tests/bench/e2e/ladder.py and tests/bench/e2e/README.md ("The ladder")."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# With PYTHONSAFEPATH (the Makefile sets it) a script's own folder is not on sys.path.
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from e2e import ladder  # noqa: E402  (needs the path above)

if __name__ == "__main__":
    arguments = ladder.options()
    if arguments.render_only:
        sys.exit(ladder.render_saved(arguments))
    sys.exit(asyncio.run(ladder.climb(arguments)))
