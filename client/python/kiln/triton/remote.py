"""Triton integration through its own extension points:

- RemoteCacheManager, behind cache_manager.KilnCacheManager (TRITON_CACHE_MANAGER):
  lookups go to kilnd; a hit returns Triton's group of files without running
  the frontend; a miss may claim the kernel (others wait for this compile).
- The stages hook (on Triton 3.6 knobs.runtime.add_stages_inspection_hook,
  set as triton.knobs is imported by _stages_hook; elsewhere a wrapper of
  CUDABackend.add_stages): TTIR, TTGIR and LLIR run here as in stock; the
  LLIR goes to kilnd, and the later stages return kilnd's results.
- knobs.build.impl (_build_hook, set as triton.knobs is imported): launcher
  and cuda_utils modules are built by kilnd.

Kiln activates once per process (connects to kilnd; but on 3.6 wraps the
backend), on the first use of the cache manager that needs kilnd (which the
environment variable carries into subprocesses), so importing kiln costs an
interpreter nothing until Triton compiles or misses its local index. The
knob hooks are in place before that: the build hook activates Kiln when a
module is to be built, the stages hook (3.6) runs Kiln's stages once it is
active.
"""

import functools
import hashlib
import json
import logging
import os
import _socket  # not socket: see service/local_grpc.py
import sys
import threading

from kiln.local import compile_threads as _compile_threads
from kiln.local import files as _files
from kiln.local import index as _index
from kiln.service import api as _api
from kiln.service import connection as _service
from kiln.service import paths as _paths
from kiln.triton import build_hook as _build_hook
from kiln.triton import compiled_here as _compiled_here
from kiln.triton import early_launchers as _early_launchers
from kiln.triton import frontend as _frontend
from kiln.triton import key_inputs as _key_inputs
from kiln.triton import keys as _keys
from kiln.triton import launcher_origin as _launcher_origin
from kiln.triton import stages_hook as _stages_hook
from kiln.triton import versions as _triton_versions
from kiln.triton.deferred_texts import HitGroup, known_texts
from kiln.triton.hand_over import hand_over
from kiln.triton.lookups import hit_files as _hit_files
from kiln.triton.lookups import lookup as _lookup

log = logging.getLogger("kiln")

import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime.cache import CacheManager, FileCacheManager  # noqa: E402

_install_lock = threading.Lock()
_installed = None  # None: not tried; True: hooks in place; False: stock Triton


def active():
    """Installs the hooks on first use; False when Triton must run stock."""
    global _installed
    if _installed is not None:
        return _installed
    with _install_lock:
        if _installed is None:
            _installed = _install()
    return _installed


def _install():
    unsupported = _triton_versions.cached_unsupported_reason()
    if unsupported:
        _service.fall_back(unsupported)
        return False
    try:
        _service.connect()
    except Exception as error:  # noqa: BLE001  (every failure of Kiln's falls back)
        reason = _describe_failure(error)
        _service.forget(shun_because=reason)
        _service.fall_back(reason)
        return False
    _install_stages_hook()
    _build_hook.claim(knobs)  # again after kiln.disable(), which released it
    log.debug("kiln hooks installed (triton %s)", triton.__version__)
    return True


def active_or_untried():
    """False once this process fell back to stock Triton; True before Kiln has
    been tried (it activates on the first compile) and while it serves."""
    return _installed is not False


def uninstall():
    global _installed
    with _install_lock:
        if _installed:
            _stages_hook.release()
            _unwrap_add_stages()
            _frontend.unguard_frontends()
        _installed = None
        _service.forget()


def _stub():
    return _service.connect().stub


def _describe_failure(error):
    """What a failure of Kiln's was, for the one warning (or strict mode's error)."""
    if isinstance(error, _service.RpcError):
        if _service.is_unavailable(error):
            return f"kilnd became unreachable ({error.details()})"
        return f"kilnd answered {error.code().name}: {error.details()}"
    if isinstance(error, _service.KilnUnavailable):
        return str(error)
    return f"Kiln failed ({type(error).__name__}: {error})"


