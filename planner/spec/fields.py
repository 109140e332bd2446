"""Strict reading of spec mappings: typed fields, unknown keys are errors, close-match hints.

A `Fields` wraps one mapping and the place it came from (file and key path) so that every error
reads `models/x.yaml: moe.top_k: expected a positive integer, got -1`.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Iterable

import yaml

from planner.errors import SpecError

_MISSING = object()


def load_document(path: Path):
    """Parse a YAML or JSON file, turning read and parse errors into one SpecError line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror})") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{path}: malformed YAML{where}: {problem}") from None
    return data


def load_mapping(path: Path) -> dict:
    """A YAML or JSON file whose top level is a mapping."""
    data = load_document(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def close_matches(word: str, choices: Iterable[str]) -> str:
    """' (did you mean a, b?)' or '' when nothing is close."""
    found = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(found)}?)" if found else ""


class Fields:
    """Typed, strict access to one mapping of a spec."""

    def __init__(self, data: Any, where: str, prefix: str = ""):
        if not isinstance(data, dict):
            raise SpecError(f"{where}: {prefix.rstrip('.') or 'document'}: expected a mapping, got {type(data).__name__}")
        self.data = data
        self.where = where
        self.prefix = prefix
        self.used: set[str] = set()

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(f"{self.where}: {self.prefix}{key}: {message}")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def _get(self, key: str, default: Any) -> Any:
        self.used.add(key)
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise self.error(key, "missing (required)")
            return default
        return value

    def int(self, key: str, default: Any = _MISSING, minimum: int = 1) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int) and not (isinstance(value, float) and value.is_integer()):
            raise self.error(key, f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {value!r}")
        return int(value)

    def float(self, key: str, default: Any = _MISSING, minimum: float = 0.0, positive: bool = True,
              maximum: float | None = None) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, str):
            # YAML 1.1 reads 2.0e9 (no exponent sign) as a string: accept what Python reads as a number
            try:
                value = float(value)
            except ValueError:
                raise self.error(key, f"expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {value!r}")
        if positive and value <= minimum or not positive and value < minimum:
            raise self.error(key, f"expected a number {'>' if positive else '>='} {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"expected a number <= {maximum}, got {value!r}")
        return float(value)

    def bool(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def str(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str) or not value:
            raise self.error(key, f"expected a non-empty string, got {value!r}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if value not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}, got {value!r}{close_matches(str(value), choices)}")
        return value

    def sub(self, key: str) -> "Fields | None":
        """The nested mapping under `key`, or None when absent."""
        value = self._get(key, None)
        return None if value is None else Fields(value, self.where, f"{self.prefix}{key}.")

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default)

    def reject_unknown(self, allowed: Iterable[str] | None = None) -> None:
        """Raise on any key not read (or not in `allowed`), naming the closest known key."""
        known = set(allowed) if allowed is not None else self.used
        for key in self.data:
            if key not in known:
                hint = close_matches(str(key), known)
                raise self.error(str(key), f"unknown key{hint}")
