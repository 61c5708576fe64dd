"""Load a machine definition from a Python module given by path or dotted name."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType

from ..definition import Machine
from ..errors import DefinitionError, MachineLoadError


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

    Returns the machine and a canonical reference to store with instances
    (absolute path for files).  Raises ``MachineLoadError`` (one line) when
    the module is missing, fails to import or defines no machine;
    ``DefinitionError`` propagates from checks done at import time.
    """
    target, _, attr = ref.partition(":") if not os.path.exists(ref) else (ref, "", "")
    is_file = target.endswith(".py") or os.sep in target
    try:
        if is_file:
            path = os.path.abspath(target)
            if os.path.isdir(path):
                raise MachineLoadError(ref, f"{target} is a directory, not a Python file")
            if not os.path.isfile(path):
                raise MachineLoadError(ref, f"no such file {target}")
            module, canonical = _import_path(path), path
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