def _go_stock(error):
    """The one rule for every failure of Kiln's (kilnd gone, any status it
    answers, an answer that cannot be used, its files): stock Triton for the
    rest of the process, with one warning; under KILN_STRICT, KilnUnavailable
    naming the cause instead."""
    global _installed
    reason = _describe_failure(error)
    _service.forget(shun_because=reason)
    _installed = False
    _service.fall_back(reason)


def _stock_on_failure(method):
    """A cache manager method whose failures are Kiln's (everything in it is):
    on one, this call and the manager go to Triton's FileCacheManager."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if self._stock is None:
            try:
                return method(self, *args, **kwargs)
            except Exception as error:  # noqa: BLE001  (every failure of Kiln's falls back)
                self._go_stock(error)
        return getattr(self._stock, method.__name__)(*args, **kwargs)
    return guarded


# --- the cache manager -------------------------------------------------------

class RemoteCacheManager(CacheManager):
    """Triton's cache API over kilnd, behind cache_manager.KilnCacheManager. Dump and
    override directories, and any use while kilnd is unreachable, go to Triton's
    own FileCacheManager. What it materializes goes into the local index."""

    def __init__(self, key, override=False, dump=False):
        self.key = key
        self._hex = _keys.hex_key(key)
        self._files = {}  # filename -> path, from a group lookup
        self._group = None  # the compile this manager serves, from get_group to put_group
        self._stock = None
        if override or dump or not active():
            self._stock = FileCacheManager(key, override=override, dump=dump)

    def _go_stock(self, error):
        self._stock = FileCacheManager(self.key)
        _go_stock(error)

    def _lookup_or_claim(self):
        """kilnd's answer for this key; on a miss this process may get the claim
        (it compiles, others wait), held for as long as the call stays open. A
        plain lookup first, where a hit is the common case: it costs half a
        streaming call. Where kilnd serves this process files, its index has
        already missed here, and kilnd rarely has the kernel: one call, not two."""
        if _paths.served_files_dir() is None or not _files.wanted_as_served_files():
            response = _lookup("triton", self._hex)
            if response.found:
                return response
        call = _stub().LookupOrClaim(_api.LookupRequest(
            namespace="triton", key=self._hex, claimant=_frontend.CLAIMANT,
            as_files=_files.wanted_as_served_files(),
            key_components=_key_inputs.of_current_compile(self._hex, _api)))
        try:
            response = next(call)
        except StopIteration:
            return _api.LookupResponse()
        if response.claimed:
            self._group.claim = call
        elif response.found and not _files.readable_served(response.entry):
            return _lookup("triton", self._hex)
        return response

    @_stock_on_failure
    def get_group(self, filename):
        # triton.compile looks its key up first: the compile starts here.
        self._group = _frontend.begin(self._hex)
        response = self._lookup_or_claim()
        if not response.found:
            if getattr(getattr(knobs, "build", None), "impl", None) is _build_hook.build:
                _early_launchers.start(_stub())  # built while the kernel compiles
            # The stages hook sends the compile to kilnd, or runs it here.
            self._group.compiled_here = compiles_here()
            return None
        files = _hit_files("triton", self._hex, response.entry)
        if filename not in files:
            return None
        self._files = hand_over(self.key, files)
        return HitGroup(self._files)

    @_stock_on_failure
    def get_file(self, filename):
        if filename in self._files:
            return self._files[filename]
        response = _lookup("triton-files", f"{self._hex}/{filename}")
        if not response.found:
            return None
        return _hit_files("triton-files", f"{self._hex}/{filename}", response.entry)[filename]

    @_stock_on_failure
    def put(self, data, filename, binary=True):
        if filename.endswith(".source"):  # the frontend's output: its Python part is over
            _compile_threads.python_part_done()
        data = data if isinstance(data, bytes) else str(data).encode()
        digest = hashlib.sha256(data).digest()
        if self._group is not None and _kilnd_serves_files():
            path = _files.scratch(filename, data)  # this process's alone (put_group)
        else:
            path = _files.materialize(filename, data, digest)
        self._files[filename] = path
        if "torch._inductor" in sys.modules:  # its static launcher reads the cubin from Triton's cache dir
            _files.mirror_cubin(path, self.key, filename)
        if self._group is not None:
            # A compile's file: it reaches kilnd with the compile, or with put_group.
            self._group.made[filename] = data
            return path
        # Something Triton made outside a compile (autotuner timings, a module
        # built without kilnd): share it with other processes.
        _stub().Put(_api.PutRequest(namespace="triton-files", key=f"{self._hex}/{filename}",
                                    blobs=[_api.blob(filename, data, digest)], serve_as_files=True))
        _index.record("triton-files", f"{self._hex}/{filename}", {filename: path})
        return path

    @_stock_on_failure
    def put_group(self, filename, group):
        compile_group, self._group = self._group, None
        try:
            if compile_group is not None and _frontend.worth_keeping(compile_group.output):
                # A hit shows the output again only where Triton's cache dir lacks
                # the kernel (hand_over), as stock compiles only there: this
                # one has it now.
                for name, path in group.items():
                    _files.mirror_cubin(path, self.key, name)
            if compile_group is not None and compile_group.recorded_by_kilnd and _kilnd_serves_files():
                # kilnd serves this entry's files and index to the next process
                # (it writes them once stored): this process's own files are
                # scratch, for Triton's CompiledKernel here, and go at its exit.
                return None
            if compile_group is not None and compile_group.compiled_here and _kilnd_serves_files():
                # The same, once a thread has put it; kilnd's claim ends then.
                claim, compile_group.claim = compile_group.claim, None
                _compiled_here.store(self._hex, _blobs_compiled_here(compile_group, group), group, claim,
                                     lambda: store_compiled_here)
                return None
            for name, path in group.items():  # no longer this process's alone
                if _files.is_scratch(path):
                    group[name] = self._files[name] = _files.promote(path, name, compile_group.made[name])
            self._index_group(compile_group, group)
        finally:
            if compile_group is not None:
                _frontend.finish(compile_group)
                known_texts(group, compile_group.made)  # not read back by the CompiledKernel made of it
        return None

    def _index_group(self, compile_group, group):
        """Records the group in this client's own index (and shares it with
        kilnd where Triton compiled it here)."""
        key_inputs = compile_group.key_inputs if compile_group is not None else None
        indexed, output_blobs = dict(group), _frontend_and_key_blobs(compile_group, key_inputs)
        for blob in output_blobs:
            indexed[blob.name] = _files.materialize(blob.name, blob.data, blob.sha256)
        if compile_group is None or not compile_group.recorded_by_kilnd:
            # Triton compiled in this process (a flow Kiln leaves stock): share it.
            made = compile_group.made if compile_group is not None else {}
            _stub().Put(_api.PutRequest(namespace="triton", key=self._hex,
                                        blobs=_file_blobs(made, group) + output_blobs, serve_as_files=True))
        _index.record("triton", self._hex, indexed)


def compiles_here():
    """Whether a compile that missed runs in this process, kilnd storing it
    after (compiled_here): the program's own (not a compile ahead, which
    kilnd's workers run beside the program), where kilnd serves this process
    the files of what it stores."""
    return (os.environ.get("KILN_COMPILE_HERE", "1") != "0" and not _compile_threads.in_compile_thread()
            and _kilnd_serves_files())


def _kilnd_serves_files():
    """Whether kilnd serves this process its files (its own account, locally):
    then a compile's files are scratch, this process's alone (put_group)."""
    return _paths.served_files_dir() is not None and _files.wanted_as_served_files()


def _file_blobs(made, group):
    """Triton's files of a kernel: as made in this process, or read from `group`'s paths."""
    return [_api.blob(name, made.get(name) or _files.read(path)) for name, path in group.items()]


def _frontend_and_key_blobs(compile_group, key_inputs=None):
    """frontend.kept_beside's, as blobs."""
    return [_api.blob(name, data) for name, data in _frontend.kept_beside(compile_group, key_inputs).items()]


