"""How a technique's notebook layer exports what its pages use: `import embnb.lab.<technique> as lab`,
then `lab.name`, each name loading only its module on first use (a page's import cell stays one line
and cheap; the bench imports only the modules it runs).

    __all__, __getattr__, __dir__ = lazy_exports(__name__, {"figures": ["load_heatmap"], "embnb.dist": [...]})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, Sequence[str]]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """(`__all__`, `__getattr__`, `__dir__`) for `package` (its `__name__`); `homes`: module -> the names
    it exports, a module of the package's own (`"figures"`, exported itself too) or a full path
    (`"embnb.dist"`). `__getattr__` raises AttributeError for a name no home exports."""
    home_of = {name: module for module, names in homes.items() for name in names}
    own = {module for module in homes if "." not in module}
    exported = sorted({*home_of, *own})

    def __getattr__(name: str) -> Any:
        if name in own and name not in home_of:
            return importlib.import_module(f"{package}.{name}")
        if name not in home_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        home = home_of[name]
        return getattr(importlib.import_module(home if "." in home else f"{package}.{home}"), name)

    def __dir__() -> list[str]:
        return exported

    return exported, __getattr__, __dir__
