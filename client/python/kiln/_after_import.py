"""Kiln's changes to a module of Triton or torch, made right after the module
executes, however and whenever it is imported (or at once, if it already was).
A meta-path finder, so that an interpreter under KILN=1 imports none of them
before the program does, nor the installer's own module."""

import sys

_installers = {}  # module name -> ["kiln module:function" of each installer(module)]


def _run(name, installer, module):
    try:
        installer_module, function = installer.split(":")
        __import__(installer_module)
        getattr(sys.modules[installer_module], function)(module)
    except Exception as error:  # never break the program's import
        import logging  # not at interpreter start: only to say what went wrong

        logging.getLogger("kiln").debug("%s not changed for kilnd by %s: %s", name, installer, error)


class _PatchAfterImport:
    def find_spec(self, fullname, path, target=None):
        if fullname not in _installers:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                execute = spec.loader.exec_module

                def exec_module(module, execute=execute):
                    execute(module)
                    for installer in _installers[fullname]:
                        _run(fullname, installer, module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def patch(table):
    """Runs each installer of ((module name, "kiln module:function"), ...) on
    its module once it is imported; registering one again does nothing."""
    for name, installer in table:
        installers = _installers.setdefault(name, [])
        if installer in installers:
            continue
        installers.append(installer)
        if name in sys.modules:
            _run(name, installer, sys.modules[name])
    if not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