def _blobs_compiled_here(compile_group, group):
    """What kilnd stores of a kernel compiled here."""
    return _file_blobs(compile_group.made, group) + _frontend_and_key_blobs(compile_group, compile_group.key_inputs)


# --- the stages hook ---------------------------------------------------------

def _raise_compile_error(error):
    from triton.runtime.errors import OutOfResources, PTXASError

    if error.kind == _api.CompileError.KIND_PTXAS_ERROR:
        raise PTXASError(error.message)
    if error.kind == _api.CompileError.KIND_OUT_OF_RESOURCES:
        raise OutOfResources(0, 0, error.message)
    # What stock Triton raises when an MLIR pass or LLVM fails.
    raise RuntimeError(f"{error.message}\n{error.log}".rstrip())


# The stages that run in this process, as in stock Triton: up to the LLVM IR,
# Triton's stages hand each other in-memory MLIR modules whose text form loses
# the names and locations of loop-carried values. They reach the .ttir file
# itself and, under LLVM_EXTRACT_DI_LOCAL_VARIABLES, the LLVM debug info;
# nothing after the .ttir otherwise (test_pipeline compiles the suite from
# frontend TTIR text to stock's TTGIR, LLIR, PTX and cubin). make_llir returns
# text and make_ptx parses it: there Triton itself serializes, and kilnd takes
# over (PTX and ptxas, about half of a compile) with nothing lost.
_FIRST_STAGE_IN_KILND = "ptx"
# A compile ahead (Kiln's compile threads: an autotuned kernel's configs, a
# graph's kernels) makes only the .ttir here, and kilnd the TTGIR onwards, from
# the frontend's TTIR: the stages' Python glue in this process would take the
# GIL, in many short turns, from the frontends of the compiles beside it and
# from the benchmark loop waiting for it (the first config of an autotuned
# kernel was ready in 0.65 s with 7 compiles beside it, 0.26 s alone).
_FIRST_STAGE_IN_KILND_AHEAD = "ttgir"
_INPUT_STAGE = {"source": "STAGE_TTIR", "ttgir": "STAGE_TTGIR", "llir": "STAGE_LLIR", "ptx": "STAGE_PTX"}


