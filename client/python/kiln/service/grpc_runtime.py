"""gRPC's package, as the client imports it: `from kiln.service.grpc_runtime import grpc`.

grpc's `__init__` imports its asyncio API, grpc.aio, which the client never
uses: 14 more modules, about 100 ms of a cold process's first miss under Wine
(where each module costs a few ms of file system calls). When the client is
the first to import grpc, grpc.aio is put in place first as a module whose
code runs on the first use of a name it lacks (PEP 562's module __getattr__),
so a program that uses grpc.aio itself gets the whole of it. importlib's
LazyLoader cannot serve: the import system reads a module's __spec__, and
that loads a LazyLoader module at once.
"""

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types


class _DeferredPackage(types.ModuleType):
    """A package whose __init__ runs when a name it lacks is first asked for;
    a name of one of its modules imports that module alone, as a program
    importing grpc.aio._channel first does (its `from . import _base_call`
    asks the package for the name; running __init__ there would import
    _channel's names from _channel while it is still importing)."""

    _lock = threading.RLock()

    def __getattr__(self, name):
        if not name.startswith("__") and importlib.machinery.PathFinder.find_spec(
                f"{self.__name__}.{name}", self.__path__) is not None:
            return importlib.import_module(f"{self.__name__}.{name}")
        with self._lock:
            if type(self) is _DeferredPackage:
                self.__class__ = types.ModuleType  # from here on, an ordinary module
                self.__spec__.loader.exec_module(self)
        return types.ModuleType.__getattribute__(self, name)


def _defer_grpc_aio():
    grpc_spec = importlib.util.find_spec("grpc")
    if grpc_spec is None or not grpc_spec.submodule_search_locations:
        return  # no grpc: the import below says so
    aio_spec = importlib.machinery.PathFinder.find_spec("grpc.aio", grpc_spec.submodule_search_locations)
    if aio_spec is None or not hasattr(aio_spec.loader, "exec_module"):
        return
    aio = importlib.util.module_from_spec(aio_spec)
    aio.__class__ = _DeferredPackage
    sys.modules["grpc.aio"] = aio


if "grpc" not in sys.modules and "grpc.aio" not in sys.modules:
    try:
        _defer_grpc_aio()
    except Exception:  # noqa: BLE001  (an optimisation: grpc then imports grpc.aio as it always does)
        sys.modules.pop("grpc.aio", None)

import grpc  # noqa: E402
