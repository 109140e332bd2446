"""What changed between two plans. Equivalent plans have equal strategy, stages and placement
and every prediction within 1e-6 relative (DESIGN.md), and over several pools equal batch shares
(pools[].share, numbers to the same tolerance); planner_version, alternatives, notes and the
search's counts do not count."""

from __future__ import annotations

import math

REL_TOL = 1e-6
COMPARED = ("strategy", "stages", "placement", "prediction")


def _walk(old, new, path: str, out: list, numeric: bool) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            where = f"{path}.{key}"
            if key not in old:
                out.append({"key": where, "old": None, "new": new[key]})
            elif key not in new:
                out.append({"key": where, "old": old[key], "new": None})
            else:
                _walk(old[key], new[key], where, out, numeric)
        return
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for k, (a, b) in enumerate(zip(old, new)):
            _walk(a, b, f"{path}[{k}]", out, numeric)
        return
    both_numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (old, new))
    if numeric and both_numbers:
        scale = max(abs(old), abs(new))
        if scale and abs(new - old) / scale > REL_TOL:
            change = {"key": path, "old": old, "new": new}
            pct = (new - old) / abs(old) * 100 if old else math.inf
            if math.isfinite(pct):  # a change from (nearly) zero has no finite percentage
                change["change_pct"] = pct
            out.append(change)
        return
    if old != new:
        out.append({"key": path, "old": old, "new": new})


def diff(old: dict, new: dict) -> list[dict]:
    """Every difference that makes two plans not equivalent, as {key, old, new[, change_pct]}."""
    changes: list[dict] = []
    for section in COMPARED:
        _walk(old.get(section), new.get(section), section, changes, numeric=section == "prediction")
    _walk(_shares(old), _shares(new), "shares", changes, numeric=True)
    return changes


def _shares(doc: dict) -> dict:
    """Each pool's share of a plan over several pools, by pool name (empty for any other plan)."""
    return {p["name"]: p["share"] for p in doc.get("pools", []) if "share" in p}