def store_compiled_here(hex_key, made):
    """Stores in kilnd a kernel this process compiled with its own Triton
    (compiled_here; `made`: {file name: bytes}, or its kiln.v1.Blobs): kilnd
    serves its files, and indexes them, to the next process."""
    blobs = [_api.blob(name, data) for name, data in made.items()] if isinstance(made, dict) else made
    _stub().Put(_api.PutRequest(namespace="triton", key=hex_key, blobs=blobs, serve_as_files=True))


# Triton's compilation knobs that keep them here when set (3.4 and 3.5 lack the
# last two).
_KNOBS_KEEPING_STAGES_HERE = ("override", "dump_ir", "use_ir_loc", "disable_line_info", "enable_asan",
                              "store_binary_only", "dump_ir_extract_di_local_variables", "instrumentation_mode")


def _stages_may_leave(metadata):
    """Whether kilnd may run make_ttgir and make_llir for this process: not
    when anything makes their output differ from what kilnd's workers (which
    see the client's environment, not its knobs) would make, or shows the user
    something while they run (dumps, timings, overrides). Nor where Triton
    keeps no .ttir (TRITON_STORE_BINARY_ONLY): kilnd would keep its own."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return not (metadata.get("ir_override") or get_cache_invalidating_env_vars()
                or any(getattr(knobs.compilation, knob, None) for knob in _KNOBS_KEEPING_STAGES_HERE))


# _compile's answer when kilnd has no worker up yet and this process compiles the kernel itself.
_NO_WORKER_READY = object()


class _RemoteCompile:
    """One kernel's stages: TTIR, TTGIR and LLIR run here; the first later stage
    sends the LLIR to kilnd and each returns kilnd's artifact. A compile ahead
    sends the frontend's TTIR at the TTGIR stage instead. A stage whose input is
    not what kilnd returned for the stage before (an ir_override or
    TRITON_KERNEL_OVERRIDE replaced it) compiles again from that input. If kilnd
    goes away, the stock stages run."""

    def __init__(self, backend, options, original):
        self.backend = backend
        self.options = options
        self.original = original
        self.order = list(original)
        self.group = _frontend.current()
        self.artifacts = None  # ext -> what kilnd returned
        self.stock = False
        self.first_in_kilnd = _FIRST_STAGE_IN_KILND
        self.made_ttir = None  # make_ttir's output, here

    def stage(self, ext, module, metadata):
        _compile_threads.python_part_done()  # a Triton that keeps no frontend output ends it here
        try:
            return self._run(ext, module, metadata)
        except BaseException:
            if self.group is not None:
                self.group.end_claim()  # nobody waits on a compile that failed
            raise

    def _run(self, ext, module, metadata):
        if self.group is not None and self.group.hex != metadata["hash"]:
            self.group = None  # not the compile this thread looked up last
        if self.group is not None and self.group.compiled_here and not self.stock:
            self.stock = True  # compiled_here: every stage here, as stock runs them
            self._record_key_inputs()
        if ext == _FIRST_STAGE_IN_KILND_AHEAD and not self.stock and self._frontend_goes(module, metadata):
            self.first_in_kilnd = ext
        if self.stock or self.order.index(ext) < self.order.index(self.first_in_kilnd):
            _compile_threads.resume_python()  # not while a benchmark is timed
            made = self.original[ext](module, metadata)
            if ext == "ttir":
                self.made_ttir = made
            return made
        input_ext = self.order[self.order.index(ext) - 1]
        if self.artifacts is None or self.artifacts.get(input_ext) is not module:
            try:
                # From the frontend's TTIR, kilnd runs make_ttir again: the
                # .ttir it would make from text differs from stock's (loop
                # variables' names), so this process keeps its own.
                sent_ext = "source" if ext == _FIRST_STAGE_IN_KILND_AHEAD else input_ext
                kernel_error = self._compile(sent_ext, module, metadata)
            except Exception as error:  # noqa: BLE001  (Kiln's failure, never the kernel's: stock compiles it)
                _go_stock(error)
                self.stock = True
                return self.original[ext](module, metadata)
            if kernel_error is _NO_WORKER_READY:
                # This kernel compiles here, as stock's would, and reaches
                # kilnd with put_group; kilnd's worker serves the next ones.
                self.stock = True
                self._record_key_inputs()
                return self.original[ext](module, metadata)
            if kernel_error is not None:
                _raise_compile_error(kernel_error)  # the kernel's own failure, as stock raises it
        return self.artifacts[ext]

    def _record_key_inputs(self):
        """Keeps what this compile's key came from, for the put of a kernel
        compiled here: without them, `kiln prewarm` and a bundle's untrusted
        import could not compile it again from its TTIR."""
        if self.group is not None:
            self.group.key_inputs = _key_inputs.recorded_for_prewarm(self.group.hex, self.group.frontend_read_device)

    def _frontend_goes(self, ttir, metadata):
        """Whether this compile ahead sends its frontend's TTIR to kilnd: the
        TTIR stage's input was the frontend's output, kept as Triton's
        .source, and its output is what this stage gets."""
        return (_compile_threads.in_compile_thread() and self.group is not None and ttir is self.made_ttir
                and any(name.endswith(".source") for name in self.group.made) and _stages_may_leave(metadata))

    def _input_text(self, input_ext, module):
        """The IR text Triton stored for the input stage (printed once, by put)."""
        if isinstance(module, (str, bytes)):
            return module.decode() if isinstance(module, bytes) else module
        made = self.group.made if self.group is not None else {}
        text = next((data for name, data in made.items() if name.endswith("." + input_ext)), None)
        return text.decode() if text is not None else str(module)

    def _request_basics(self):
        """(Triton's key, the target, the options as JSON, the environment's
        cache-invalidating variables) of this compile."""
        from triton._C.libtriton import get_cache_invalidating_env_vars

        from kiln.triton.versions import triton_key

        return (triton_key(), self.backend.target, json.dumps(self.options.__dict__),
                get_cache_invalidating_env_vars())

    def _client_artifacts(self):
        if self.group is None:
            return []
        blobs = [_api.blob(name, data) for name, data in self.group.made.items() if not name.endswith(".json")]
        return blobs + _frontend_and_key_blobs(
            self.group, _key_inputs.recorded_for_prewarm(self.group.hex, self.group.frontend_read_device))

    def _compile(self, input_ext, module, metadata):
        """Has kilnd compile from `input_ext` on; returns the kernel's CompileError
        if it failed, _NO_WORKER_READY when kilnd compiled nothing, else None
        with self.artifacts and `metadata` filled in."""
        triton_key, target, options_json, env = self._request_basics()
        ahead = _compile_threads.in_compile_thread()
        here_when_busy = ahead and _compile_threads.compile_here_when_kilnd_is_busy()
        request = _api.CompileRequest(
            triton_key=triton_key, stage=_api.STAGE[_INPUT_STAGE[input_ext]],
            ir=self._input_text(input_ext, module),
            target=_api.Target(backend=target.backend, arch=str(target.arch), warp_size=target.warp_size),
            options_json=options_json, env=env, namespace="triton", cache_key=metadata["hash"],
            local_python_executable=sys.executable, metadata_json=json.dumps(metadata, default=vars),
            client_artifacts=self._client_artifacts(),
            tool_paths=tool_paths(), requester=requester(),
            # A program's own compile does not wait for kilnd's worker to start
            # (kilnd just started): compiled here, it costs what stock's does.
            # A compile ahead waits (nothing waits for it yet), unless its
            # thread is a core's only compiler: then it compiles here whenever
            # kilnd has no idle worker for it.
            no_wait_for_worker_start=not ahead or here_when_busy, no_wait_for_busy_workers=here_when_busy)
        _compile_threads.pause_python()
        response = _stub().Compile(request)
        _compile_threads.resume_python()
        if self.group is not None:
            self.group.end_claim()  # kilnd ended it with the compile; this closes our side
        if response.no_worker_ready:
            return _NO_WORKER_READY
        _compile_threads.note_remote_seconds(sum(response.stage_seconds.values()))
        if response.WhichOneof("result") == "error":
            return response.error
        self.artifacts = {}
        for blob in response.entry.blobs:
            ext = blob.name.rsplit(".", 1)[-1]
            if ext == "json":
                compiled = json.loads(blob.data)
                compiled.pop("target", None)  # keep Triton's GPUTarget object
                metadata.update(compiled)
            elif ext == "cubin":
                self.artifacts[ext] = blob.data
            elif ext in self.original:
                self.artifacts[ext] = blob.data.decode()
        if self.group is not None:
            self.group.recorded_by_kilnd = True
        return None


# The variables that choose the ptxas this process's Triton runs (inductor
# sets the first to torch's own): its version is in the kernel's key, so
# kilnd's worker must run the same one.
_TOOL_VARIABLES = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH")


def tool_paths():
    return {name: os.environ[name] for name in _TOOL_VARIABLES if os.environ.get(name)}


def requester():
    """This process, as kilnd shares its workers among processes."""
    return f"{_socket.gethostname()}:{os.getpid()}"


def _usable(backend, language):
    from triton.backends.compiler import Language

    return language == Language.TRITON and backend.target.backend == "cuda"


def stages_hook(*args):
    """Kiln's stages for a compile (triton/stages_hook asks for them)."""
    backend, stages, options, language = args[:4]
    if not _installed:
        return None
    _frontend.guard_frontends()  # before this compile's make_ir runs
    remote = _RemoteCompile(backend, options, dict(stages))
    if not _usable(backend, language):
        remote.stock = True  # still ends the claim if a stage fails
    for ext in list(stages):
        stages[ext] = functools.partial(remote.stage, ext)
    return None


