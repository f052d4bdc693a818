"""The one rule for optional hooks: a capability exists when a backend overrides its hook.

The runtime's contract classes (``BufferType``, ``Buffer``, ``Device``, ``Backend``, ``Event``)
implement every optional hook with its fallback. Whether a backend *has* the capability is
never a flag kept beside the code: it is whether the backend's class overrides the hook, asked
through ``overrides``. Derived flags (``DeviceCaps``) are computed from it.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["overrides"]


def overrides(obj: object, base: type, hook: str) -> bool:
    """Whether ``obj`` (an instance or a class) overrides ``base``'s ``hook``."""
    cls = obj if isinstance(obj, type) else type(obj)
    return _overrides(cls, base, hook)


@lru_cache(maxsize=None)
def _overrides(cls: type, base: type, hook: str) -> bool:
    return getattr(cls, hook) is not getattr(base, hook)
