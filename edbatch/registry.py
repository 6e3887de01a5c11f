"""A small name -> object registry for things looked up by names that appear in *data*.

Op kinds inside a graph (``OpType.kind``) are data, so the kernel that runs them is found
through a :class:`Registry` rather than an ``if kind == ...`` chain (STYLE 3.6). Objects
built from configuration go through Hydra's ``_target_`` instead.

Example:
    >>> colors: Registry[int] = Registry("color")
    >>> @colors.register("red")
    ... def _red() -> int:
    ...     return 1
    >>> "red" in colors, colors.names()
    (True, ('red',))
    >>> colors.get("rde")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    edbatch.errors.UnknownNameError: unknown color 'rde'. Did you mean 'red'? Known colors: red.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from edbatch.errors import UnknownNameError, did_you_mean

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; :meth:`get` fails with a did-you-mean hint and the known names.

    Args:
        what: what a name denotes, used in error messages (``"kernel"``, ``"op kind"``).
        hint: extra text appended to every unknown-name error (how to fix it).
    """

    __slots__ = ("_entries", "hint", "what")

    def __init__(self, what: str, hint: str = "") -> None:
        self.what = what
        self.hint = hint
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Return a decorator that registers its argument under ``name`` and returns it.

        Registering the same object twice under one name is a no-op; registering a
        different object under a taken name raises.

        Args:
            name: the lookup key.

        Returns:
            A decorator ``obj -> obj``; it can also be called directly, as
            ``registry.register("name")(obj)``.

        Raises:
            ValueError: ``name`` is already bound to another object.
        """

        def decorator(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None and old is not obj:
                raise ValueError(f"{self.what} {name!r} is already registered ({old!r}); "
                                 f"pick another name or remove the first registration")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """Return the object registered under ``name``.

        Raises:
            UnknownNameError: ``name`` is not registered; the message has a did-you-mean
                hint and lists the known names.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        """The error text for an unknown ``name`` (hint, known names, the registry's fix)."""
        known = ", ".join(sorted(self._entries)) or "none"
        msg = f"unknown {self.what} {name!r}.{did_you_mean(name, self._entries)} "
        msg += f"Known {self.what}s: {known}."
        return msg + (f" {self.hint}" if self.hint else "")

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {len(self)} names)"
