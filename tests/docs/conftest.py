"""The docs tests share tests/e2e's `remote_server` helpers (a free port)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
