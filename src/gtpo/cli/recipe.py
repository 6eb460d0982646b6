"""Reading a recipe: the flat YAML mapping of argument names to values that ``gtpo train --config``,
``gtpo sft --config`` and ``gtpo inspect --config`` start from (recipes/ holds the paper's)."""

from __future__ import annotations

from pathlib import Path

from gtpo.errors import UsageError


def read_recipe(path: str | Path) -> dict:
    """A recipe: a flat YAML mapping of argument names to values."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UsageError(
            f"recipe {str(path)!r} not found (recipes live in recipes/, e.g. recipes/qwen2.5-3b/gsm8k/gtpo-g8.yaml)"
        )
    try:
        recipe = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise UsageError(f"recipe {str(path)!r} is not valid YAML: {err}") from None
    if recipe is None:
        return {}
    if not isinstance(recipe, dict):
        raise UsageError(f"recipe {str(path)!r} must be a mapping of argument names to values")
    return recipe
