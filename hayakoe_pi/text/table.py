"""The reading tables (data/readings.yaml), loaded once for every module that reads with them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

TABLE: dict = yaml.load(
    (Path(__file__).resolve().parent / "data" / "readings.yaml").read_text(encoding="utf-8"),
    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
)


def alternation(words) -> str:
    """A regex alternation of table words, longest first (so 時間 is tried before 時)."""
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
