"""Kiln's compile worker, run by a registered toolchain's Python interpreter.

kilnd starts it with `python -I kiln_worker.py` and sends one job at a time
(Triton's stages set LLVM globals and a fatal LLVM error aborts the process, so
jobs never share a process concurrently). Requests and replies are messages:

    message := frame(header) frame(part)*      frame := u32le length, bytes
    header  := UTF-8 JSON object; header["parts"] names the frames after it

Jobs:
  hello    -> the toolchain's identity: triton_key, versions, backends.
  launcher_source -> header {make_launcher_args} or {cuda_utils}: the C source
              this Triton generates for that launcher (part "source"), and
              how this Python builds it (header "launcher").
  compile  -> header {target, options_json, env, hash, stage, metadata_json},
              parts {"ir"}: IR of `stage` (frontend TTIR, TTGIR, LLIR or PTX);
              runs the backend's stages from there to make_cubin exactly as
              triton.compile does for that target, options and env (going on
              from the client's metadata when it ran the earlier stages), and
              replies with parts {"<name>.<ext>" for each stage run,
              "<name>.json"}.
  retarget -> header {key_inputs_json, target}, parts {"ir"}: a kernel's
              recorded frontend TTIR and key inputs (kiln.v1.KeyInputs);
              replies with what a compile of it for `target` takes (the
              client's cache key, options, new key inputs, part "ir"), or
              header "skipped" saying why the recording does not serve it.
  inductor_kernel -> header {kernel_name, inductor_cache_dir, env, tool_env},
              parts {"source"}: a torch.compile kernel's generated module;
              compiles each of its configs as inductor's compile pool does and
              replies with parts {"<hex key>/<file>"}: each config's kernel,
              as stock Triton caches it.
Failures reply {"ok": false, "kind": ..., "message": ...}; kind is one of
compilation_error, ptxas_error, out_of_resources, invalid_request.
"""

import base64
import contextlib
import ctypes
import errno
import faulthandler
import gc
import hashlib
import io
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

# Stages print (ptxas reproducers, warnings): keep fd 1 for the protocol only
# and send everything else to stderr, which kilnd keeps for crash reports.
_PROTOCOL_OUT = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
sys.stdout = sys.stderr
_PROTOCOL_IN = sys.stdin.buffer
# A crash in LLVM or ptxas handling leaves its Python stack in the stderr tail
# kilnd reports with the failure.
faulthandler.enable()


def _without_kiln():
    """A kilnd started from an environment with KILN or KILN_ENDPOINT set (the
    Python client starts one from its own) hands them on to its workers, and
    the client's .pth then activated Kiln in this interpreter: a job that runs
    Triton whole (inductor_kernel) would send its compiles back to kilnd.
    Workers are stock Triton, so that is undone before triton or torch loads."""
    kiln = sys.modules.get("kiln")
    if kiln is not None:
        kiln.disable()
        sys.meta_path[:] = [finder for finder in sys.meta_path
                            if not type(finder).__module__.startswith("kiln.")]
        for name in getattr(kiln, "_INDUCTOR_REMOTE_CACHES", ()):  # the switches Kiln turned on
            os.environ.pop(name, None)
    for name in [name for name in os.environ if name.startswith("KILN")]:
        del os.environ[name]


_without_kiln()

import triton  # noqa: E402  (after the fd shuffle, so import-time prints are safe)
from triton._C.libtriton import get_cache_invalidating_env_vars, ir, llvm  # noqa: E402
from triton.backends.compiler import GPUTarget, Language  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402

# Triton caps kernel file names at 150 characters (compiler.compile).
_MAX_FILE_NAME = 150


def _read_exact(stream, count):
    data = stream.read(count)
    if data is None or len(data) != count:
        raise EOFError
    return data


def read_message(stream=None):
    stream = stream or _PROTOCOL_IN
    (length,) = struct.unpack("<I", _read_exact(stream, 4))
    header = json.loads(_read_exact(stream, length))
    parts = {}
    for name in header.get("parts", []):
        (size,) = struct.unpack("<I", _read_exact(stream, 4))
        parts[name] = _read_exact(stream, size)
    return header, parts


def write_message(header, parts=None, stream=None):
    stream = stream or _PROTOCOL_OUT
    parts = parts or {}
    header = dict(header, parts=list(parts))
    encoded = json.dumps(header).encode()
    chunks = [struct.pack("<I", len(encoded)), encoded]
    for data in parts.values():
        chunks += [struct.pack("<I", len(data)), data]
    stream.write(b"".join(chunks))
    stream.flush()


def _as_tuples(value):
    """JSON turns the options' tuples into lists; Triton hashes and compares tuples."""
    if isinstance(value, list):
        return tuple(_as_tuples(item) for item in value)
    return value


def _parse_target(spec):
    arch = spec["arch"]
    return GPUTarget(spec["backend"], int(arch) if str(arch).isdigit() else arch, int(spec["warp_size"]))


# The variables that choose the ptxas Triton runs: its version is in the
# client's key, so a job runs the client's (kilnd checked it), or Triton's own
# where the client set none, never one kilnd happened to start with.
_TOOL_VARIABLES = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH")
# The environment kilnd started us with, less the cache-invalidating variables
# and the tool variables: each job runs with exactly the client's set of those.
_BASE_ENV = {k: v for k, v in os.environ.items()
             if k not in get_cache_invalidating_env_vars() and k not in _TOOL_VARIABLES}


_applied_env = {}  # the client variables os.environ holds now, on top of _BASE_ENV


def _forget_ptxas():
    """Triton remembers what it learnt of ptxas per arch (or options), not per
    ptxas: another ptxas must be asked again."""
    from triton.backends.nvidia import compiler as nvidia

    for name in ("get_ptxas_version", "get_features"):
        remembered = getattr(nvidia, name, None)
        if hasattr(remembered, "cache_clear"):
            remembered.cache_clear()


_invalidating_names = set()  # names get_cache_invalidating_env_vars() was seen to return


