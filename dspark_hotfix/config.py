"""The switches other than ``DSPARK_HOTFIX`` itself, read once per process.

``DSPARK_HOTFIX`` is read by ``dspark_hotfix.enabled``.
None of the names start with ``VLLM_``: vLLM warns about (or, in hard-fail
mode, rejects) unknown ``VLLM_*`` variables. Each variable gives at most one
warning, quoting at most a few characters of what it was set to: the warning
is printed by every process of a serving image.
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
    """``DSPARK_HOTFIX_PATCHES``: names to enable, or ``-name`` entries to exclude, and the warning
    to say.

    Names are case-insensitive. Unset or blank: every patch. Plain names select exactly those
    patches; with exclusions only, every other patch stays on. Anything else is warned about once,
    with what it selects then: unknown names and empty entries are ignored (if nothing usable is
    left, every patch stays on: a typo must not turn the fix off); of names mixed with exclusions,
    the names less the excluded ones.
    """
    names = tuple(known)
    entries = [entry.strip().lower() for entry in raw.split(",")] if raw and raw.strip() else []
    pairs = [(entry.startswith("-"), entry.removeprefix("-").strip()) for entry in entries]
    include = {name for minus, name in pairs if name in names and not minus}
    exclude = {name for minus, name in pairs if name in names and minus}
    selected = include - exclude if include else set(names) - exclude
    # Unknown names, and empty entries ("," or "-").
    ignored = len({name for _, name in pairs if name not in names})
    if not ignored and not (include and exclude):
        return frozenset(selected), None
    if ignored:
        why = f"{ignored} unknown or empty name{'s' if ignored > 1 else ''} ignored"
    else:
        why = "names mixed with -names"
    chosen = ", ".join(n for n in names if n in selected) or "none"
    return frozenset(selected), (
        f"{PATCHES}={shown(raw)}: {why}; it selects {chosen} (known: {', '.join(names)};"
        " name,name selects only those, -name,-name all but those)"
    )


class Settings:
    """The switches of this process, with the complaints their values raised."""

    def __init__(self, known: Iterable[str], env: Mapping[str, str] = os.environ) -> None:
        self.strict, strict_problem = switch(STRICT, env.get(STRICT), False, "strict mode")
        # The selection's warning is said, but it is not a problem.
        self.selected, self.warning = parse_selection(env.get(PATCHES), known)
        self.problems = [
            p for p in (switch(ENABLE, env.get(ENABLE), True, "the shim")[1], strict_problem) if p
        ]


def settings() -> Settings:
    """The switches, read now, for the patch set ``patches.ALL`` holds now."""
    return Settings(p.name for p in patches.ALL)
