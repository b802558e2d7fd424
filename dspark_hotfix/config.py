"""The switches other than ``DSPARK_HOTFIX`` itself, read once per process.

``DSPARK_HOTFIX`` is read by ``dspark_hotfix.enabled``.
None of the names start with ``VLLM_``: vLLM warns about (or, in hard-fail
mode, rejects) unknown ``VLLM_*`` variables. Each variable gives at most one
warning, quoting at most a few names or characters of what it was set to: the
warning is printed by every process of a serving image.
"""

import os
from collections.abc import Iterable, Mapping

from dspark_hotfix import ENABLE, patches, shown, switch

PATCHES = "DSPARK_HOTFIX_PATCHES"
STRICT = "DSPARK_HOTFIX_STRICT"

# The wrapt releases the tests run: 1.17.3 (what the Dockerfile installs) and the newest 2.x.
WRAPT_OLDEST, WRAPT_NEWEST_MAJOR = (1, 17), 2
WRAPT_RANGE = f"{WRAPT_OLDEST[0]}.{WRAPT_OLDEST[1]} to {WRAPT_NEWEST_MAJOR}.x"


def parse_selection(raw: str | None, known: Iterable[str]) -> tuple[frozenset[str], str | None]:
    """``DSPARK_HOTFIX_PATCHES``: names to enable, or ``-name`` entries to exclude.

    Names are case-insensitive. Plain names select exactly those patches.
    With exclusions only, every other patch stays on. Unknown names are ignored,
    with a warning; if nothing usable is left, every patch stays on (a typo must
    not turn the fix off). A name both selected and excluded is excluded.
    """
    names = tuple(known)
    entries = [entry.strip().lower() for entry in (raw or "").split(",") if entry.strip()]
    pairs = [(entry.startswith("-"), entry.removeprefix("-").strip()) for entry in entries]
    include = {name for minus, name in pairs if name in names and not minus}
    exclude = {name for minus, name in pairs if name in names and minus}
    unknown = list(dict.fromkeys(name for _, name in pairs if name and name not in names))
    problem = (f"{PATCHES}: {len(unknown)} unknown {'name' if len(unknown) == 1 else 'names'} ignored "
               f"({', '.join(shown(name, 40) for name in unknown[:3])}{', ...' if len(unknown) > 3 else ''}; "
               f"known: {', '.join(names)}; prefix a name with '-' to exclude it)") if unknown else None
    selected = include - exclude if include else set(names) - exclude
    return frozenset(selected), problem


class Settings:
    """The switches of this process, with the complaints their values raised."""

    def __init__(self, known: Iterable[str], env: Mapping[str, str] = os.environ) -> None:
        self.strict, strict_problem = switch(STRICT, env.get(STRICT), False, "strict mode")
        self.selected, self.unknown = parse_selection(env.get(PATCHES), known)  # unknown: ignored, warned
        self.problems = [p for p in (switch(ENABLE, env.get(ENABLE), True, "the shim")[1], strict_problem) if p]


def settings() -> Settings:
    """The switches, read now, for the patch set ``patches.ALL`` holds now."""
    return Settings(p.name for p in patches.ALL)