_original_add_stages = None


def _install_stages_hook():
    global _original_add_stages
    if _triton_versions.uses_stages_knob(knobs):
        _stages_hook.claim(knobs)  # again after kiln.disable(), which released it
        return
    # Triton 3.4, 3.5 and 3.7+: wrap the CUDA backend's add_stages.
    from triton.backends.nvidia.compiler import CUDABackend

    _original_add_stages = CUDABackend.add_stages

    def add_stages(self, stages, options, language, *rest):
        _original_add_stages(self, stages, options, language, *rest)
        if getattr(knobs.runtime, "add_stages_inspection_hook", None) is None:  # else the user's pipeline runs stock
            stages_hook(self, stages, options, language)

    CUDABackend.add_stages = add_stages


def _unwrap_add_stages():
    global _original_add_stages
    if _original_add_stages is not None:
        from triton.backends.nvidia.compiler import CUDABackend

        CUDABackend.add_stages = _original_add_stages
        _original_add_stages = None


# --- launcher builds ---------------------------------------------------------

def _stock_build(name, src, srcdir, library_dirs, include_dirs, libraries):
    from triton.runtime import build

    with _install_lock:
        saved, knobs.build.impl = knobs.build.impl, None
        try:
            extra = [[]] if _triton_versions.build_takes_ccflags(build) else []
            return build._build(name, src, srcdir, library_dirs, include_dirs, libraries, *extra)
        finally:
            knobs.build.impl = saved


