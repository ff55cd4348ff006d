"""Where the Tritons Kiln supports differ: one function per concern, each
deciding by what the installed Triton has, so no other module of the client
compares versions. (kilnd's worker, which runs in a toolchain's Python without
this package, keeps its own short list: compiler/worker/kiln_worker.py.)

Supported: Triton 3.4 to 3.9, the versions torch 2.8 to 2.15 pin and CI tests
(requirements-triton-matrix.txt, tests/python/test_triton_versions.py).
- An older Triton runs stock, with one warning.
- A newer one is used only while every part of Triton that Kiln relies on is
  where Kiln expects it (missing_parts()); if one moved, the process runs
  stock with one warning naming it. What Kiln adds to a compile is Triton's own
  stages, keyed as stock keys them, so a Triton that keeps these parts in place
  keeps Kiln's artifacts equal to its own; the matrix test proves it for each
  supported version, and names the part when a new Triton moves one.

Every function here imports only what it asks about, so the installers of
_patches may call them while Triton is being imported.
"""

import importlib
import sys

OLDEST = (3, 4)
NEWEST_TESTED = (3, 9)


def version_of(text):
    """(major, minor) of a Triton version string ("3.7.1", "3.8.0+git1234")."""
    major, minor = text.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def installed_version():
    import triton

    return version_of(triton.__version__)


def is_untested():
    return installed_version() > NEWEST_TESTED


# --- the key of a Triton install --------------------------------------------------

# The module that defines triton_key(), newest first: Triton 3.5 moved it from
# triton.compiler.compiler to triton.runtime.cache.
TRITON_KEY_HOMES = ("triton.runtime.cache", "triton.compiler.compiler")


def defines_triton_key(module):
    """Whether `module` is triton_key's home (3.5+ compiler.py has none; where
    it imports one, the home is the module it came from)."""
    key = module.__dict__.get("triton_key")
    return callable(key) and getattr(key, "__module__", None) in (module.__name__, "kiln.triton.memos")


def triton_key():
    for name in TRITON_KEY_HOMES:
        module = importlib.import_module(name)
        if defines_triton_key(module):
            return module.triton_key()
    raise ImportError("this Triton defines no triton_key() in " + " or ".join(TRITON_KEY_HOMES))


# --- how Kiln's stages enter a compile --------------------------------------------

def uses_stages_knob(knobs):
    """Whether Kiln's stages enter a compile through
    knobs.runtime.add_stages_inspection_hook, which the backends call with
    their stages (triton/stages_hook): on Triton 3.6. From 3.7 the JIT asks a
    hook that is set for a key and appends it to the kernel's specialization as
    text, which becomes a stray attribute of the kernel's source, so every
    kernel the JIT compiles is keyed apart from stock's even when the key is
    empty. There, as before 3.6, which has no such knob, Kiln wraps
    CUDABackend.add_stages (triton/remote). Asked as triton.knobs is imported:
    triton/__init__ has set __version__ by then."""
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "add_stages_inspection_hook"):
        return False
    triton = sys.modules.get("triton")
    return triton is not None and version_of(getattr(triton, "__version__", "0.0")) < (3, 7)


# --- what the frontend reads of the machine's GPU -------------------------------

def frontend_device_readers():
    """(owner, attribute) of each function through which Triton's frontend asks
    the GPU of the machine it runs on, for _frontend to watch: target_info's
    current_target (3.5+; 3.4 has none), and TritonSemantic._has_native_tma
    where a version defines it."""
    readers = []
    try:
        from triton.language import target_info
    except ImportError:  # Triton 3.4
        return readers
    readers.append((target_info, "current_target"))
    try:
        from triton.language.semantic import TritonSemantic
    except ImportError:
        return readers
    if "_has_native_tma" in TritonSemantic.__dict__:
        readers.append((TritonSemantic, "_has_native_tma"))
    return readers


# --- what a launcher module is --------------------------------------------------

def has_launcher_per_kernel(driver_module):
    """Up to 3.6 the CUDA driver generates a C launcher per kernel signature
    (make_launcher); from 3.7 one module (cuda_utils) launches every kernel."""
    return callable(getattr(driver_module, "make_launcher", None))


def build_takes_ccflags(build_module):
    """triton.runtime.build._build takes the C compiler's extra flags from 3.5."""
    import inspect

    return "ccflags" in inspect.signature(build_module._build).parameters


# --- ptxas ---------------------------------------------------------------------

def ptxas_is_per_arch(nvidia_compiler):
    """Triton 3.6+ picks a ptxas per arch (get_ptxas(arch),
    get_ptxas_version(arch=80)); before, one ptxas, and neither function of
    the nvidia backend's compiler module takes an argument."""
    import inspect

    return bool(inspect.signature(nvidia_compiler.get_ptxas).parameters)


# --- every part Kiln relies on ----------------------------------------------------

# (module, attribute path): where Kiln expects each part of Triton it uses.
PARTS = (
    ("triton.knobs", "build.impl"),
    ("triton.knobs", "cache.manager_class"),
    ("triton.runtime.cache", "CacheManager"),
    ("triton.runtime.cache", "FileCacheManager"),
    ("triton.runtime.cache", "get_cache_manager"),
    ("triton.runtime.build", "_build"),
    ("triton.runtime.build", "platform_key"),
    ("triton.compiler.compiler", "ASTSource.make_ir"),
    ("triton.compiler.compiler", "AsmDict"),
    ("triton.compiler.compiler", "compile"),
    ("triton.backends.compiler", "GPUTarget"),
    ("triton.backends.nvidia.compiler", "CUDABackend.add_stages"),
    ("triton.backends.nvidia.compiler", "get_ptxas_version"),
    ("triton._C.libtriton", "get_cache_invalidating_env_vars"),
)


def missing_parts():
    """The parts of Triton Kiln relies on that this Triton does not have where
    Kiln expects them, as "module.attribute" (empty when all are there)."""
    missing = []
    for module_name, path in PARTS:
        try:
            value = importlib.import_module(module_name)
            for attribute in path.split("."):
                value = getattr(value, attribute)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{path}")
    try:
        triton_key()
    except ImportError:
        missing.append("triton_key")
    return missing


_reason_found = []  # [unsupported_reason()] once worked out in this process


def cached_unsupported_reason():
    """unsupported_reason(), worked out once per process: the Triton does not change."""
    if not _reason_found:
        _reason_found.append(unsupported_reason())
    return _reason_found[0]


def supported():
    return cached_unsupported_reason() is None


def unsupported_reason():
    """Why Kiln cannot serve this Triton (None when it can), for the one warning."""
    import triton

    found = installed_version()
    supported = "Kiln supports Triton %d.%d to %d.%d" % (OLDEST + NEWEST_TESTED)
    if found < OLDEST:
        return f"triton {triton.__version__} is not supported ({supported}; upgrade triton)"
    if found > NEWEST_TESTED:
        missing = missing_parts()
        if missing:
            return (f"triton {triton.__version__} is newer than Kiln knows, and has moved what Kiln relies on "
                    f"({', '.join(missing)}); {supported}: upgrade kiln-triton")
    return None
