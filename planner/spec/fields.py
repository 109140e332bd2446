"""Strict reading of spec mappings: typed fields, unknown keys are errors, close-match hints.

A `Fields` wraps one mapping and the place it came from (file and key path) so that every error
reads `models/x.yaml: moe.top_k: expected a positive integer, got -1`.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any, Iterable

import yaml

from planner.errors import SpecError
from planner.limits import MAX_DEPTH, MAX_FILE_BYTES, MAX_INT, MAX_NODES

_MISSING = object()


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (last-one-wins would
    silently plan another model)."""


def _unique_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, str) and key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              lambda loader, node: _unique_mapping(loader, node, deep=True))


def read_text(path: Path, error=SpecError) -> str:
    """A file's text: at most limits.MAX_FILE_BYTES of UTF-8, else one `error` line."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not a file") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise error(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB, the most a spec or plan file may be")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def parse_json(text: str, where, error=SpecError):
    """Strict JSON: no NaN or Infinity, no key twice in an object, nesting and size within the
    limits (check_shape)."""
    def pairs(items):
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            twice = next(k for k in keys if keys.count(k) > 1)
            raise error(f"{where}: key {twice!r} given twice in one object")
        return dict(items)

    def constant(name):
        raise error(f"{where}: {name} is not a number strict JSON allows")

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as e:
        raise error(f"{where}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise error(f"{where}: {str(e).split(';')[0]}") from None
    except RecursionError:
        raise error(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    check_shape(data, where, error)
    return data


def check_shape(data, where, error=SpecError) -> None:
    """Nesting of at most MAX_DEPTH levels and MAX_NODES values (shared YAML aliases counted each
    time they are reached), finite numbers, integers below limits.MAX_INT: what every reader accepts."""
    stack, nodes = [(data, 1)], 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise error(f"{where}: more than {MAX_NODES:,} values (aliases expanded)")
        if depth > MAX_DEPTH:
            raise error(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise error(f"{where}: {value} is not a finite number")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise error(f"{where}: the integer {str(value)[:20]}{'...' if len(str(value)) > 20 else ''} is too large")


def load_document(path: Path):
    """Parse a YAML or JSON file strictly (read_text, parse_json, duplicate YAML keys refused,
    check_shape), turning every read and parse error into one SpecError line."""
    text = read_text(path)
    if path.suffix == ".json":
        return parse_json(text, path)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise SpecError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise SpecError(f"{path}: {str(e).split(';')[0]}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{path}: malformed YAML{where}: {problem}") from None
    check_shape(data, path)
    return data


def load_mapping(path: Path) -> dict:
    """A YAML or JSON file whose top level is a mapping."""
    data = load_document(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _short(value) -> str:
    """repr of a value, cut to 40 characters (a 5,000-digit integer is not echoed whole)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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

    def int(self, key: str, default: Any = _MISSING, minimum: int = 1, maximum: int = MAX_INT) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int) and not (isinstance(value, float) and value.is_integer()):
            raise self.error(key, f"expected an integer, got {_short(value)}")
        if value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {_short(value)}")
        if value > maximum:
            raise self.error(key, f"expected an integer <= {maximum:,}, got {_short(value)}")
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
        if not math.isfinite(value) or abs(value) > MAX_INT:
            raise self.error(key, f"expected a finite number of at most {MAX_INT:.0e}, got {_short(value)}")
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