def refused_variable(env, tool_env=None):
    """Why a job's variables are not set here, or None. A job sets only what
    its key holds (this Triton's cache-invalidating variables) and the ptxas
    kilnd checked (tool_env): a remote caller or a stranger's bundle naming
    LD_PRELOAD, or TRITON_PTXAS_PATH among env, would have this worker run
    a program of its choosing."""
    for name, value in (tool_env or {}).items():
        if name not in _TOOL_VARIABLES or not isinstance(value, str):
            return "tool_env names %r; a job takes only %s there" % (name, " and ".join(_TOOL_VARIABLES))
    for name, value in env.items():
        if not (isinstance(name, str) and isinstance(value, str)) or "=" in name or "\0" in name + value:
            return "env holds %r, which is not a variable of the environment" % (name,)
        if name in _invalidating_names:
            continue
        # Triton keeps the list in libtriton and returns the ones set: ask it.
        saved = os.environ.get(name)
        os.environ[name] = "1"
        try:
            invalidating = name in get_cache_invalidating_env_vars()
        finally:
            if saved is None:
                os.environ.pop(name)
            else:
                os.environ[name] = saved
        if not invalidating:
            return ("env names %s, which is not one of this Triton's cache-invalidating variables "
                    "(get_cache_invalidating_env_vars): a client sends only those" % name)
        _invalidating_names.add(name)
    return None


@contextlib.contextmanager
def client_environment(env):
    """Sets exactly the client's cache-invalidating variables. Left in place
    after the job: the next job of the same set (nearly all of them) then
    changes nothing, where rebuilding os.environ cost 0.4 ms a compile."""
    global _applied_env
    if env != _applied_env:
        if any(env.get(name) != _applied_env.get(name) for name in _TOOL_VARIABLES):
            _forget_ptxas()
        os.environ.clear()
        os.environ.update(_BASE_ENV)
        _applied_env = {}
        os.environ.update(env)
        _applied_env = dict(env)
    yield


# --- where the Tritons this worker runs differ (3.4 to 3.9) ----------------------

_triton_key = None


def triton_key():
    """The key of this Triton install, part of every kernel's key: in
    triton.runtime.cache from 3.5, in triton.compiler.compiler before.
    Stock's hashes libtriton (400 MB on Linux, 0.3 s), and kilnd's first
    start asks for it in its toolchain's probe, on a core that the user's
    program is compiling on: libtriton's digest is read from the wheel's
    RECORD instead, where Kiln's client can vouch for the record
    (_key_from_record)."""
    global _triton_key
    if _triton_key is None:
        try:
            from triton.runtime.cache import triton_key as key_of_install
        except ImportError:  # Triton 3.4
            from triton.compiler.compiler import triton_key as key_of_install
        _triton_key = _key_from_record(key_of_install) or key_of_install()
    return _triton_key


