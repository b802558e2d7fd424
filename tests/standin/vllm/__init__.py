"""Stand-in for the vLLM pre-release build that crashes with DSpark (tests only)."""

__version__ = "0.23.1rc1.dev788+gfa4321de3"
