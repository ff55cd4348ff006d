"""Runs Triton's frontend the way triton.compile does, producing what a Kiln
client sends to kilnd: frontend TTIR, the parsed options, the env and the key.
Used by tests and benchmarks until the Python client package provides it."""

import dataclasses
import hashlib
import json

from triton._C.libtriton import get_cache_invalidating_env_vars, ir
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource, make_backend
from triton.runtime.cache import get_cache_key, triton_key


@dataclasses.dataclass
class FrontendResult:
    ttir: str
    options: dict
    env: dict
    hash: str
    name: str
    target: GPUTarget


def _prepare(case, target):
    """What triton.compile sets up before its cache lookup, and the hashed key."""
    src = ASTSource(case.fn, case.signature, case.constexprs)
    backend = make_backend(target)
    options = backend.parse_options(dict(case.options))
    env = get_cache_invalidating_env_vars()
    key = get_cache_key(src, backend, options, env_vars=env)
    return src, backend, options, env, hashlib.sha256(key.encode()).hexdigest()


def cache_key(case, target):
    """Triton's cache key for a case: known before the frontend runs."""
    return _prepare(case, target)[-1]


def run_frontend(case, target):
    src, backend, options, env, key = _prepare(case, target)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                         context)
    return FrontendResult(str(module), dict(options.__dict__), dict(env), key, src.name, target)


def key_inputs(case, target):
    """kiln.v1.KeyInputs (JSON) of a case, as the kiln client records them."""
    src, backend, options, env, _ = _prepare(case, target)
    return json.dumps({"key": get_cache_key(src, backend, options, env_vars=env), "triton_key": triton_key(),
                       "target": {"backend": target.backend, "arch": str(target.arch), "warp_size": target.warp_size},
                       "options_json": json.dumps(options.__dict__), "env": env})


def toolchain_key():
    return triton_key()
