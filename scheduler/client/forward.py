"""`Forward`: a read-only attribute that reads the same attribute of an object it holds, live
(one line per name instead of a hand-written property each). `AsyncSession` shows its state
object's facts this way, and the blocking `Session` its async session's."""

from __future__ import annotations

from typing import Any, Generic, Never, TypeVar, overload

T = TypeVar("T")


class Forward(Generic[T]):
    """`name = Forward[T](via)`: `obj.name` reads `getattr(obj, via).name`."""

    def __init__(self, via: str) -> None:
        self._via = via

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Forward[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Forward[T] | T:
        if obj is None:
            return self
        value: T = getattr(getattr(obj, self._via), self._name)
        return value

    def __set__(self, obj: object, value: Never) -> None:
        # Read-only like a property: the state belongs to the object forwarded to.
        raise AttributeError(f"{self._name} is read-only")
