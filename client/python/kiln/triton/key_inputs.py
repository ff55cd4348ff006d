"""What a Triton cache key was derived from, for kilnd's miss reasons (`kiln
misses`): the kernel's name and target, and a short digest of each input of
the key (Triton, source, backend, options, environment).

triton.compile computes the key from its inputs and then asks the cache; the
cache manager sees only the key's hash. On a miss (never on a hit), these are
read from compile()'s own frame, checked against the key the manager serves.
A Triton whose compile() keeps them under other names sends none, and its
misses read "unknown"."""

import hashlib
import json
import sys


def _short(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def compile_frame():
    """The frame of the triton.compile() call this thread is in, or None."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "compile" and frame.f_globals.get("__name__") == "triton.compiler.compiler":
            return frame
        frame = frame.f_back
    return None


def of_current_compile(key_hex, api):
    """kiln.v1.KeyComponents of the compile asking for `key_hex`, or None."""
    frame = compile_frame()
    if frame is None:
        return None
    inputs = frame.f_locals
    try:
        key, src, backend, options = inputs["key"], inputs["src"], inputs["backend"], inputs["options"]
        if hashlib.sha256(key.encode()).hexdigest() != key_hex:
            return None
        target = backend.target
        return api.KeyComponents(
            kernel=f"{src.name}@{target.backend}:{target.arch}", toolchain=key.split("-", 1)[0][:16],
            source=src.hash()[:16], backend=str(backend.hash())[:64], options=options.hash()[:16],
            env=_short(str(sorted(inputs.get("env_vars", {}).items()))))
    except Exception:  # noqa: BLE001  (a Triton of other shapes: no reasons, never a failed compile)
        return None


def recorded_for_prewarm(key_hex, frontend_read_device):
    """kiln.v1.KeyInputs (JSON bytes) of the compile asking for `key_hex`, or
    None: stored with a kernel, for `kiln prewarm` and a bundle's untrusted
    import, which compile it again from its TTIR. Read from compile()'s frame
    whole, so that a kernel compiled before Kiln's stages hook was installed
    (a process's first, compiled_here) has them too."""
    frame = compile_frame()
    if frame is None:
        return None
    inputs = frame.f_locals
    try:
        key, backend, options = inputs["key"], inputs["backend"], inputs["options"]
        if not isinstance(key, str) or hashlib.sha256(key.encode()).hexdigest() != key_hex:
            return None
        env = inputs.get("env_vars")
        if env is None:
            from triton._C.libtriton import get_cache_invalidating_env_vars

            env = get_cache_invalidating_env_vars()
        from kiln.triton.versions import triton_key

        target = backend.target
        return json.dumps({"key": key, "triton_key": triton_key(),
                           "target": {"backend": target.backend, "arch": str(target.arch),
                                      "warp_size": target.warp_size},
                           "options_json": json.dumps(options.__dict__), "env": env,
                           "frontend_read_device": frontend_read_device}).encode()
    except Exception:  # noqa: BLE001  (a Triton of other shapes: stored without them, never a failed compile)
        return None
