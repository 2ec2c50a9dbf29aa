"""Typed reads from a resolved config.json, one error per bad field, named as the file names it.

Shared by the config reader (`lab.sizing.config_reader`) and the readers of the families whose
layers are not all alike (`lab.sizing.layer_plan`).
"""

from __future__ import annotations

import math
from typing import Any

from lab.sizing.hf_defaults import Resolved
from lab.sizing.model_spec import LIMITS

# Bounds for the keys the reader checks that are not ModelSpec fields.
READ_LIMITS = {"hidden_size": (1, 10**7), "layer_index": (1, 1_000),
               "state_dim": (1, 1 << 20), "list_length": (0, 1_000)}


def is_whole(value: Any) -> bool:
    """A JSON number that is an integer (bools are not numbers here; 32.0 counts as 32)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return (isinstance(value, float) and math.isfinite(value) and value.is_integer()
            and abs(value) < 2**53)


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Fields:
    """Reads typed fields from a resolved config, collecting one error per bad field (under
    the name the file uses for it)."""

    def __init__(self, view: Resolved):
        self.view = view
        self.config = view.values
        self.errors: dict[str, str] = {}
        self.notes = view.notes

    def present(self, key: str) -> bool:
        return self.config.get(key) is not None

    def whole(self, key: str, limits: str, *, required: bool = False, default: int = 0) -> int:
        """The integer at `key`, checked against LIMITS[limits] (or READ_LIMITS)."""
        name = self.view.key(key)
        if not self.present(key):
            if required:
                self.errors[name] = "missing"
            return default
        value = self.config[key]
        if not is_whole(value):
            self.errors[name] = f"must be a whole number, got {show(value)}"
            return default
        low, high = LIMITS.get(limits) or READ_LIMITS[limits]
        if not low <= int(value) <= high:
            self.errors[name] = f"must be between {low:,} and {high:,}, got {int(value):,}"
            return default
        return int(value)

    def strings(self, key: str, length: int) -> list[str] | None:
        """A list of `length` strings at `key` (None when absent or wrong, with an error)."""
        value = self.config.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.errors[key] = "must be a list of strings"
            return None
        if length and len(value) != length:
            self.errors[key] = f"{len(value)} entries for {length} layers"
            return None
        return value

    def text(self, key: str) -> str | None:
        """The string at `key` (None when absent or not a string, with an error)."""
        value = self.config.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or len(value) > READ_LIMITS["list_length"][1]:
            self.errors[key] = f"must be a string of at most 1,000 characters, got {show(value)}"
            return None
        return value
