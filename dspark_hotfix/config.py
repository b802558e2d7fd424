"""The switches other than ``DSPARK_HOTFIX`` itself, read once per process.

``DSPARK_HOTFIX`` is read at interpreter start (``dspark_hotfix.enabled``).
None of the names start with ``VLLM_``: vLLM warns about (or, in hard-fail
mode, rejects) unknown ``VLLM_*`` variables.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from dspark_hotfix import ENABLE, FALSE_WORDS, TRUE_WORDS

PATCHES = "DSPARK_HOTFIX_PATCHES"
STRICT = "DSPARK_HOTFIX_STRICT"
LOG = "DSPARK_HOTFIX_LOG"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# The wrapt releases the tests run: 1.17.3 (what the Dockerfile installs) and the newest 2.x.
WRAPT_RANGE = "1.17 to 2.x"

__all__ = ["ENABLE", "LOG", "PATCHES", "STRICT", "Settings"]


def parse_strict(raw: str | None) -> tuple[bool, str | None]:
    """``DSPARK_HOTFIX_STRICT``: on only for a true word; anything else is off, and a
    value that is neither true nor false is complained about."""
    value = (raw or "").strip().lower()
    if not value or value in TRUE_WORDS + FALSE_WORDS:
        return value in TRUE_WORDS, None
    return False, f"{STRICT}={raw!r} is not one of {'/'.join(TRUE_WORDS + FALSE_WORDS)}: strict mode is off"


def parse_level(raw: str | None) -> tuple[str, str | None]:
    """``DSPARK_HOTFIX_LOG``: a logging level name; INFO by default."""
    value = (raw or "").strip().upper() or "INFO"
    if value in LEVELS:
        return value, None
    return "INFO", f"{LOG}={raw!r} is not a log level ({', '.join(LEVELS)}): using INFO"


def parse_selection(raw: str | None, known: Iterable[str]) -> tuple[frozenset[str], list[str]]:
    """``DSPARK_HOTFIX_PATCHES``: names to enable, or ``-name`` entries to exclude.

    Names are case-insensitive. Plain names select exactly those patches; with
    exclusions only, every other patch stays on. Unknown names are complained
    about and ignored; if nothing usable is left, every patch stays on (a typo
    must not turn the fix off). A name both selected and excluded is excluded,
    and said so.
    """
    names = tuple(known)
    include: set[str] = set()
    exclude: set[str] = set()
    problems: list[str] = []
    for entry in (part.strip().lower() for part in (raw or "").split(",")):
        name = entry.removeprefix("-").strip()
        if not name:
            continue
        if name not in names:
            problems.append(f"{PATCHES}: unknown patch {name!r} ignored; known: {', '.join(names)} "
                            "(prefix a name with '-' to exclude it)")
            continue
        (exclude if entry.startswith("-") else include).add(name)
    for name in sorted(include & exclude):
        problems.append(f"{PATCHES} both selects and excludes {name!r}: it is excluded")
    if include:
        return frozenset(include - exclude), problems
    return frozenset(set(names) - exclude), problems


class Settings:
    """The switches of this process, with the complaints their values raised."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.strict, strict_problem = parse_strict(env.get(STRICT))
        self.level, level_problem = parse_level(env.get(LOG))
        self.problems = [p for p in (strict_problem, level_problem) if p]
        self.raw_patches = env.get(PATCHES)

    def selection(self, known: Iterable[str]) -> tuple[frozenset[str], list[str]]:
        return parse_selection(self.raw_patches, known)
