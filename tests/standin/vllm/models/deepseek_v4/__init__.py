"""DeepSeek-V4: like the real package, it imports the NVIDIA DSpark draft."""

from .nvidia.dspark import DSparkDeepseekV4ForCausalLM

__all__ = ["DSparkDeepseekV4ForCausalLM"]
