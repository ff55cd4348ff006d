"""What generated a launcher's C source. kilnd builds a remote client's
launcher only from what generated it (it compiles no C a remote client wrote):
Triton's nvidia driver's make_launcher arguments, or its cuda_utils source.

Triton generates a launcher's source and builds it in one call
(CudaLauncher.__init__: make_launcher, then compile_module_from_src), on one
thread: follow() wraps make_launcher to keep, per thread, the last source and
its arguments, which the build that follows sends. It is set up as the
driver module is imported (_patches), before any launcher is made.
"""

import ast
import os
import threading

from kiln.triton import versions as _triton_versions

_generated = threading.local()


def follow(driver):
    """Wraps the nvidia driver's make_launcher, once; costs a kernel load two attribute stores."""
    if not _triton_versions.has_launcher_per_kernel(driver):
        return
    make_launcher = driver.make_launcher
    if getattr(make_launcher, "_kiln_follows", False):
        return

    def following(*args):
        source = make_launcher(*args)
        _generated.source, _generated.args = source, args
        return source

    following._kiln_follows = True
    driver.make_launcher = following


def arguments_of(source):
    """make_launcher's arguments for `source` as a Python literal, when this
    thread's last make_launcher made it from plain values; None otherwise."""
    if getattr(_generated, "source", None) != source:
        return None
    return literal_of(_generated.args)


def literal_of(arguments):
    """make_launcher's `arguments` as a Python literal, or None where they are not plain values."""
    literal = repr(arguments)
    try:
        return literal if ast.literal_eval(literal) == arguments else None
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return None


def is_cuda_utils(name, source):
    if name != "cuda_utils":
        return False
    from triton.backends.nvidia import driver

    try:
        with open(os.path.join(driver.dirname, "driver.c"), encoding="utf-8") as shipped:
            return shipped.read() == source
    except OSError:
        return False
