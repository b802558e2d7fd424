"""The switches: environment variables, read once per process.

Standard library only; it loads with the registry (interpreter start reads
``DSPARK_HOTFIX`` itself, with the same words). None of the names start with
``VLLM_``: vLLM warns about (or, in hard-fail mode, rejects) unknown ``VLLM_*``
variables.
"""

from __future__ import annotations

import os

from dspark_hotfix import FALSE_WORDS

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing and collections.abc cost start-up time
    from collections.abc import Iterable, Mapping

ENABLE = "DSPARK_HOTFIX"
PATCHES = "DSPARK_HOTFIX_PATCHES"
STRICT = "DSPARK_HOTFIX_STRICT"
LOG = "DSPARK_HOTFIX_LOG"

# The wrapt releases the tests run: 1.17.3 (what the Dockerfile installs) and the newest 2.x.
WRAPT_RANGE = "1.17 to 2.x"

_TRUE = frozenset(("1", "true", "on", "yes"))
_FALSE = frozenset(FALSE_WORDS)  # interpreter start reads DSPARK_HOTFIX with the same words
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse_flag(environ: Mapping[str, str], var: str, default: bool) -> tuple[bool, str | None]:
    """A boolean switch; a malformed value gives the default and a complaint."""
    raw = environ.get(var)
    if raw is None or not raw.strip():
        return default, None
    value = raw.strip().lower()
    if value in _TRUE:
        return True, None
    if value in _FALSE:
        return False, None
    state = "on" if default else "off"
    return default, (
        f"{var}={raw!r} is not understood; accepted values are 1/true/on/yes and "
        f"0/false/off/no. Using the default ({state})."
    )


def parse_selection(raw: str | None, known: Iterable[str]) -> tuple[frozenset[str], list[str]]:
    """``DSPARK_HOTFIX_PATCHES``: names to enable, or ``-name`` entries to exclude.

    Plain names select exactly those patches; if only exclusions are given, every
    other patch stays enabled. Unknown names are reported and ignored.
    """
    names = tuple(known)
    if raw is None or not raw.strip():
        return frozenset(names), []
    problems: list[str] = []
    include: set[str] = set()
    exclude: set[str] = set()
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        negate = entry.startswith("-")
        name = entry[1:].strip() if negate else entry
        if name not in names:
            problems.append(
                f"{PATCHES}: unknown patch {name!r} ignored; known patches are "
                f"{', '.join(names)} (prefix a name with '-' to exclude it)."
            )
            continue
        (exclude if negate else include).add(name)
    if include:
        selected = include - exclude
    elif exclude or not problems:
        selected = set(names) - exclude
    else:
        # Nothing usable was named: fall back to the default rather than turning
        # every patch off because of a typo.
        selected = set(names)
    return frozenset(selected), problems


def parse_level(raw: str | None) -> tuple[str, str | None]:
    """``DSPARK_HOTFIX_LOG``: a logging level name; INFO by default."""
    if raw is None or not raw.strip():
        return "INFO", None
    value = raw.strip().upper()
    if value == "WARN":
        value = "WARNING"
    if value in _LEVELS:
        return value, None
    return "INFO", (
        f"{LOG}={raw!r} is not a log level; accepted values are "
        f"{', '.join(_LEVELS)}. Using INFO."
    )


class Settings:
    """The switches of this process, with the complaints their values raised."""

    __slots__ = ("enabled", "level", "problems", "raw_patches", "strict")

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.problems: list[str] = []
        self.enabled = self._flag(env, ENABLE, True)
        self.strict = self._flag(env, STRICT, False)
        self.level, problem = parse_level(env.get(LOG))
        if problem:
            self.problems.append(problem)
        self.raw_patches = env.get(PATCHES)

    def _flag(self, env: Mapping[str, str], var: str, default: bool) -> bool:
        value, problem = parse_flag(env, var, default)
        if problem:
            self.problems.append(problem)
        return value

    def selection(self, known: Iterable[str]) -> tuple[frozenset[str], list[str]]:
        return parse_selection(self.raw_patches, known)
