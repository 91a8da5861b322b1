#!/usr/bin/env python3
"""Launch the fake provider server: `python scripts/fake_provider.py [--host] [--port] [--script]`.

Only a launcher, so the demo and benchmarks can start it from a checkout; the server itself is
`metis.testing.fake_provider`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metis.testing.fake_provider import main

if __name__ == "__main__":
    raise SystemExit(main())
