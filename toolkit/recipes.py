"""Build recipes: YAML files in build/ that fix what to build; what they leave out comes from the planner.

A recipe names its model and its target (cpu, synthetic, or a GPU) and sets build settings by their
recipe keys (toolkit.build_settings: `batching.max_batch_size`, `kv_cache.tokens`, ...). A key that
does not apply to the recipe's target is refused by name (toolkit.targets checks), so a recipe
always means what it says.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from toolkit.build_settings import RECIPE_KEYS, BuildSettings, Setting, pairs_from_mapping
from toolkit.errors import RecipeError
from toolkit.targets import TARGET_NAMES, get_target

_TOP_KEYS = ("name", "model", "target")
# Sections hold keys (batching.max_batch_size); a key without a section (lora) is a top-level mapping.
_SECTIONS = sorted({key.split(".")[0] for key in RECIPE_KEYS if "." in key})


@dataclass(frozen=True)
class BuildRecipe:
    name: str
    path: str
    model: str | None
    target: str
    settings: BuildSettings = field(default_factory=BuildSettings)

    def overridden(self, model: str | None, target: str, settings: BuildSettings) -> BuildRecipe:
        """This recipe with the command line's model, target and settings over its own."""
        return replace(
            self,
            model=model or self.model,
            target=target,
            settings=self.settings.overridden(settings),
        )


def recipes_dir() -> Path:
    """build/ of a source checkout, or the copy a wheel carries as toolkit/_recipes."""
    package = Path(__file__).resolve().parent
    for candidate in (package.parent / "build", package / "_recipes"):
        if candidate.is_dir():
            return candidate
    return package.parent / "build"


def list_recipes() -> list[str]:
    return sorted(p.stem for p in recipes_dir().glob("*.yaml"))


def load_recipe(name_or_path: str | Path) -> BuildRecipe:
    """Load and validate a recipe by file path or by name (build/NAME.yaml)."""
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        path = recipes_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        raise RecipeError(
            f"no recipe {str(name_or_path)!r}",
            hint=f"use a path to a YAML file or one of: {', '.join(list_recipes())}",
            value=str(name_or_path),
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path} is not valid YAML: {exc}", hint="fix the YAML syntax") from exc
    return recipe_from_dict(data, path)


def recipe_from_dict(data: Any, path: Path) -> BuildRecipe:
    """A recipe's settings by their recipe keys, each checked by its row (the target checks the rest)."""
    if not isinstance(data, dict):
        raise RecipeError(
            f"{path}: a recipe is a YAML mapping, got {type(data).__name__}",
            hint="see build/*.yaml for examples",
        )
    top: dict[str, str] = {"name": path.stem}
    values: dict[str, Any] = {}
    for key, value in _flatten(data, path):
        if key in _TOP_KEYS:
            if not isinstance(value, str) or not value.strip():
                raise RecipeError(
                    f"{path}: {key} must be a non-empty string, got {value!r}",
                    hint=f"fix {key} in {path}",
                    value=value,
                )
            top[key] = value
            continue
        row = RECIPE_KEYS[key]
        if row.multiple:
            value = _pairs_in(value, path)
        problem = row.problem(value)
        if problem is not None:
            raise RecipeError(
                f"{path}: {key} must be {problem}, got {value!r}",
                hint=f"fix {key} in {path}",
                value=value,
            )
        values[row.name] = Path(value) if row.kind is Path else value
    for required in ("model", "target"):
        if required not in top:
            raise RecipeError(
                f"{path}: missing required key {required!r}", hint=f"add `{required}:` to {path}"
            )
    if top["target"].strip().lower() not in TARGET_NAMES:
        raise RecipeError(
            f"{path}: target must be one of {', '.join(TARGET_NAMES)}, got {top['target']!r}",
            hint=f"fix target in {path}",
            value=top["target"],
        )
    recipe = BuildRecipe(
        top["name"], str(path), top["model"], top["target"], BuildSettings(**values)
    )
    get_target(recipe.target).check_settings(recipe.settings, lambda row: _key_in(row, path))
    return recipe


def _pairs_in(value: Any, path: Path) -> Any:
    """A recipe's {NAME: PATH} mapping as (name, path) pairs, a relative local PATH taken from the recipe's
    folder (hf: ids as written)."""
    pairs = pairs_from_mapping(value)
    if not isinstance(pairs, tuple):
        return pairs
    return tuple(
        (name, _from_recipe_folder(where, path)) if isinstance(where, str) else (name, where)
        for name, where in pairs
    )


def _from_recipe_folder(where: str, recipe: Path) -> str:
    if where.startswith("hf:") or not where.strip() or Path(where).expanduser().is_absolute():
        return where
    return str((recipe.parent / where).resolve())


def _key_in(row: Setting, path: Path) -> str:
    return f"{path}: {row.recipe_key}"


def _flatten(data: dict, path: Path) -> list[tuple[str, Any]]:
    items = []
    for key, value in data.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise RecipeError(
                    f"{path}: {key} must be a mapping, got {value!r}",
                    hint=f"write {key}: as a section with keys under it",
                )
            items += [(f"{key}.{sub}", v) for sub, v in value.items()]
        else:
            items.append((str(key), value))
    for key, _ in items:
        if key not in RECIPE_KEYS and key not in _TOP_KEYS:
            raise RecipeError(
                f"{path}: unknown key {key!r}",
                hint=f"allowed keys: {', '.join([*_TOP_KEYS, *RECIPE_KEYS])}",
                value=key,
            )
    return items


def command_line_recipe(model: str | None, target: str) -> BuildRecipe:
    """The recipe of a build given only on the command line."""
    return BuildRecipe(name="command-line", path="", model=model, target=target)
