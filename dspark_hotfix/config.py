"""The switches other than ``DSPARK_HOTFIX`` itself, read once per process.

``DSPARK_HOTFIX`` is read at interpreter start (``dspark_hotfix.enabled``).
None of the names start with ``VLLM_``: vLLM warns about (or, in hard-fail
mode, rejects) unknown ``VLLM_*`` variables. Each variable gives at most one
warning, quoting at most a few names or characters of what it was set to: the
warning is printed by every process of a serving image.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from dspark_hotfix import ENABLE, FALSE_WORDS, TRUE_WORDS, shown

PATCHES = "DSPARK_HOTFIX_PATCHES"
STRICT = "DSPARK_HOTFIX_STRICT"
LOG = "DSPARK_HOTFIX_LOG"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# The wrapt releases the tests run: 1.17.3 (what the Dockerfile installs) and the newest 2.x.
WRAPT_RANGE = "1.17 to 2.x"

__all__ = ["ENABLE", "LOG", "PATCHES", "STRICT", "Settings", "enable_problem"]


def enable_problem(raw: str | None) -> str | None:
    """The complaint about a ``DSPARK_HOTFIX`` value, worded as interpreter start words it."""
    if raw is None or raw.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return None
    return f"{ENABLE}={shown(raw)} is not one of {'/'.join(TRUE_WORDS + FALSE_WORDS)}: the shim is OFF"


def parse_selection(raw: str | None, known: Iterable[str]) -> tuple[frozenset[str], str | None]:
    """``DSPARK_HOTFIX_PATCHES``: names to enable, or ``-name`` entries to exclude.

    Names are case-insensitive. Plain names select exactly those patches; with
    exclusions only, every other patch stays on. Unknown names are ignored; if
    nothing usable is left, every patch stays on (a typo must not turn the fix
    off). A name both selected and excluded is excluded.
    """
    names = tuple(known)
    include: set[str] = set()
    exclude: set[str] = set()
    unknown: dict[str, None] = {}
    for entry in (part.strip().lower() for part in (raw or "").split(",")):
        name = entry.removeprefix("-").strip()
        if name in names:
            (exclude if entry.startswith("-") else include).add(name)
        elif name:
            unknown[name] = None
    both = sorted(include & exclude)
    said = [f"{len(unknown)} unknown {'name' if len(unknown) == 1 else 'names'} ignored "
            f"({', '.join(shown(n, 40) for n in list(unknown)[:3])}{', ...' if len(unknown) > 3 else ''}; "
            f"known: {', '.join(names)}; prefix a name with '-' to exclude it)"] if unknown else []
    said += [f"{', '.join(both)} both selected and excluded: excluded"] if both else []
    problem = f"{PATCHES}: {'; '.join(said)}" if said else None
    return frozenset(include - exclude) if include else frozenset(set(names) - exclude), problem


class Settings:
    """The switches of this process, with the complaints their values raised."""

    def __init__(self, known: Iterable[str], environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw_strict, raw_level = env.get(STRICT), env.get(LOG)
        strict = (raw_strict or "").strip().lower()
        self.strict = strict in TRUE_WORDS
        level = (raw_level or "").strip().upper() or "INFO"
        self.level = level if level in LEVELS else "INFO"
        self.selected, selection_problem = parse_selection(env.get(PATCHES), known)
        self.problems = [p for p in (
            enable_problem(env.get(ENABLE)),
            None if not strict or strict in TRUE_WORDS + FALSE_WORDS else
            f"{STRICT}={shown(raw_strict)} is not one of {'/'.join(TRUE_WORDS + FALSE_WORDS)}: strict mode is off",
            None if level in LEVELS else f"{LOG}={shown(raw_level)} is not a log level ({', '.join(LEVELS)}): "
            "using INFO",
            selection_problem,
        ) if p]
