"""Load a machine definition from a Python module given by path or dotted name.

The reference stored with an instance must load on every host that may run
it, so it never depends on where the starting process happened to be: a file
under the machines root (``$FSM_MACHINES_ROOT``, else the current directory)
is recorded relative to that root (``machines/moderation.py``), a file inside a
``sys.path`` package by its dotted name, a dotted name as given; only a file
outside all of those is recorded by its absolute path.  A relative path is
looked up in the current directory, then under the root.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType

from ..definition import Machine
from ..errors import DefinitionError, MachineLoadError

#: The environment variable naming the directory machine paths are relative to.
ROOT_ENV = "FSM_MACHINES_ROOT"


def machines_root() -> str:
    """The directory relative machine paths are resolved against (absolute)."""
    return os.path.abspath(os.environ.get(ROOT_ENV) or os.getcwd())


def _under(path: str, folder: str) -> str | None:
    rel = os.path.relpath(path, folder)
    return None if rel.startswith(os.pardir) or os.path.isabs(rel) else rel


def _dotted(path: str) -> str | None:
    """``path``'s dotted module name via a ``sys.path`` entry whose packages lead to it."""
    stem = os.path.splitext(path)[0]
    for entry in sys.path[1:]:  # [0] is the script's own folder
        rel = _under(stem, os.path.abspath(entry or os.curdir)) if entry else None
        if not rel or os.path.basename(stem) == "__init__":
            continue
        parts = rel.split(os.sep)
        folder = os.path.abspath(entry)
        if all(p.isidentifier() for p in parts) and all(
                os.path.isfile(os.path.join(folder, *parts[:i], "__init__.py"))
                for i in range(1, len(parts))):
            return ".".join(parts)
    return None


def reference(path: str) -> str:
    """The portable reference for the machine file ``path`` (see the module docstring)."""
    path = os.path.abspath(path)
    rel = _under(path, machines_root())
    if rel is not None:
        return rel
    return _dotted(path) or path


def resolve(target: str) -> str:
    """The file a (possibly relative) machine path names: the current directory first,
    then the machines root."""
    if os.path.isabs(target) or os.path.exists(target):
        return os.path.abspath(target)
    under_root = os.path.join(machines_root(), target)
    return under_root if os.path.exists(under_root.partition(":")[0]) or os.path.exists(
        under_root) else os.path.abspath(target)


def _import_path(path: str) -> ModuleType:
    name = "fsm_machine_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise MachineLoadError(path, "not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _find(module: ModuleType, ref: str, attr: str | None) -> Machine:
    if attr:
        obj = getattr(module, attr, None)
        if not isinstance(obj, Machine):
            raise MachineLoadError(ref, f"{attr!r} is not a fsm_engine.Machine")
        return obj
    if isinstance(getattr(module, "machine", None), Machine):
        return module.machine
    found = [v for v in vars(module).values() if isinstance(v, Machine)]
    if len(found) != 1:
        raise MachineLoadError(ref, "define exactly one fsm_engine.Machine, or name it `machine`"
                               if found else "the module defines no fsm_engine.Machine")
    return found[0]


def load_machine(ref: str) -> tuple[Machine, str]:
    """Load ``ref`` — ``path/to/file.py``, ``package.module`` or either with ``:attr``.

    Returns the machine and a portable reference to store with instances
    (``reference``: a path relative to the machines root, or a dotted name).  Raises ``MachineLoadError`` (one line) when
    the module is missing, fails to import or defines no machine;
    ``DefinitionError`` propagates from checks done at import time.
    """
    target, _, attr = ref.partition(":") if not os.path.exists(resolve(ref)) else (ref, "", "")
    is_file = target.endswith(".py") or os.sep in target
    try:
        if is_file:
            path = resolve(target)
            if os.path.isdir(path):
                raise MachineLoadError(ref, f"{target} is a directory, not a Python file")
            if not os.path.isfile(path):
                raise MachineLoadError(ref, f"no such file {target}")
            module, canonical = _import_path(path), reference(path)
        else:
            module, canonical = importlib.import_module(target), target
    except DefinitionError:
        raise
    except ModuleNotFoundError as exc:
        raise MachineLoadError(ref, f"module not found ({exc.name})") from None
    except SyntaxError as exc:
        raise MachineLoadError(ref, f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except SystemExit as exc:
        raise MachineLoadError(ref, f"the module called sys.exit({exc.code!r}) on import") from None
    except Exception as exc:  # an import-time error in user code
        raise MachineLoadError(ref, f"import failed: {type(exc).__name__}: {exc}") from None
    machine = _find(module, ref, attr or None)
    return machine, canonical + (f":{attr}" if attr else "")
