"""One registry type for lctx's named plug-ins: metrics (:data:`lctx.metrics.METRICS`), tasks
(:data:`lctx.tasks.base.TASKS`, derived names in ``GROUPS``), attention variants and modifiers
(:data:`lctx.models.variants.VARIANTS`, ``MODIFIERS``), ``--attn-override`` names and attention
implementations (:data:`lctx.attn_impl.ATTN_IMPL_REGISTRY`)
(:data:`lctx.models.adapters.overrides.OVERRIDES`). A leaf of the package root: it imports nothing of lctx, so every
layer may use it."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """{name: entry} (a ``dict``: lookups, ``in``, iteration as usual) that knows what it holds (``what``,
    e.g. ``"task"``) and whether a name may be registered twice (``replace``).

    Raises (:meth:`add`):
        ValueError: ``name`` is empty, or already registered and ``replace`` is False.
    """

    def __init__(self, what: str, entries: dict | None = None, *, replace: bool = False):
        super().__init__()
        self.what, self.replace = what, replace
        for name, entry in (entries or {}).items():
            self.add(name, entry)

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name``; returns ``entry`` (so it serves as a decorator's body)."""
        if not name:
            raise ValueError(f"a {self.what} needs a non-empty name")
        if name in self and not self.replace:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self[name] = entry
        return entry

    def decorator(self, name: str, setup: Callable[[T], None] | None = None) -> Callable[[T], T]:
        """A class decorator registering its class under ``name`` (``setup(cls)`` runs first)."""

        def deco(cls: T) -> T:
            if setup is not None:
                setup(cls)
            return self.add(name, cls)

        return deco

    def known(self) -> str:
        """The registered names, sorted, comma-separated (for error messages)."""
        return ", ".join(sorted(self))
