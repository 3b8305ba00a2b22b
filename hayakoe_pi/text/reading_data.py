"""How things are read (data/readings.yaml), loaded once for readings.py and numbers.py."""

from __future__ import annotations

from pathlib import Path

import yaml

DATA = yaml.load(
    (Path(__file__).resolve().parent / "data" / "readings.yaml").read_text(encoding="utf-8"),
    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
)
