"""Load a machine definition from a Python module given by path or dotted name.

The reference stored with an instance must load on every host that may run
it, so it never depends on where the starting process happened to be: a file
under the machines root (``$FSM_MACHINES_ROOT``, else the current directory)
is recorded relative to that root (``machines/moderation.py``), a file inside a
``sys.path`` package by its dotted name, a dotted name as given; only a file
outside all of those is recorded by its absolute path.  A relative path is
looked up in the current directory, then under the root.

A stored reference is data: whoever can write a row can name any file or module.
So a reference read from the store is imported only through :class:`Trust`: when
it was named explicitly (a command line's ``MODULE`` or ``--machines``, a program's
``Engine.load``), or when every file importing it would execute lies under the
machines root (symlinks followed, ``..`` resolved); anything else is refused with
``MachineRefused`` and never imported.  The viewer imports nothing at all.

A machine file named explicitly (``load_machine(ref, named=True)``) has its folder put on
``sys.path``, as ``python FILE`` would, so it can import its sibling modules whichever
way the process started (the ``fsm`` script, ``python -m fsm_engine``, a program).  A
reference read from the store never adds a folder.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from importlib.machinery import PathFinder
from types import ModuleType

from ..definition import Machine
from ..errors import DefinitionError, MachineLoadError, MachineRefused

#: The environment variable naming the directory machine paths are relative to.
ROOT_ENV = "FSM_MACHINES_ROOT"

#: Folders put on ``sys.path`` for machine files named explicitly (``_add_folder``); never
#: used to name a file by a dotted reference (``_dotted``): another process lacks them.
_FOLDERS: set[str] = set()


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
        rel = (_under(stem, os.path.abspath(entry or os.curdir))
               if entry and entry not in _FOLDERS else None)
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


def _add_folder(path: str) -> None:
    """Put the folder of the machine file ``path`` on ``sys.path`` (once, after the
    script's own folder), so the module imports its siblings."""
    folder = os.path.dirname(path)
    if folder not in _FOLDERS and folder not in sys.path:
        _FOLDERS.add(folder)
        sys.path.insert(1, folder)


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


def _split(ref: str) -> tuple[str, str]:
    """``ref`` as (module path or dotted name, attribute or "")."""
    if os.path.exists(resolve(ref)):
        return ref, ""
    target, _, attr = ref.partition(":")
    return target, attr


def _is_file(target: str) -> bool:
    return target.endswith(".py") or os.sep in target


def _dotted_files(name: str) -> list[str] | None:
    """The files importing ``name`` executes (each package's ``__init__`` and the module),
    found on ``sys.path`` without importing anything; None when it is not found there."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    files: list[str] = []
    search: list[str] | None = None
    for i in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[:i + 1]), search)
        if spec is None:
            return None
        if spec.origin and spec.has_location:  # a namespace package has no file
            files.append(spec.origin)
        found = spec.submodule_search_locations
        search = None if found is None else list(found)
        if search is None and i < len(parts) - 1:
            return None
    return files or None


def _files(ref: str) -> list[str] | None:
    """What importing ``ref`` would execute (None: nothing found to import)."""
    target, _ = _split(ref)
    if _is_file(target):
        return [resolve(target)]
    return _dotted_files(target)


def refusal(ref: str) -> str | None:
    """Why the stored reference ``ref`` may not be imported unless named explicitly, or
    None when every file it would execute lies under the machines root."""
    root = os.path.realpath(machines_root())
    try:
        files = [os.path.realpath(f) for f in _files(ref) or ()]
    except (OSError, ValueError, ImportError):  # an embedded NUL, an unreadable folder
        files = []
    if not files:
        return f"is not found under the machines root {root}"
    if any(_under(f, root) is None for f in files):
        return f"lies outside the machines root {root}"
    return None


class Trust:
    """Which stored machine references this process may import (see the module docstring).

    ``allow(ref)`` names one explicitly; ``check(ref, instance_id)`` passes a named one,
    or one under the machines root (``$FSM_MACHINES_ROOT``, else the current directory,
    read at each check), and raises ``MachineRefused`` for any other, importing nothing.
    """

    def __init__(self, named: Iterable[str] = ()) -> None:
        self._named: set[str] = set(named)

    def allow(self, ref: str) -> None:
        """Trust ``ref`` (a canonical reference, as ``load_machine`` returns it)."""
        self._named.add(ref)

    def check(self, ref: str, instance_id: str) -> None:
        """Return when ``ref`` may be imported for instance ``instance_id``, else raise
        ``MachineRefused`` naming both (one line)."""
        if ref in self._named:
            return
        why = refusal(ref)
        if why is not None:
            raise MachineRefused(ref, instance_id, why + " (name it on the command line, "
                                 "--machines MODULE, or set FSM_MACHINES_ROOT to its folder)")


def load_machine(ref: str, *, named: bool = False) -> tuple[Machine, str]:
    """Load ``ref`` — ``path/to/file.py``, ``package.module`` or either with ``:attr``.

    ``named``: the user named ``ref`` (a command line's ``MODULE`` or ``--machines``, a
    program's ``Engine.load``), not the store: a file's folder is put on ``sys.path``
    first, so it imports its sibling modules.  Returns the machine and a portable
    reference to store with instances
    (``reference``: a path relative to the machines root, or a dotted name).  Raises
    ``MachineLoadError`` (one line) when
    the module is missing, fails to import or defines no machine;
    ``DefinitionError`` propagates from checks done at import time.
    """
    target, attr = _split(ref)
    try:
        if _is_file(target):
            path = resolve(target)
            if os.path.isdir(path):
                raise MachineLoadError(ref, f"{target} is a directory, not a Python file")
            if not os.path.isfile(path):
                raise MachineLoadError(ref, f"no such file {target}")
            canonical = reference(path)  # (before its folder joins sys.path)
            if named:
                _add_folder(path)
            module = _import_path(path)
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
