"""Classes a user names by import path in a config (`package.module:Class`, or `package.module.Class` as Hydra's
`_target_` spells one): the one loader of `advantage.estimator` and `task.target`, whose errors are one sentence
naming the key and the fix."""

from __future__ import annotations

import difflib
import importlib


def split(path: str) -> tuple[str, str] | None:
    """(module, class) of `path`, or None when it is not an import path."""
    module_name, _, class_name = path.rpartition(":" if ":" in path else ".")
    return (module_name, class_name) if module_name and class_name else None


def import_class(path: str, key: str):
    """The object `path` names, imported here; `key` is how the error names the setting (`task.target='x:Y'`). A
    ValueError when the module does not import, raises while importing, or lacks the name (with the nearest one)."""
    parts = split(path)
    if parts is None:
        raise ValueError(f"{key} is not an import path; name a class as package.module:Class")
    module_name, class_name = parts
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{key}: module {module_name!r} does not import ({first_line(error)}); install its package "
                         "or put its directory on PYTHONPATH (the role processes, which inherit the environment, "
                         "import it too)") from None
    except Exception as error:  # noqa: BLE001 - any failure to import the user's module is a config error
        raise ValueError(f"{key}: importing module {module_name!r} raised {type(error).__name__}: "
                         f"{first_line(error)}; fix the module") from None
    found = getattr(module, class_name, None)
    if found is None:
        near = difflib.get_close_matches(class_name, [n for n in dir(module) if not n.startswith("_")], n=1)
        raise ValueError(f"{key}: module {module_name!r} has no {class_name!r}; "
                         + (f"did you mean {module_name}:{near[0]}?" if near else "check the class name"))
    return found


def first_line(error: BaseException) -> str:
    """An error's first line (its type's name when it says nothing)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
