"""The patches, one module each. Imported only once vLLM is being imported."""

from __future__ import annotations

from dspark_hotfix.patches.attention_kv_cache_spec import PATCH as ATTENTION_KV_CACHE_SPEC
from dspark_hotfix.patches.base import Patch, PatchUnavailable, Verdict
from dspark_hotfix.patches.draft_load_coverage import PATCH as DRAFT_LOAD_COVERAGE
from dspark_hotfix.patches.kv_view_guard import PATCH as KV_VIEW_GUARD
from dspark_hotfix.patches.remap_dspark_name import PATCH as REMAP_DSPARK_NAME
from dspark_hotfix.patches.swa_kv_cache_spec import PATCH as SWA_KV_CACHE_SPEC

# Guards come after the patches they depend on.
ALL: tuple[Patch, ...] = (
    REMAP_DSPARK_NAME,
    ATTENTION_KV_CACHE_SPEC,
    SWA_KV_CACHE_SPEC,
    DRAFT_LOAD_COVERAGE,
    KV_VIEW_GUARD,
)

__all__ = ["ALL", "Patch", "PatchUnavailable", "Verdict"]
