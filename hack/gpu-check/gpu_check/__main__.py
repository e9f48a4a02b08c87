"""``python -m gpu_check``: see cli.main."""

from gpu_check.cli import main

raise SystemExit(main())
