"""Where TRITON_CACHE_MANAGER=kiln._cache:KilnCacheManager points: the value
Kiln sets while enabled, which users also write in their configs. The cache
manager itself is kiln.triton.cache_manager; this name stays for them."""

from kiln.triton.cache_manager import KilnCacheManager

__all__ = ["KilnCacheManager"]