def _key_from_record(key_of_install):
    """key_of_install() with libtriton's SHA-256 taken from the wheel's RECORD,
    by the client's kiln/triton/recorded_key.py (stock's own function, run
    with stand-ins for the library's bytes); None where the record cannot be
    trusted or no client is installed. Every toolchain that a client
    registers has one: it is the client's own Python. The file is loaded on
    its own, not as part of the kiln package, which _without_kiln undid."""
    import importlib.util

    try:
        kiln = importlib.util.find_spec("kiln")
        folders = list(kiln.submodule_search_locations or ()) if kiln is not None else []
        path = next((os.path.join(folder, "triton", "recorded_key.py") for folder in folders
                     if os.path.isfile(os.path.join(folder, "triton", "recorded_key.py"))), None)
        if path is None:
            return None
        spec = importlib.util.spec_from_file_location("_kiln_recorded_key", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.key_without_hashing_libtriton(key_of_install)
    except Exception:  # noqa: BLE001  (another client's file, or none: stock's key, hashed)
        return None


def can_print_ptxas_log(knobs):
    """knobs.nvidia.dump_ptxas_log (3.5+) makes make_cubin print ptxas's -v
    report; Triton 3.4 deletes it unread, so its compiles report none."""
    return hasattr(knobs.nvidia, "dump_ptxas_log")


# --- jobs ------------------------------------------------------------------------

def hello(_header, _parts):
    from triton.backends import backends

    return {
        "ok": True,
        "triton_key": triton_key(),
        "triton_version": triton.__version__,
        "python_executable": sys.executable,
        "python_version": "%d.%d" % sys.version_info[:2],
        "backends": sorted(backends),
        "triton_dir": os.path.dirname(os.path.abspath(triton.__file__)),
    }, {}


def _error(kind, message, log=""):
    return {"ok": False, "kind": kind, "message": message, "log": log}, {}


def _classify(error):
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources, PTXASError

    if isinstance(error, PTXASError):
        return "ptxas_error"
    if isinstance(error, OutOfResources):
        return "out_of_resources"
    if isinstance(error, CompilationError):
        return "compilation_error"
    # MLIR pass failures surface as RuntimeError("PassManager::run failed").
    return "compilation_error"


def _parse_module(ir_text, context):
    # parse_mlir_module reads a file; the temp file lives only for the parse.
    with tempfile.NamedTemporaryFile("w", suffix=".ttir", delete=False) as source:
        source.write(ir_text)
    try:
        module = ir.parse_mlir_module(source.name, context)
    finally:
        os.unlink(source.name)
    module.context = context
    return module


# Where the pipeline starts for each kind of input. Frontend TTIR runs make_ttir
# (triton.compile from an AST does); later IR starts at the stage after it, as
# Triton's IRSource does.
_FIRST_STAGE_AFTER = {"ttir": "ttir", "ttgir": "llir", "llir": "ptx", "ptx": "cubin"}
_ENTRY_NAME = {"llir": r"define [^@]*@([\w$.]+)\(", "ptx": r"\.entry\s+([\w$]+)"}


def _load_input(stage, ir_text, context):
    """The module the first stage takes, and the kernel's name."""
    if stage in ("ttir", "ttgir"):
        try:
            module = _parse_module(ir_text, context)
        except Exception as error:  # the parser reports through a generic exception
            raise ValueError("the %s does not parse: %s" % (stage.upper(), error)) from error
        return module, module.get_entry_func_name()
    match = re.search(_ENTRY_NAME[stage], ir_text)
    if match is None:
        raise ValueError("no kernel entry point found in the %s" % stage.upper())
    return ir_text, match.group(1)


_llvm_settings_applied = False


def _settings_of_make_llir():
    """make_llir leaves process-wide LLVM settings that make_ptx's code depends
    on (stock Triton runs it first in every compile): LLVM's targets, and
    32-bit pointers to shared memory (nvptx-short-ptr). A compile from LLIR or
    PTX skips make_llir, so it applies them itself, once: they are the same for
    every compile, and make_llir itself sets them again."""
    global _llvm_settings_applied
    if _llvm_settings_applied:
        return
    from triton._C.libtriton import nvidia

    llvm.init_targets()
    if hasattr(nvidia, "set_short_ptr"):
        nvidia.set_short_ptr()
    _llvm_settings_applied = True


_text_input_context = None
_text_input_backends = set()  # backend classes whose dialects it has


def _context_for(stage, backend):
    """The MLIR context a compile runs in. TTIR and TTGIR are parsed into a
    fresh one each time, as triton.compile makes. LLIR and PTX input parse
    nothing into it, yet loading the dialects sets up process-wide state that
    make_ptx depends on (without it the PTX differed from stock's), so one
    context, made once, serves them all: making one costs 1.5 ms a compile."""
    global _text_input_context
    if stage in ("ttir", "ttgir"):
        return _new_context(backend)
    if _text_input_context is None:
        _text_input_context = _new_context(backend)
        _text_input_backends.add(type(backend))
    elif type(backend) not in _text_input_backends:
        backend.load_dialects(_text_input_context)
        _text_input_backends.add(type(backend))
    return _text_input_context


def _new_context(backend):
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    return context


def _run_stages(header, ir_text, warnings):
    target = _parse_target(header["target"])
    backend = make_backend(target)
    stage = header.get("stage", "ttir")
    raw_options = {k: _as_tuples(v) for k, v in json.loads(header["options_json"]).items()}
    context = _context_for(stage, backend)
    module, name = _load_input(stage, ir_text, context)
    if _FIRST_STAGE_AFTER[stage] in ("ptx", "cubin"):
        _settings_of_make_llir()
    if header.get("metadata_json"):
        # The client ran the stages before `stage` itself: go on from its metadata.
        options = backend.parse_options(raw_options)
        metadata = json.loads(header["metadata_json"])
        metadata["target"] = target  # triton.compile keeps the GPUTarget object here
    else:
        if stage == "ttgir":
            # A TTGIR module fixes its warps and CTAs; Triton's IRSource reads them too.
            raw_options["num_warps"] = module.get_int_attr("ttg.num-warps")
            if (num_ctas := module.get_int_attr("ttg.num-ctas")) is not None:
                raw_options["num_ctas"] = num_ctas
        options = backend.parse_options(raw_options)
        # The metadata dict triton.compile starts from, in the same key order.
        metadata = {"hash": header["hash"], "target": target, **options.__dict__, **header.get("env", {})}
        metadata["triton_version"] = triton.__version__
    if stage == "ptx":
        metadata["name"] = name  # make_ptx would have set it
    name = name[:_MAX_FILE_NAME]
    stages = {}
    backend.add_stages(stages, options, Language.TRITON)
    names = list(stages)
    outputs, timings, ptxas_log = {}, {}, ""
    for ext in names[names.index(_FIRST_STAGE_AFTER[stage]):]:
        compile_ir = stages[ext]
        start = time.perf_counter()
        if ext == "cubin":
            module, ptxas_log = _run_ptxas_stage(compile_ir, module, metadata, warnings)
        else:
            module = compile_ir(module, metadata)
        timings[ext] = time.perf_counter() - start
        outputs["%s.%s" % (name, ext)] = module if isinstance(module, bytes) else str(module).encode()
    outputs["%s.json" % name] = json.dumps(metadata, default=vars).encode()
    return outputs, timings, ptxas_log


def _ptxas_never_started(error):
    """Whether starting ptxas failed before it ran, for a reason that passes:
    Wine's CreateProcess now and then fails with ERROR_INTERNAL_ERROR (1359)
    on a busy machine, as fork does with EAGAIN on a POSIX one. Any other
    failure (no such file, no permission) would fail again."""
    return getattr(error, "winerror", None) == 1359 or error.errno == errno.EAGAIN


def _run_ptxas_stage(compile_ir, module, metadata, warnings):
    """make_cubin deletes ptxas's -v report unless asked to print it: capture the
    print. A ptxas that never started is started once more, and `warnings` says so."""
    from triton import knobs

    def make_cubin():
        try:
            return compile_ir(module, metadata)
        except OSError as error:
            if not _ptxas_never_started(error):
                raise
            warnings.append("ptxas did not start (%s); started it again" % error)
            return compile_ir(module, metadata)

    if not can_print_ptxas_log(knobs):
        return make_cubin(), ""
    captured = io.StringIO()
    previous = knobs.nvidia.dump_ptxas_log
    knobs.nvidia.dump_ptxas_log = True
    try:
        with contextlib.redirect_stdout(captured):
            cubin = make_cubin()
    finally:
        knobs.nvidia.dump_ptxas_log = previous
    return cubin, captured.getvalue()


def compile_job(header, parts):
    for field in ("target", "options_json", "hash"):
        if field not in header:
            return _error("invalid_request", "compile request lacks '%s'" % field)
    if header.get("stage", "ttir") not in _FIRST_STAGE_AFTER:
        return _error("invalid_request", "unknown input stage %r" % header.get("stage"))
    try:
        target = _parse_target(header["target"])
        make_backend(target)
    except (KeyError, ValueError, RuntimeError) as error:
        return _error("invalid_request", "unknown target %r: %s" % (header["target"], error))
    try:
        ir_text = parts["ir"].decode()
    except (KeyError, UnicodeDecodeError):
        return _error("invalid_request", "compile request needs the TTIR as UTF-8 text")
    refused = refused_variable(header.get("env", {}), header.get("tool_env", {}))
    if refused:
        return _error("invalid_request", refused)
    warnings = []
    try:
        with client_environment({**header.get("env", {}), **header.get("tool_env", {})}):
            outputs, timings, ptxas_log = _run_stages(header, ir_text, warnings)
    except ValueError as error:
        return _error("compilation_error", str(error))
    except Exception as error:  # any stage failure goes back to the client, typed
        return _error(_classify(error), str(error) or type(error).__name__, traceback.format_exc())
    return {"ok": True, "timings": timings, "ptxas_log": ptxas_log, "warnings": warnings}, outputs


# A remote client's make_launcher arguments are a few hundred characters; a
# literal this long is not one.
_MAX_LAUNCHER_ARGS = 1 << 16


def _launcher_build():
    """How this Python and Triton build a launcher module, as Triton's driver does."""
    import sysconfig

    from triton.backends.nvidia import driver

    try:
        library_dirs = driver.library_dirs()
    except (AssertionError, OSError, subprocess.SubprocessError):
        # No GPU driver on this machine (a build farm): kilnd links the CUDA
        # toolkit's stub of libcuda instead.
        library_dirs = [driver.libdevice_dir]
    return {
        "python_version": "%d.%d" % sys.version_info[:2],
        "abiflags": getattr(sys, "abiflags", ""),
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "platform": sysconfig.get_platform(),
        "python_include_dir": sysconfig.get_paths()["include"],
        "include_dirs": list(driver.include_dirs),
        "library_dirs": [d for d in library_dirs if os.path.isdir(d)],
        "libraries": list(driver.libraries),
    }


def launcher_source(header, _parts):
    """The C source this toolchain's Triton generates for a launcher: from
    make_launcher's arguments (a Python literal, never evaluated as code), or
    the cuda_utils module's."""
    import ast

    from triton.backends.nvidia import driver

    if header.get("cuda_utils"):
        with open(os.path.join(driver.dirname, "driver.c"), encoding="utf-8") as source:
            text = source.read()
    else:
        literal = header.get("make_launcher_args", "")
        if not literal or len(literal) > _MAX_LAUNCHER_ARGS:
            return _error("invalid_request", "make_launcher's arguments are missing or too long")
        try:
            arguments = ast.literal_eval(literal)
            if not isinstance(arguments, tuple):
                raise TypeError("not a tuple of arguments")
            text = driver.make_launcher(*arguments)
        except (ValueError, TypeError, SyntaxError, KeyError, IndexError, AttributeError, AssertionError,
                RecursionError, MemoryError) as error:
            return _error("invalid_request", "this Triton makes no launcher of those arguments (%s: %s)"
                          % (type(error).__name__, error))
    return {"ok": True, "launcher": _launcher_build()}, {"source": text.encode()}


# --- retarget: a recorded kernel for another target (kiln prewarm) -----------

# Options parse_options derives from the target; every other option is the
# client's own and carries over.
_TARGET_DERIVED_OPTIONS = ("arch", "supported_fp8_dtypes", "deprecated_fp8_dot_operand_dtypes",
                           "max_num_imprecise_acc_default")
# The frontend reads those options only for fp8 types (which it checks, converts
# and gives dot accumulation limits per target): TTIR without them is the same
# for every target.
_FP8_TYPE = re.compile(r"\bf8E\d")


def _skipped(reason):
    return {"ok": True, "skipped": reason}, {}


def retarget(header, parts):
    try:
        # The toolchain's own ptxas unless a key names another: never the
        # one the previous job's client ran.
        recorded = json.loads(header["key_inputs_json"])
        env = recorded.get("env", {}) if isinstance(recorded, dict) else {}
        if not isinstance(env, dict):
            raise TypeError("its env is not a map")
        refused = refused_variable(env)
        if refused:
            return _error("invalid_request", "the recording's " + refused)
        with client_environment(dict(env)):
            return _retarget(header, parts)
    except Exception as error:  # a recording is client input: a bad one is refused, never a lost worker
        return _error("invalid_request", "the recorded key inputs are not usable: %s: %s"
                      % (type(error).__name__, error))


def _retarget(header, parts):
    """What triton.compile would key and compile for `target`, from a kernel's
    frontend TTIR recorded for another target: its source hash is taken from
    the recorded key once the rest of that key is rebuilt exactly (same
    Triton, ptxas, options and env), so the new key is the one a client of
    `target` computes."""
    # A malformed recording raises here; retarget() refuses it.
    recorded = json.loads(header["key_inputs_json"])
    if not isinstance(recorded, dict):
        raise TypeError("not a JSON object")
    key, env = recorded["key"], dict(recorded.get("env", {}))
    options = {k: _as_tuples(v) for k, v in json.loads(recorded["options_json"]).items()}
    recorded_backend = make_backend(_parse_target(recorded["target"]))
    new_backend = make_backend(_parse_target(header["target"]))
    ir_text = parts["ir"].decode()
    new_name = "%s:%s" % (header["target"]["backend"], header["target"]["arch"])
    if recorded.get("frontend_read_device"):
        return _skipped("its frontend read the GPU of the machine that recorded it (%s), so its TTIR may differ "
                        "on %s" % (recorded["frontend_read_device"], new_name))
    own = {k: v for k, v in options.items() if k not in _TARGET_DERIVED_OPTIONS}
    try:
        recorded_options = recorded_backend.parse_options(dict(own))
        new_options = new_backend.parse_options(dict(own))
    except (ValueError, TypeError, AssertionError) as error:
        return _skipped("its options do not apply to %s: %s" % (new_name, error))
    if recorded_options.__dict__ != options:
        return _skipped("it was compiled with target options of its own (%s)" % ", ".join(
            k for k in options if recorded_options.__dict__.get(k) != options[k]))
    env_text = str(sorted(env.items()))
    if recorded.get("triton_key") != triton_key():
        return _error("invalid_request", "the recording is of another Triton than this toolchain's")
    prefix = triton_key() + "-"

    def source_hash_if_made_so(backend_hash):
        suffix = "-%s-%s-%s" % (backend_hash, recorded_options.hash(), env_text)
        if key.startswith(prefix) and key.endswith(suffix) and len(key) > len(prefix) + len(suffix):
            return key[len(prefix):len(key) - len(suffix)]
        return None

    source_hash = source_hash_if_made_so(recorded_backend.hash())
    tool_env, new_backend_hash = {}, None
    if source_hash is None:
        # Inductor points TRITON_PTXAS_PATH at torch's ptxas, whose version
        # is in its kernels' keys: a ptxas of that version installed beside
        # this triton compiles them as the recording did.
        for variable, path, version in _ptxases_beside_triton(recorded_backend.target.arch):
            # New backends: Triton 3.6 on remembers each one's hash.
            with _ptxas_answering(version):
                source_hash = source_hash_if_made_so(make_backend(recorded_backend.target).hash())
                if source_hash is not None and _ptxas_variable(new_backend.target.arch) == variable:
                    # A client of the target with the same variable set runs it too.
                    tool_env, new_backend_hash = {variable: path}, make_backend(new_backend.target).hash()
            if source_hash is not None:
                break
    if source_hash is None:
        return _skipped("its key was made by another Triton or ptxas than this toolchain's")
    if _FP8_TYPE.search(ir_text) and any(recorded_options.__dict__[k] != new_options.__dict__[k]
                                         for k in _TARGET_DERIVED_OPTIONS if k != "arch"):
        return _skipped("it uses fp8 types, which Triton's frontend treats differently on %s" % new_name)
    new_key = "%s%s-%s-%s-%s" % (prefix, source_hash, new_backend_hash or new_backend.hash(), new_options.hash(),
                                 env_text)
    new_inputs = dict(recorded, key=new_key, target=header["target"], options_json=json.dumps(new_options.__dict__))
    return {"ok": True, "cache_key": hashlib.sha256(new_key.encode()).hexdigest(),
            "options_json": new_inputs["options_json"], "key_inputs_json": json.dumps(new_inputs),
            "tool_env": tool_env}, {"ir": restore_loop_names(ir_text).encode()}


_ptxases_found = None


def _ptxases_beside_triton(arch):
    """(variable, path, `--version` answer) of each ptxas installed in this
    toolchain's environment (site-packages: torch/bin, an nvidia-cuda-nvcc
    wheel's nvidia/cuda_nvcc/bin), as the variable Triton reads for `arch`
    would name it. Whoever registered the toolchain installed them; kilnd
    runs these, and no other, for callers that are not its own user."""
    global _ptxases_found
    if _ptxases_found is None:
        import glob
        import sysconfig

        site = os.path.dirname(os.path.dirname(os.path.abspath(triton.__file__)))
        program = "ptxas" + (sysconfig.get_config_var("EXE") or "")
        _ptxases_found = []
        for path in sorted(glob.glob(os.path.join(site, "*", "bin", program)) +
                           glob.glob(os.path.join(site, "*", "*", "bin", program))):
            try:
                answer = subprocess.run([path, "--version"], capture_output=True, check=True, timeout=60).stdout
                _ptxases_found.append((path, answer.decode("utf-8")))
            except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
                continue  # not a ptxas that runs here
    variable = _ptxas_variable(arch)
    return [(variable, path, version) for path, version in _ptxases_found]


def _ptxas_variable(arch):
    """The variable naming the ptxas Triton runs for `arch`: ptxas-blackwell's
    for the archs that Triton (3.6 on) gives it, else ptxas's. Asked of Triton
    in a job's environment, where neither variable is set."""
    import inspect

    from triton import knobs
    from triton.backends.nvidia import compiler as nvidia

    if not inspect.signature(nvidia.get_ptxas).parameters:
        return "TRITON_PTXAS_PATH"
    return "TRITON_PTXAS_PATH" if nvidia.get_ptxas(int(arch)).path == knobs.nvidia.ptxas.path \
        else "TRITON_PTXAS_BLACKWELL_PATH"


@contextlib.contextmanager
def _ptxas_answering(version):
    """Triton's nvidia backend takes `version` for every ptxas's answer."""
    from triton.backends.nvidia import compiler as nvidia

    ask_ptxas = nvidia.get_ptxas_version
    nvidia.get_ptxas_version = lambda *_args, **_kwargs: version
    try:
        yield
    finally:
        nvidia.get_ptxas_version = ask_ptxas


_SCF_FOR = re.compile(r"^(?P<indent>\s*)(?:(?P<results>%[\w$.:]+) = )?scf\.for (?P<iv>%[\w$.]+) = "
                      r"(?P<lb>%[\w$.]+) to (?P<ub>%[\w$.]+) step (?P<step>%[\w$.]+)"
                      r"(?: iter_args\((?P<iter>.*)\) -> \((?P<types>.*)\))?\s*: (?P<ivtype>\S+) \{$")
_REGION_END = re.compile(r"^\}(?: (?P<attrs>\{.*\}))?(?P<loc> loc\(.*\))?$")


def _split_top_level(text):
    """Splits at commas outside brackets: tensor<4x!tt.ptr<f16>> stays whole."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "<([{":
            depth += 1
        elif char in ">)]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text.strip():
        parts.append(text[start:].strip())
    return parts


def _argument_location(value, origin):
    """The location Triton's frontend gave a loop's block argument: the one
    the builder gave it (`origin`: an iter_arg's is its initial value's, the
    induction variable's the loop's), inside the name the frontend gave the
    value (printed with a uniquing suffix, "%acc_23"; none for %argN)."""
    name = value[1:]
    if re.fullmatch(r"arg\d+", name):
        return " loc(%s)" % origin if origin else ""
    name = '"%s"' % re.sub(r"_\d+$", "", name)
    return " loc(%s(%s))" % (name, origin) if origin else " loc(%s)" % name


_LOCATION_ALIAS = re.compile(r"^(#loc\d*) = loc\((.*)\)$", re.MULTILINE)
_NAMED_LOCATION = re.compile(r'^"(?:[^"\\]|\\.)*"\((.*)\)$')
_DEFINITION = re.compile(r"^\s*(%[\w$.]+)(?::\d+)? = ")


def _unnamed_location(location, aliases):
    """A loop's location as the builder made it, before the frontend named it
    after its results (each result wraps it in one more name)."""
    for _ in range(64):  # a loop has few results; the bound only guards a cycle of aliases
        location = aliases.get(location, location)
        named = _NAMED_LOCATION.match(location)
        if named is None:
            return location
        location = named.group(1)
    return None


_ALIAS_REFERENCE = re.compile(r"#loc\d*\b")


def _inline_location(location, aliases):
    """`location` with its aliases written out: a block argument's location
    may not refer to an alias defined further down, as the op locations do."""
    for _ in range(64):  # aliases nest a few deep; the bound only guards a cycle
        written_out = _ALIAS_REFERENCE.sub(lambda alias: aliases.get(alias.group(0), alias.group(0)), location)
        if written_out == location:
            return location
        location = written_out
    return None


def _locations_of_definitions(lines):
    """value -> the location of the op that defines it, for single-line ops."""
    found = {}
    for line in lines:
        definition = _DEFINITION.match(line)
        before, marker, location = line.rpartition(" loc(")
        if definition and marker and location.endswith(")"):
            found[definition.group(1)] = location[:-1]
    return found


def restore_loop_names(text):
    """Frontend TTIR whose loops keep their variables' names when parsed.
    MLIR's text form of scf.for prints no location for the induction variable
    and the loop-carried values, so a parsed module names them %argN and the
    .ttir made from it differs from stock's (later stages do not). In generic
    form their locations can be written: each scf.for is rewritten to it. Text
    that does not have the expected shape is returned as it is."""
    lines = text.split("\n")
    out = list(lines)
    aliases = dict(_LOCATION_ALIAS.findall(text))
    defined_at = _locations_of_definitions(lines)
    for number, line in enumerate(lines):
        loop = _SCF_FOR.match(line)
        if loop is None:
            continue
        indent = loop.group("indent")
        end = next((i for i in range(number + 1, len(lines))
                    if lines[i].startswith(indent + "}")), None)
        closing = _REGION_END.match(lines[end][len(indent):]) if end is not None else None
        carried = [pair.split(" = ") for pair in _split_top_level(loop.group("iter") or "")]
        types = _split_top_level(loop.group("types") or "")
        if closing is None or len(types) != len(carried) or any(len(pair) != 2 for pair in carried):
            return text
        iv_type = loop.group("ivtype")
        op_location = closing.group("loc")  # ' loc(#loc60)'
        loop_location = _unnamed_location(op_location[len(" loc("):-1], aliases) if op_location else None
        operands = [loop.group("lb"), loop.group("ub"), loop.group("step")] + [init for _, init in carried]
        origins = [loop_location] + [defined_at.get(init.split("#")[0]) for _, init in carried]
        origins = [_inline_location(origin, aliases) if origin else None for origin in origins]
        arguments = ["%s: %s%s" % (value, type_, _argument_location(value, origin)) for value, type_, origin
                     in zip([loop.group("iv")] + [name for name, _ in carried], [iv_type] + types, origins)]
        results = loop.group("results") + " = " if loop.group("results") else ""
        out[number] = '%s%s"scf.for"(%s) ({\n%s^bb0(%s):' % (indent, results, ", ".join(operands), indent,
                                                             ", ".join(arguments))
        out[end] = "%s})%s : (%s) -> (%s)%s" % (indent, " " + closing.group("attrs") if closing.group("attrs") else "",
                                                ", ".join([iv_type] * 3 + types), ", ".join(types),
                                                closing.group("loc") or "")
        if not types:
            # A loop that carries nothing prints no scf.yield: the parser of
            # its custom form adds it, at the loop's location, and the generic
            # form must have it written.
            out[end] = "%s  scf.yield%s\n%s" % (indent, closing.group("loc") or "", out[end])
    return "\n".join(out)


# --- a torch.compile kernel's configs, from the module inductor generated -------

_KERNEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")


def _triton_dir_key(name):
    """kilnd keys a kernel by the hex SHA-256 Triton names its cache directory
    for in base32."""
    return base64.b32decode(name + "=" * (-len(name) % 8)).hex()


def _kernels_made(cache_dir):
    """{"<hex key>/<file>": bytes} of the kernels a Triton cache directory
    holds: each kernel's group of files, less Triton's own index of them."""
    made = {}
    for key_dir in sorted(os.listdir(cache_dir)):
        files = os.path.join(cache_dir, key_dir)
        for name in sorted(os.listdir(files)):
            if name.startswith("__grp__") or not os.path.isfile(os.path.join(files, name)):
                continue
            with open(os.path.join(files, name), "rb") as made_file:
                made["%s/%s" % (_triton_dir_key(key_dir), name)] = made_file.read()
    return made


_KEY_INPUTS_FILE = "kiln.key-inputs.json"  # kilnd's cache.kKeyInputsBlob


def _key_inputs_of_this_compile():
    """kiln.v1.KeyInputs (JSON bytes) of the triton.compile() this thread is
    in, read from its frame as the client reads them (kiln/triton/key_inputs.py),
    or None: kept with each kernel an inductor job compiles, so that a bundle's
    untrusted import and `kiln prewarm` can compile it again from its TTIR."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "compile"
                                     and frame.f_globals.get("__name__") == "triton.compiler.compiler"):
        frame = frame.f_back
    if frame is None:
        return None
    inputs = frame.f_locals
    try:
        key, backend, options = inputs["key"], inputs["backend"], inputs["options"]
        env = inputs.get("env_vars")
        if env is None:
            from triton._C.libtriton import get_cache_invalidating_env_vars

            env = get_cache_invalidating_env_vars()
        target = backend.target
        return json.dumps({"key": key, "triton_key": triton_key(),
                           "target": {"backend": target.backend, "arch": str(target.arch),
                                      "warp_size": target.warp_size},
                           "options_json": json.dumps(options.__dict__), "env": env,
                           # The job's frontend ran here, with no GPU to ask.
                           "frontend_read_device": ""}).encode()
    except Exception:  # noqa: BLE001  (a Triton of other shapes: the kernel goes without them)
        return None


