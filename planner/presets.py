"""Where preset files live: inside the installed wheel (planner/_presets) or, in a checkout,
at the top of the repository (models/, hardware/)."""

from __future__ import annotations

from pathlib import Path

from planner.errors import SpecError
from planner.spec.fields import close_matches

_PACKAGE = Path(__file__).resolve().parent


def preset_dir(kind: str) -> Path:
    """Folder of one preset kind: 'models', 'hardware/gpus' or 'hardware/clusters'."""
    for root in (_PACKAGE / "_presets", _PACKAGE.parent):
        folder = root / kind
        if folder.is_dir():
            return folder
    raise SpecError(f"preset folder {kind}/ is missing from this installation")


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in preset_dir(kind).glob("*.yaml"))


def resolve(ref: str, kind: str, what: str) -> Path:
    """A path to an existing file, or the file of a preset name; else a SpecError with close names."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml", ".json") or "/" in ref or path.is_file():
        if path.is_dir():
            raise SpecError(f"{ref}: a folder, not a {what} file (give the file itself, e.g. its config.json "
                            "or YAML)")
        if not path.is_file():
            raise SpecError(f"{ref}: no such {what} file")
        return path
    candidate = preset_dir(kind) / f"{ref}.yaml"
    if candidate.is_file():
        return candidate
    names = preset_names(kind)
    raise SpecError(f"unknown {what} preset {ref!r}{close_matches(ref, names)}; presets: {', '.join(names)}")
