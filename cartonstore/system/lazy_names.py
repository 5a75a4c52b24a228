"""A package's names imported from their modules on first use (PEP 562).

A command that needs one module of a package (the store opening its index
for `cartonstore path`) must not load every sibling with it: `path` answers
in well under 100 ms only if it imports what it uses.

    __getattr__, __dir__, __all__ = lazy_names(__name__, {"reader": "ZipReader EntryStream"})
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping


def lazy_names(package: str, modules: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]],
                                                                   list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package``, whose
    names are in ``modules`` (submodule -> its names, space separated). A
    name may not be a submodule's: importing that submodule sets the
    package's attribute of that name to the module."""
    module_of = {name: module for module, names in modules.items() for name in names.split()}
    if clash := set(module_of) & set(modules):
        raise ValueError(f"{package}: {sorted(clash)} name both a submodule and one of its names")

    def __getattr__(name: str) -> object:  # noqa: N807 - a module's __getattr__ (PEP 562)
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        # __import__, not importlib.import_module: -X importtime reports only
        # the former, and tests/cli/test_cli_imports.py reads what it reports.
        __import__(f"{package}.{module}")
        value = getattr(sys.modules[f"{package}.{module}"], name)
        vars(sys.modules[package])[name] = value  # later lookups skip this hook
        return value

    def __dir__() -> list[str]:  # noqa: N807 - a module's __dir__ (PEP 562)
        return sorted({*vars(sys.modules[package]), *module_of})

    return __getattr__, __dir__, sorted(module_of)