def _recording_key_inputs():
    """Makes Triton's file cache leave kiln.key-inputs.json beside each
    kernel compiled from here on; returns the put_group it wrapped."""
    from triton.runtime.cache import FileCacheManager

    put_group = FileCacheManager.put_group

    def recorded(self, filename, group):
        inputs = _key_inputs_of_this_compile()
        if inputs is not None:
            group = dict(group, **{_KEY_INPUTS_FILE: self.put(inputs, _KEY_INPUTS_FILE, binary=True)})
        return put_group(self, filename, group)

    FileCacheManager.put_group = recorded
    return put_group


def _as_the_client_has_ptxas(client_versions):
    """Makes the nvidia backend answer `ptxas --version` as the client's Triton
    does (client_versions: arch -> answer; arch 0 where one ptxas serves all),
    so that this job keys its kernels as the client does; returns the function
    it replaced. The client's Triton may remember another ptxas's answer than
    the one that compiles (see kiln.v1.CompileInductorKernelRequest)."""
    import inspect

    from triton.backends.nvidia import compiler as nvidia

    versions = {int(arch): version for arch, version in client_versions.items()}
    ask_ptxas = nvidia.get_ptxas_version
    per_arch = bool(inspect.signature(nvidia.get_ptxas).parameters)

    def get_ptxas_version(*args, **kwargs):
        arch = (args[0] if args else kwargs.get("arch", 80)) if per_arch else 0
        return versions[arch] if arch in versions else ask_ptxas(*args, **kwargs)

    nvidia.get_ptxas_version = get_ptxas_version
    return ask_ptxas


