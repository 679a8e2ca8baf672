"""One registry class for every kind of named strategy: routers, autoscaling policies, pool roles,
PD proxy flows, planner families and engine memory policies.

A :class:`Registry` maps a name to one entry (a strategy class, or a strategy object or record) and
reads like a read-only mapping, so ``REG[name]``, ``name in REG``, ``sorted(REG)`` and
``REG.items()`` work as they did on the plain dicts it replaces.  Invariants:

* names are non-empty strings, each registered once: a second entry under a name is refused, so a
  strategy cannot silently replace another;
* iteration, :meth:`Registry.names`, ``items()`` and ``values()`` follow registration order (error
  messages that list the names in that order, and listings shown to users, stay stable);
* entries are never removed or replaced after registration, and :meth:`Registry.register` returns
  the entry itself, so a decorated class is the class that was written;
* an unknown name raises :class:`UnknownNameError`, which lists the known names.  It is both a
  ``KeyError`` (mapping-style callers) and a ``ValueError`` (callers that report bad input).

This module imports no project module, so any layer may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar, overload

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name that is not in a registry; the message lists the names that are."""

    def __str__(self) -> str:
        # KeyError's own str() shows the message quoted, as a key would be.
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Named entries of one strategy kind, keyed by ``name`` (the entry's ``name`` attribute unless
    given), in registration order.

    ``kind`` names one entry in messages ("router"); ``plural`` names several ("routers", by default
    ``kind`` + "s").  ``entries`` are registered in order, as by :meth:`register`.
    """

    def __init__(self, kind: str, entries: Iterable[T] = (), *, plural: str | None = None) -> None:
        self.kind = kind
        self.plural = plural if plural is not None else kind + "s"
        self._entries: dict[str, T] = {}
        for entry in entries:
            self.register(entry)

    @overload
    def register(self, entry: T, /, *, name: str | None = None) -> T: ...

    @overload
    def register(self, entry: None = None, /, *, name: str) -> Callable[[T], T]: ...

    def register(self, entry=None, /, *, name=None):
        """Add ``entry`` under ``name`` (default: ``entry.name``) and return it unchanged.

        Works as a plain call, as a bare decorator (``@REG.register``) and, with only a name, as a
        decorator factory (``@REG.register(name="x")``).  A name already registered raises
        ``ValueError``; a missing or empty name raises ``TypeError``/``ValueError``.
        """
        if entry is None:
            if name is None:
                raise TypeError(f"register a {self.kind}: give the entry, or name= to decorate one")
            return lambda e: self.register(e, name=name)
        key = getattr(entry, "name", None) if name is None else name
        if key is None:
            raise TypeError(f"{self.kind} {entry!r} has no 'name' attribute; pass name= to register it")
        if not isinstance(key, str) or not key:
            raise ValueError(f"a {self.kind} is registered under a non-empty string name, not {key!r}")
        if key in self._entries:
            raise ValueError(f"{self.kind} '{key}' is already registered")
        self._entries[key] = entry
        return entry

    def get(self, name: str) -> T:
        """The entry registered under ``name``; :class:`UnknownNameError` (listing the known names,
        sorted) if there is none."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name is unknown too
            raise UnknownNameError(
                f"unknown {self.kind} '{name}'; known {self.plural}: {sorted(self._entries)}"
            ) from None

    __getitem__ = get

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    keys = names

    def values(self) -> tuple[T, ...]:
        return tuple(self._entries.values())

    def items(self) -> tuple[tuple[str, T], ...]:
        return tuple(self._entries.items())

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={list(self._entries)})"
