"""The reading tables (data/readings.yaml), loaded once for every module that reads with them."""

from __future__ import annotations

from pathlib import Path

import yaml

TABLE: dict = yaml.load(
    (Path(__file__).resolve().parent / "data" / "readings.yaml").read_text(encoding="utf-8"),
    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
)