def _inductor_kernel_here(header, parts):
    """Does what a worker of inductor's compile pool does with a kernel: loads
    its generated module and compiles every config (precompile with
    warm_cache_only, which names its own target: no GPU is touched), here with
    stock Triton into a Triton cache directory of the job's own, whose
    kernels go back to kilnd. The module is written where the client's
    inductor writes it (inductor_cache_dir): the cubins' line info names that
    file, as stock's do."""
    kernel_name, source = header.get("kernel_name", ""), parts.get("source")
    if not _KERNEL_NAME.match(kernel_name) or source is None or not header.get("inductor_cache_dir"):
        return _error("invalid_request", "inductor_kernel needs kernel_name, inductor_cache_dir and the source")
    try:
        source = source.decode()
    except UnicodeDecodeError:
        return _error("invalid_request", "the kernel's module is not UTF-8 text")
    refused = refused_variable(header.get("env", {}), header.get("tool_env", {}))
    if refused:
        return _error("invalid_request", refused)
    with client_environment({**header.get("env", {}), **header.get("tool_env", {})}), \
            tempfile.TemporaryDirectory(prefix="kiln-inductor-") as triton_cache:
        # Triton's own cache manager, whatever kilnd's environment names: the
        # kernels are read from its directory.
        job_env = {"TRITON_CACHE_DIR": triton_cache, "TORCHINDUCTOR_CACHE_DIR": header["inductor_cache_dir"],
                   "TRITON_CACHE_MANAGER": None}
        saved = {name: os.environ.pop(name, None) for name in job_env}
        os.environ.update({name: value for name, value in job_env.items() if value is not None})
        choose_gpu_driver = ask_ptxas = put_group = None
        try:
            from torch._inductor.async_compile import _load_triton_kernel_from_source
            from torch._inductor.runtime import triton_helpers

            # Inductor makes sure a GPU driver is Triton's active one before
            # each config's compile (torch.cuda.is_available(): CUDA starts in
            # the process). The compile names its target, and nothing of it
            # asks the driver: workers start no CUDA.
            choose_gpu_driver = triton_helpers.set_driver_to_gpu
            triton_helpers.set_driver_to_gpu = lambda: None
            ask_ptxas = _as_the_client_has_ptxas(header.get("ptxas_versions", {}))
            put_group = _recording_key_inputs()
            began = time.perf_counter()
            kernel = _load_triton_kernel_from_source(kernel_name, source)
            kernel.precompile(warm_cache_only=True)
            elapsed = time.perf_counter() - began
            made = _kernels_made(triton_cache)
        except Exception as error:  # the client compiles it itself, and meets the error as stock
            return _error(_classify(error), "%s: %s" % (type(error).__name__, error), traceback.format_exc())
        finally:
            if choose_gpu_driver is not None:
                triton_helpers.set_driver_to_gpu = choose_gpu_driver
            if put_group is not None:
                from triton.runtime.cache import FileCacheManager

                FileCacheManager.put_group = put_group
            if ask_ptxas is not None:
                from triton.backends.nvidia import compiler as nvidia

                nvidia.get_ptxas_version = ask_ptxas
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return {"ok": True, "timings": {"inductor_kernel": elapsed}}, made


