"""``make bench``'s end-to-end part: see tests/bench/e2e/__init__.py and README.md there."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# With PYTHONSAFEPATH (the Makefile sets it) a script's own folder is not on sys.path.
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from e2e.main import main  # noqa: E402  (needs the path above)

if __name__ == "__main__":
    sys.exit(main())
