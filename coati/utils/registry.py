"""Named algorithm parts (advantage estimators, policy losses, loss aggregations, KL estimators): a function
registered under a name with a decorator, so a new algorithm is one function, and the flags' choices are the
registry's names (help text and code cannot disagree)."""
import argparse
import importlib
from typing import Callable, Dict, Generic, List, TypeVar

from coati.utils.errors import CoatiUsageError

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions of one kind by name. `@registry.register("name")` adds one; `registry.get(name)` finds it, or
    imports `package.module:function` (whose module may register it on import), or refuses the name listing
    the choices."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: Dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def add(fn: F) -> F:
            if name in self._entries and self._entries[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is registered already")
            self._entries[name] = fn
            return fn

        return add

    def names(self) -> List[str]:
        return list(self._entries)

    def choice(self) -> Callable[[str], str]:
        """An argparse `type`: a registered name, or a `package.module:function` that imports (checked now)."""
        def check(name: str) -> str:
            try:
                self.get(name)
            except CoatiUsageError as error:
                raise argparse.ArgumentTypeError(str(error)) from None
            return name

        check.__name__ = self.kind
        return check

    def get(self, name: str) -> F:
        if name in self._entries:
            return self._entries[name]
        if ":" in name:
            module_name, attr = name.split(":", 1)
            try:
                return getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as error:
                raise CoatiUsageError(f"{self.kind} {name!r} cannot be imported: {error}") from None
        raise CoatiUsageError(f"unknown {self.kind} {name!r}; expected one of {', '.join(self._entries)} "
                              "or package.module:function")