def inductor_kernel(header, parts):
    """An inductor_kernel job, run by a child of the toolchain's inductor fork
    server where there is one (Linux), else in this worker."""
    served = _in_forked_child(header, parts) if _FORK_SERVER_PLATFORM else None
    return served if served is not None else _inductor_kernel_here(header, parts)


# --- the inductor fork server (Linux) ---------------------------------------------
# A kernel module needs torch and inductor's runtime, whose imports cost each
# worker about 4 s of CPU: with a pool as large as the machine's cores that
# was more CPU than inductor's own pool spends, which imports once and forks
# its workers. Here the same: the first worker to need it starts a fork
# server for kilnd's pool of this toolchain, which imports them once and
# forks a child for each worker that connects; the worker hands its jobs to
# its child and waits. A child lives as long as its worker's connection, as
# inductor's workers do: with a child per job kilnd spent about twice the CPU
# of inductor's pool (H100), most likely in the pages each new child copied.

_FORK_SERVER_PLATFORM = sys.platform.startswith("linux")
_FORK_SERVER_FLAG = "--inductor-fork-server"
_CONNECT_TRIES = 50  # 0.02 s apart: another worker is between bind and listen
_TAKEN = b"\x01"  # a child's first answer to a job: from here on, the job is its


def _fork_server_address():
    """An abstract socket (no file to place or leave behind) named for kilnd,
    this worker's parent, and this toolchain; only this user is served and
    trusted (SO_PEERCRED on both ends), so that another account that binds
    the name first is never sent a job."""
    toolchain = hashlib.sha256(("%s\0%s" % (sys.executable, triton.__file__)).encode()).hexdigest()[:16]
    return "\0kiln-inductor-%d-%d-%s" % (os.getuid(), os.getppid(), toolchain)