def _origin(name, source):
    """kiln.v1.LauncherOrigin of a source Triton's nvidia driver generated; None otherwise."""
    args = _launcher_origin.arguments_of(source)
    if args is not None:
        return _api.LauncherOrigin(make_launcher_args=args)
    if _launcher_origin.is_cuda_utils(name, source):
        return _api.LauncherOrigin(cuda_utils=True)
    return None


def build_module(name, src, srcdir, library_dirs, include_dirs, libraries):
    """_build_hook.build's work: kilnd builds the module (and caches it for every process)."""
    if not _installed:
        return _stock_build(name, src, srcdir, library_dirs, include_dirs, libraries)
    try:
        return _build_through_kilnd(name, src, srcdir, library_dirs, include_dirs, libraries)
    except Exception as error:  # noqa: BLE001  (Kiln's failure: the machine's compiler builds it, as in stock)
        _go_stock(error)
        return _stock_build(name, src, srcdir, library_dirs, include_dirs, libraries)


def _build_through_kilnd(name, src, srcdir, library_dirs, include_dirs, libraries):
    source = _files.read(src).decode()
    request = _early_launchers.request(name, source, library_dirs, include_dirs, libraries, _origin(name, source))
    response = _early_launchers.take(request)
    if response is None:
        response = _stub().BuildLauncher(request)
    if response.WhichOneof("result") == "error":
        # kilnd's compiler failed where the machine's may not: Kiln's failure.
        raise RuntimeError(f"kilnd could not build {name}: {response.error.message}\n{response.error.log}")
    path = os.path.join(srcdir, name + request.python_abi.ext_suffix)
    with open(path, "wb") as module:
        module.write(response.module.data)
    return path