def _peer_is_this_user(connection):
    creds = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


def _start_fork_server(address):
    """Binds the address and starts a fork server on it; does nothing when
    another worker holds it (it is starting one)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
    except OSError:
        listener.close()
        return
    with listener:
        # Listening before the server's imports: the workers' jobs queue
        # meanwhile, and no other worker starts a second server.
        listener.listen(64)
        # It holds no worker's pipes: kilnd waits for a worker's stderr to
        # close when it ends; each child writes to its own worker's instead.
        subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), _FORK_SERVER_FLAG,
                          str(listener.fileno())], pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_BASE_ENV)


def _connect_to_fork_server():
    address = _fork_server_address()
    for attempt in range(_CONNECT_TRIES):
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(address)
        except (ConnectionRefusedError, FileNotFoundError):
            connection.close()
            if attempt == 0:
                _start_fork_server(address)
            else:
                time.sleep(0.02)
            continue
        if _peer_is_this_user(connection):
            socket.send_fds(connection, [b"2"], [2])  # where the child's output goes: this worker's stderr
            return connection
        connection.close()
        print("kiln_worker: %r is held by another account; kernel modules compile in this worker"
              % address[1:], file=sys.stderr)
        return None
    return None


_forked_child = None  # (connection, replies, requests) to this worker's child


def _child_connection():
    global _forked_child
    if _forked_child is None:
        try:
            connection = _connect_to_fork_server()
        except OSError as error:
            print("kiln_worker: no inductor fork server (%s); kernel modules compile in this worker" % error,
                  file=sys.stderr)
            return None
        if connection is not None:
            _forked_child = (connection, connection.makefile("rb"), connection.makefile("wb"))
    return _forked_child


def _drop_child_connection():
    global _forked_child
    for end in reversed(_forked_child):
        with contextlib.suppress(OSError):
            end.close()
    _forked_child = None


def _in_forked_child(header, parts):
    """The reply of this worker's child of the fork server, which ran the job;
    None where none could be reached (the job runs here)."""
    for _attempt in range(2):  # a child that ended between jobs is replaced once
        child = _child_connection()
        if child is None:
            return None
        _connection, replies, requests = child
        try:
            write_message(header, parts, requests)
            taken = replies.read(1) == _TAKEN
        except OSError:
            taken = False
        if taken:
            break
        _drop_child_connection()
    else:
        return None
    try:
        return read_message(replies)
    except (EOFError, OSError):
        # The child died in the job (a fatal LLVM error, a signal): end as a
        # worker that died in it would, and kilnd reports the crash.
        print("kiln_worker: the fork server's child died compiling %s" % header.get("kernel_name"),
              file=sys.stderr)
        os._exit(70)


def _serve_forks(listener_fd):
    """The fork server: imports what kernel modules need, then forks a child
    for each worker that connects, which runs that worker's jobs. It ends
    with the worker that started it (its children go on serving theirs); a
    worker that connects later then starts another."""
    listener = socket.socket(fileno=listener_fd)
    started_by = os.getppid()
    # Killed the moment that worker ends (PR_SET_PDEATHSIG), not at the next
    # look at the parent below: nothing of kilnd's outlives it.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != started_by:
        return
    import torch  # noqa: F401  (the imports each child then has)
    from torch._inductor import async_compile  # noqa: F401
    from torch._inductor.runtime import triton_heuristics  # noqa: F401
    from triton.backends.nvidia import compiler  # noqa: F401

    # What is made so far is the children's to share: their collections
    # leave it be, and its pages uncopied.
    gc.freeze()
    listener.settimeout(1.0)
    while os.getppid() == started_by:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        try:
            connection, _ = listener.accept()
        except socket.timeout:
            continue
        connection.settimeout(None)
        if not _peer_is_this_user(connection):
            connection.close()
            continue
        if os.fork() == 0:
            listener.close()
            try:
                _serve_worker(connection)
            finally:
                os._exit(0)
        connection.close()


def _end_with_worker(fd):
    """Ends the child the moment its worker's end of the connection closes,
    in a job too: kilnd kills a worker whose job ran past its timeout, and
    waits for every holder of its stderr (this child) to go."""
    watch = select.poll()
    watch.register(fd, select.POLLRDHUP)
    while not any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, events in watch.poll()):
        pass
    os._exit(0)


def _serve_worker(connection):
    """A fork server's child: runs its worker's jobs until the worker goes."""
    _, (worker_stderr, *_), _, _ = socket.recv_fds(connection, 1, 1)
    for output in (1, 2):
        os.dup2(worker_stderr, output)
    os.close(worker_stderr)
    threading.Thread(target=_end_with_worker, args=(connection.fileno(), ), daemon=True).start()
    with connection, connection.makefile("rb") as requests, connection.makefile("wb") as replies:
        while True:
            try:
                job = read_message(requests)
            except (EOFError, OSError):
                return
            replies.write(_TAKEN)
            replies.flush()
            write_message(*_inductor_kernel_here(*job), stream=replies)


def ping(_header, _parts):
    """A new worker's first answer, which says its imports are done."""
    return {"ok": True}, {}


JOBS = {"hello": hello, "ping": ping, "compile": compile_job, "launcher_source": launcher_source,
        "retarget": retarget, "inductor_kernel": inductor_kernel}


def main():
    while True:
        try:
            header, parts = read_message()
        except EOFError:
            return  # kilnd closed the pipe: retire quietly
        job = JOBS.get(header.get("op"))
        if job is None:
            write_message(*_error("invalid_request", "unknown op %r" % header.get("op")))
            continue
        write_message(*job(header, parts))


if __name__ == "__main__":
    if sys.argv[1:2] == [_FORK_SERVER_FLAG]:
        _serve_forks(int(sys.argv[2]))
    else:
        main()
