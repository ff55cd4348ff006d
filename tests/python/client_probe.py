"""A process that uses Triton the way an application does, for the client tests.
Kiln is active only if the environment (KILN=1 via the .pth) or `--enable` says so.

usage: client_probe.py suite|suite-sm80|suite-sm89|suite-sm90|first|first-sm80|ptxas-error|launcher LIBCUDA_DIR|launchers|early-launcher|spawn-child|
                       autotune-warmup|autotune-warmup-failing|autotune-benchmarks|autotune-timed|
                       unloadable-launcher put|build LIBCUDA_DIR|
                       deferred-texts|text-gone|hit-gone evicted|deleted|
                       frontend-error|device-dependent|
                       where-warning|override FILE|put-file [--enable | --disable] [--as-inductor]
                       [--note-client-import FILE] [--kill-kilnd-at METHOD[,METHOD...][@SECONDS] PID]
Prints one JSON object on stdout."""

import contextlib
import hashlib
import io
import json
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import compiler as triton_compiler  # noqa: E402

import kernel_suite  # noqa: E402
import process_table  # noqa: E402

frontend_runs = 0
frontend_threads = set()  # names of the threads the frontend ran in
frontend_windows = []  # (began, ended, thread name) of each frontend run
_make_ir = triton_compiler.ASTSource.make_ir


def _counting_make_ir(self, *args, **kwargs):
    global frontend_runs
    frontend_runs += 1
    thread = threading.current_thread().name.rsplit("_", 1)[0]
    frontend_threads.add(thread)
    began = time.monotonic()
    try:
        return _make_ir(self, *args, **kwargs)
    finally:
        frontend_windows.append((began, time.monotonic(), thread))


triton_compiler.ASTSource.make_ir = _counting_make_ir


def digest(value):
    return hashlib.sha256(value if isinstance(value, bytes) else value.encode()).hexdigest()


def suite(cases=None, arches=(80, 90)):
    kernels = {}
    for case in cases or kernel_suite.SUITE:
        for arch in arches:
            kernel = triton.compile(triton_compiler.ASTSource(case.fn, case.signature, case.constexprs),
                                    target=GPUTarget("cuda", arch, 32), options=case.options)
            metadata = kernel.metadata._asdict()
            metadata["target"] = list(metadata["target"].__dict__.values())
            kernels[f"{case.name}-sm{arch}"] = {
                "asm": {ext: digest(kernel.asm[ext]) for ext in ("ttir", "ttgir", "llir", "ptx", "cubin")},
                "asm_keys": asm_keys(kernel),
                "metadata": metadata,
            }
    return {"kernels": kernels}


def asm_keys(kernel):
    """The keys of kernel.asm in order, but "source" (the frontend's module,
    which a kernel compiled by a Triton process has, and one compiled by a
    plain Compile call of the SDK has not)."""
    return [key for key in kernel.asm if key != "source"]


def ptxas_error():
    case = kernel_suite.Case("bad", kernel_suite.add_kernel, kernel_suite.SUITE[0].signature, {"BLOCK": 32},
                             {"ptx_options": "--no-such-ptxas-flag"})
    try:
        triton.compile(triton_compiler.ASTSource(case.fn, case.signature, case.constexprs),
                       target=GPUTarget("cuda", 90, 32), options=case.options)
    except Exception as error:  # the test checks the type by name
        return {"raised": type(error).__name__, "message": str(error)[:500]}
    return {"raised": None}


def launcher(libcuda_dir):
    """`libcuda_dir` "triton": where the Triton driver itself looks (triton-windows: cuda.lib's folder)."""
    from triton.backends.nvidia import driver
    from triton.runtime.build import compile_module_from_src

    # As in Triton, where a kernel's compile (its cache lookup first) comes
    # before the launcher of a kernel is made.
    suite(kernel_suite.SUITE[:1], (90,))

    library_dirs = driver.library_dirs() if libcuda_dir == "triton" else [libcuda_dir]
    if hasattr(driver, "make_launcher"):
        name = "__triton_launcher"
        source = driver.make_launcher({(4,): 1024}, {0: "*fp32", 1: "*fp32", 2: "*fp32", 3: "i32", 4: "constexpr"},
                                      None)
    else:  # Triton 3.7+: no launcher per kernel, one launch function in cuda_utils
        name = "cuda_utils"
        source = Path(driver.dirname, "driver.c").read_text()
    module = compile_module_from_src(src=source, name=name, library_dirs=library_dirs,
                                     include_dirs=driver.include_dirs, libraries=driver.libraries)
    return {"launch": callable(module.launch), "path": module.__file__, "kilnd_client_imported": "kiln.service.connection" in sys.modules}


def unloadable_launcher(step, libcuda_dir=None):
    """put: the suite's first kernel, and a file that is no module stored as
    the fp16 launcher's module in the cache (as a module this Python cannot
    load would be). build: that kernel, then that launcher, which Triton finds
    in the cache, fails to load, and so builds: whether kilnd's client was imported
    before the build, and how many builds reached stock's own (the machine's
    C compiler)."""
    import sysconfig

    from triton.backends.nvidia import driver
    from triton.runtime import build
    from triton.runtime.cache import get_cache_manager

    suite(kernel_suite.SUITE[:1], (90,))
    # Argument types no other test's launcher has: kilnd builds it, not finds it built.
    source = driver.make_launcher({}, {0: "*fp16", 1: "*fp16", 2: "i64"}, None)
    if step == "put":
        key = digest(source + build.platform_key())
        get_cache_manager(key).put(b"no module", f"__triton_launcher{sysconfig.get_config_var('EXT_SUFFIX')}")
        return {}
    client_before_build = "kiln.service.connection" in sys.modules
    machine_compiles = []
    stock_build = build._build

    def counting_build(*args, **kwargs):
        if triton.knobs.build.impl is None:
            machine_compiles.append(args[0])
        return stock_build(*args, **kwargs)

    build._build = counting_build
    module = build.compile_module_from_src(src=source, name="__triton_launcher", library_dirs=[libcuda_dir],
                                           include_dirs=driver.include_dirs, libraries=driver.libraries)
    return {"launch": callable(module.launch), "kilnd_client_imported_before_build": client_before_build,
            "machine_compiles": len(machine_compiles)}


def launchers():
    """Makes the launchers of three kernels with the same argument types (one
    launcher source), as Triton does when it loads each: how many times a
    module file was imported, and whether they launch through one function."""
    from triton.backends.nvidia import driver
    from triton.runtime import build

    imports = []
    load = build._load_module_from_path

    def counted(name, path):
        imports.append(path)
        return load(name, path)

    build._load_module_from_path = counted
    launch_functions = []
    for case in kernel_suite.SUITE[:3]:
        source = triton_compiler.ASTSource(case.fn, case.signature, case.constexprs)
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=case.options)
        launch_functions.append(driver.CudaLauncher(source, kernel.metadata).launch)
    return {"imports": len(imports), "one_launch_function": all(f is launch_functions[0] for f in launch_functions),
            "callable": all(callable(f) for f in launch_functions)}


def early_launcher():
    """A kernel compiled for this machine's GPU, then loaded as Triton loads
    it, and one compiled for another GPU first: how many launchers kilnd served
    while the kernels compiled, before Triton asked for any, and in all."""
    from triton.backends.nvidia import driver as nvidia
    from triton.runtime.driver import driver

    from kiln.service import api as _api
    from kiln.service import connection as _service

    class ThisMachinesGpu(nvidia.CudaDriver):
        """There is no GPU here: this stands in for the driver of an sm90, which
        compile() asks for the target of a kernel it is to run."""

        def __init__(self):
            pass

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    driver.set_active(ThisMachinesGpu())
    kilnds = _service.connect().member_stubs  # each of a fleet

    def launchers_served():
        stats = [kilnd.GetStats(_api.GetStatsRequest()) for kilnd in kilnds]
        return sum(s.launcher_builds + s.launcher_cache_hits for s in stats)

    before = launchers_served()
    # Kernels of other argument lists (a launcher's source follows from those alone).
    other, case = next(c for c in kernel_suite.SUITE if c.name.startswith("gelu")), kernel_suite.SUITE[0]
    triton.compile(triton_compiler.ASTSource(other.fn, other.signature, other.constexprs),
                   target=GPUTarget("cuda", 80, 32), options=other.options)
    source = triton_compiler.ASTSource(case.fn, case.signature, case.constexprs)
    kernel = triton.compile(source, options=case.options)  # for the target the driver names, as @triton.jit does
    deadline = time.monotonic() + 60
    while launchers_served() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    while_compiling = launchers_served() - before
    launcher = nvidia.CudaLauncher(source, kernel.metadata)
    return {"while_compiling": while_compiling, "in_all": launchers_served() - before,
            "callable": callable(launcher.launch), "target": list(kernel.metadata.target.__dict__.values())}


def _first_kernel_sm90():
    case = kernel_suite.SUITE[0]
    return triton.compile(triton_compiler.ASTSource(case.fn, case.signature, case.constexprs),
                          target=GPUTarget("cuda", 90, 32), options=case.options)


def _group_file(kernel, extension):
    return next(path for name, path in kernel.metadata_group.items() if name.endswith(f".{extension}"))


def deferred_texts():
    """The suite's first kernel for sm90, and the files of its group read (by
    extension) while it loaded, when its LLVM IR was asked for twice, and when
    its PTX was asked for after its file went away; its asm then, and pickled."""
    import os
    import pickle

    opened = []  # files opened for reading: a compile here writes its group's files first

    def note_reads(event, args):
        if event == "open":
            path, mode, flags = args
            writes = any(letter in mode for letter in "wax+") if mode is not None else flags & (os.O_WRONLY | os.O_RDWR)
            if not writes:
                opened.append(path)

    sys.addaudithook(note_reads)

    def extensions_opened(kernel, since):
        extension_of = {path: name.rsplit(".", 1)[1] for name, path in kernel.metadata_group.items()}
        return sorted(extension_of[path] for path in opened[since:] if path in extension_of)

    kernel = _first_kernel_sm90()
    at_load = extensions_opened(kernel, 0)
    mark = len(opened)
    kernel.asm["llir"], kernel.asm.get("llir")
    on_llir = extensions_opened(kernel, mark)
    os.unlink(_group_file(kernel, "ptx"))
    ptx = kernel.asm["ptx"]
    pickled = pickle.loads(pickle.dumps(kernel.asm))
    return {"at_load": at_load, "on_llir": on_llir, "ptx": digest(ptx), "asm_keys": asm_keys(kernel),
            "asm": {ext: digest(kernel.asm[ext]) for ext in ("ttir", "ttgir", "llir", "ptx", "cubin")},
            "pickled_type": type(pickled).__name__,
            "pickled": {ext: digest(pickled[ext]) for ext in ("ttir", "ttgir", "llir", "ptx", "cubin")}}


def text_gone():
    """The suite's first kernel for sm90, loaded; then, once stdin says kilnd is
    gone, its TTGIR asked for after its file went away: what that raised."""
    import os

    kernel = _first_kernel_sm90()
    print("loaded", flush=True)
    sys.stdin.readline()
    os.unlink(_group_file(kernel, "ttgir"))
    try:
        kernel.asm["ttgir"]
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error), "cubin": digest(kernel.asm["cubin"])}
    return {"error": None}


def hit_gone(how):
    """The suite's first kernel for sm90 from kilnd's files, which go (`evicted`:
    kilnd evicts every entry, as `kiln gc 0`; `deleted`: its cubin is deleted
    by hand) after the lookup found them and before the kernel loads."""
    import os

    from kiln.service import api, connection
    from kiln.triton import cache_manager

    hand_over = cache_manager.hand_over
    gone = []

    def losing_a_file(key, files):
        group = hand_over(key, files)
        if not gone:
            cubin = next(path for name, path in group.items() if name.endswith(".cubin"))
            if how == "evicted":
                connection.connect().stub.Evict(api.EvictRequest(target_bytes=0), timeout=60)
            else:
                os.unlink(cubin)
            gone.append(os.path.exists(cubin))
        return group

    cache_manager.hand_over = losing_a_file
    kernel = _first_kernel_sm90()
    return {"gone": gone, "cubin": digest(kernel.asm["cubin"]), "ptx": digest(kernel.asm["ptx"])}


def device_dependent():
    source = triton_compiler.ASTSource(kernel_suite.device_dependent_kernel, {"out_ptr": "*fp32", "BLOCK": "constexpr"},
                                       {"BLOCK": 64})
    kernel = triton.compile(source, target=GPUTarget("cuda", 80, 32))
    return {"ttir": kernel.asm["ttir"]}


def frontend_error():
    """Compiles a kernel whose frontend fails, twice; reports each attempt's time
    (the key computation, which stock pays too, and the client's start are done
    first)."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # Triton 3.4
        from triton.compiler.compiler import triton_key

    triton_key()
    if "TRITON_CACHE_MANAGER" in __import__("os").environ:
        from kiln.triton import remote as _triton  # the client's one-time start (imports, connection) is not the point

        _triton.active()
    source = triton_compiler.ASTSource(kernel_suite.frontend_error_kernel, {"x_ptr": "*fp32", "BLOCK": "constexpr"},
                                       {"BLOCK": 64})
    attempts = []
    for _ in range(2):
        start = time.perf_counter()
        try:
            triton.compile(source, target=GPUTarget("cuda", 90, 32))
            raised = None
        except Exception as error:  # the test checks the type by name
            raised = type(error).__name__
        attempts.append({"raised": raised, "seconds": time.perf_counter() - start})
    return {"attempts": attempts}


def where_warning():
    source = triton_compiler.ASTSource(kernel_suite.where_warning_kernel, {"out_ptr": "*fp32", "BLOCK": "constexpr"},
                                       {"BLOCK": 64})
    printed = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
        warnings.simplefilter("always")
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    return {"warnings": [f"{w.category.__name__}: {w.message}" for w in caught], "printed": printed.getvalue(),
            "ptx": digest(kernel.asm["ptx"])}


def override(path):
    """The first suite kernel compiled with Triton's ir_override option: the
    stages after the override's start from the file."""
    case = kernel_suite.SUITE[0]
    kernel = triton.compile(triton_compiler.ASTSource(case.fn, case.signature, case.constexprs),
                            target=GPUTarget("cuda", 90, 32), options=dict(case.options, ir_override=path))
    return {"asm": {ext: digest(kernel.asm[ext]) for ext in ("ttir", "ttgir", "llir", "ptx", "cubin")},
            "ptx_text": kernel.asm["ptx"]}


def inductor_cache(action, key):
    """Kiln's backend for inductor's remote caches: puts, or gets, one entry.
    Inductor itself is not what is tested: a stand-in remote_cache module with
    the interface Kiln hooks (torch is not installed here); the GPU machine's
    tests/gpu/inductor_warm.py runs the real one."""
    import types

    remote_cache = types.ModuleType("torch._inductor.remote_cache")

    class RemoteCacheBackend:
        def _get(self, key):
            raise NotImplementedError

    remote_cache.RemoteCacheBackend = RemoteCacheBackend
    for name in ("RemoteFxGraphCache", "RemoteAOTAutogradCache", "RemoteAutotuneCache",
                 "RemoteBundledAutotuneCache"):
        setattr(remote_cache, name, type(name, (), {"backend_override_cls": None}))
    for parent in ("torch", "torch._inductor"):
        sys.modules.setdefault(parent, types.ModuleType(parent))
    sys.modules[remote_cache.__name__] = remote_cache
    from kiln.inductor import caches as _inductor

    assert _inductor.install(remote_cache)
    backend = remote_cache.RemoteFxGraphCache.backend_override_cls()
    value = f"inductor's entry for {key}".encode()
    if action == "put":
        backend._put(key, value)
        return {"put": True}
    found = backend._get(key)
    return {"found": found == value, "kilnd_client_imported": "kiln.service.connection" in sys.modules}


def spawn_child():
    """Like inductor's compile workers: a new interpreter from sys.executable."""
    child = subprocess.run([sys.executable, __file__, "suite"], capture_output=True, text=True, check=True)
    return json.loads(child.stdout.splitlines()[-1])


def _note_client_import(path):
    """Writes to `path` if this process ever imports kilnd's client (to call
    kilnd), up to its very end (an audit hook sees imports that atexit
    handlers make)."""
    def hook(event, args):
        if event == "import" and args[0] == "kiln.service.connection" and not Path(path).exists():
            Path(path).write_text("imported")

    sys.addaudithook(hook)


def _hold_client_load():
    """Holds the import of kilnd's client (kiln.triton.remote) until the probe's
    mode has run, 60 s at most: every compile meanwhile is one that Kiln
    runs while its client loads (kiln/triton/compiled_here), however fast the
    machine. Held in the module's execution, not in a finder, which Python
    asks under its global import lock. Returns (the event that lets it go
    on, a list that has an item once the module is loaded)."""
    import importlib.abc
    import importlib.machinery
    import threading

    let_go, loaded = threading.Event(), []

    class HeldLoader(importlib.abc.Loader):
        def __init__(self, loader):
            self.loader = loader

        def create_module(self, spec):
            return self.loader.create_module(spec)

        def exec_module(self, module):
            let_go.wait(60)
            self.loader.exec_module(module)
            loaded.append(True)

    class Held(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "kiln.triton.remote":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            spec.loader = HeldLoader(spec.loader)
            return spec

    sys.meta_path.insert(0, Held())
    return let_go, loaded


def put_file():
    """What the autotuner does outside a compile: a file put through Triton's
    cache manager, and read back."""
    from triton.runtime.cache import get_cache_manager

    manager = get_cache_manager(digest("kiln put-file probe")[:52])
    path = manager.put(b'{"timings": [1.5, 2.5]}', "timings.json", binary=True)
    return {"path": path, "content": Path(path).read_text()}


class _KillingCall:
    """A kilnd method that SIGKILLs kilnd on its first call: before it, or
    `delay` seconds into it. For the latter kilnd's workers are stopped
    (SIGSTOP) first, so that the call is still in flight when kilnd dies."""

    def __init__(self, real, kilnd_pid, kill_kilnd, delay):
        self.real, self.kilnd_pid, self.kill_kilnd, self.delay = real, kilnd_pid, kill_kilnd, delay

    def _start(self):
        if self.delay is None:
            self.kill_kilnd()
            return
        import os
        import signal
        import threading

        table = process_table.running()
        workers = [pid for pid, process in table.items() if process.parent == self.kilnd_pid]
        for worker in workers:
            os.kill(worker, signal.SIGSTOP)

        def kill_kilnd_and_its_workers():
            self.kill_kilnd()
            for worker in workers:
                os.kill(worker, signal.SIGKILL)

        threading.Timer(self.delay, kill_kilnd_and_its_workers).start()

    def __call__(self, *args, **kwargs):
        self._start()
        return self.real(*args, **kwargs)

    def future(self, *args, **kwargs):
        self._start()
        return self.real.future(*args, **kwargs)


def _kill_kilnd_at(spec, pid):
    """Fault injection: kilnd (process `pid`) dies at the first call of one of
    the methods `spec` names ("Compile", "Lookup,LookupOrClaim@0.5")."""
    import os
    import signal

    from kiln.service import connection as _service

    methods, _, delay = spec.partition("@")
    killed = []

    def kill_kilnd():
        if killed:
            return
        killed.append(True)
        os.kill(pid, signal.SIGKILL)
        while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]:
            time.sleep(0.01)  # until its socket is closed

    connection_init = _service.Connection.__init__

    def connection_that_kills(self, endpoint):
        connection_init(self, endpoint)
        for method in methods.split(","):
            setattr(self.stub, method, _KillingCall(getattr(self.stub, method), pid, kill_kilnd,
                                                    float(delay) if delay else None))

    _service.Connection.__init__ = connection_that_kills


def higher_order(rounds):
    """Upstream's test_higher_order_kernel (runtime/test_cache.py), compile-only,
    `rounds` times with kernels of their own: a kernel taking a jit function,
    whose source is changed in place and back. What the frontend printed
    (tl.static_print) and how often it ran: stock prints each source's line
    once, as the third call finds the second's kernel in the cache once the JIT
    forgets it."""
    import triton.language as tl
    from triton.runtime.driver import driver

    import autotuned_kernels

    driver.set_active(autotuned_kernels.CompileOnlyDriver())
    tensor = autotuned_kernels.StandInTensor()
    printed = io.StringIO()
    for round_name in "abcdefgh"[:int(rounds)]:
        @triton.jit
        def fn_a():
            tl.static_print("Compiling with fn_a in round ?")
            return 0

        @triton.jit
        def kernel(out_ptr, FUNC: tl.constexpr):
            tl.store(out_ptr, FUNC())

        original = fn_a.src.replace("round ?", f"round {round_name}")
        fn_a._unsafe_update_src(original)
        with contextlib.redirect_stdout(printed):
            kernel.warmup(tensor, fn_a, grid=(1, ))
            fn_a._unsafe_update_src(original.replace("with fn_a", "with fn_a after modification").replace("0", "1"))
            kernel.warmup(tensor, fn_a, grid=(1, ))
            kernel.device_caches.clear()
            kernel.warmup(tensor, fn_a, grid=(1, ))
            fn_a._unsafe_update_src(original)
            kernel.warmup(tensor, fn_a, grid=(1, ))
    return {"printed": printed.getvalue().splitlines()}


def autotune_warmup(failing=False):
    """An autotuned kernel's compile-only warmup (Autotuner.warmup) of 4
    configs for sm90, as a program precompiles before its first call: each
    config's kernel; with `failing`, one config fails a static_assert, and
    what warmup raised."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.driver import driver

    import autotuned_kernels

    ttgir_made_here = 0  # where each config's TTGIR was made: in this process, or in kilnd
    make_ttgir = CUDABackend.make_ttgir

    def counted_make_ttgir(*args, **kwargs):
        nonlocal ttgir_made_here
        ttgir_made_here += 1
        return make_ttgir(*args, **kwargs)

    CUDABackend.make_ttgir = staticmethod(counted_make_ttgir)
    driver.set_active(autotuned_kernels.CompileOnlyDriver())
    kernel = autotuned_kernels.FAILING_MATMUL if failing else autotuned_kernels.MATMUL
    tensor = autotuned_kernels.StandInTensor()
    try:
        compiled = kernel.warmup(tensor, tensor, tensor, 64, grid=(1, ))
    except Exception as error:  # what the program gets, stock or Kiln
        return {"error": type(error).__name__, "message": str(error).splitlines()[-1]}
    kernels = {}
    for config, kernel_compiled in zip(kernel.configs, compiled):
        metadata = kernel_compiled.metadata._asdict()
        metadata["target"] = list(metadata["target"].__dict__.values())
        kernels[str(config)] = {"hash": kernel_compiled.hash, "metadata": metadata,
                                "asm": {ext: digest(kernel_compiled.asm[ext])
                                        for ext in ("ttir", "ttgir", "llir", "ptx", "cubin")}}
    return {"kernels": kernels, "frontend_threads": sorted(frontend_threads), "ttgir_made_here": ttgir_made_here}


def autotune_benchmarks():
    """An autotuned kernel's first call for sm90, its 4 configs benchmarked by
    a stand-in for the GPU's timings in which two configs tie for the fastest,
    the first config's compile 4 s slower than the others':
    the configs in the order they were benchmarked, their timings in the order
    the autotuner keeps them, the config it chose, the configs the JIT
    compiled, and how the call ended (no kernel can run here: it fails as it
    launches the chosen config)."""
    from triton.runtime.driver import driver

    import autotuned_kernels

    driver.set_active(autotuned_kernels.CompileOnlyDriver())
    compile_kernel = triton.compiler.compile

    compiled = []  # (BLOCK_M, BLOCK_N) of each config the JIT compiled

    def compile_first_config_last(src, *args, **kwargs):  # the JIT's compile, 4 s late for the first config
        blocks = (src.constants.get((src.fn.arg_names.index("BLOCK_M"), )),
                  src.constants.get((src.fn.arg_names.index("BLOCK_N"), )))
        compiled.append(list(blocks))
        if blocks == (32, 32):
            time.sleep(4.0)
        return compile_kernel(src, *args, **kwargs)

    triton.compiler.compile = compile_first_config_last  # what a JIT made from now on calls
    benchmark = autotuned_kernels.StandInBenchmark({(32, 32): 3.0, (32, 64): 1.0, (64, 32): 2.0, (64, 64): 1.0})
    kernel = autotuned_kernels.autotuned_matmul(((32, 32), (32, 64), (64, 32), (64, 64)), do_bench=benchmark)
    tensor = autotuned_kernels.StandInTensor()
    try:
        kernel[(1, )](tensor, tensor, tensor, 64)
        ended = "launched"
    except Exception as error:  # the launch: no GPU here
        ended = type(error).__name__
    return {"benchmarked": benchmark.benchmarked, "timings": [[str(config), timing[0]]
                                                              for config, timing in kernel.configs_timings.items()],
            "best": str(kernel.best_config), "ended": ended, "frontend_threads": sorted(frontend_threads),
            "compiled": sorted(compiled)}


def autotune_timed():
    """An autotuned kernel of 8 configs warmed by its first call for sm90,
    each benchmark a stand-in that takes 0.15 s (as the GPU's timing would):
    how many frontend runs of Kiln's compile threads overlapped a benchmark,
    of how many, and how many benchmarks ran."""
    from triton.runtime.driver import driver

    import autotuned_kernels

    driver.set_active(autotuned_kernels.CompileOnlyDriver())
    windows = []

    def benchmark(kernel_call, quantiles):
        began = time.monotonic()
        time.sleep(0.15)
        windows.append((began, time.monotonic()))
        return [1.0] * len(quantiles)

    sizes = ((32, 32), (32, 64), (64, 32), (64, 64), (16, 32), (32, 16), (16, 64), (64, 16))
    kernel = autotuned_kernels.autotuned_matmul(sizes, do_bench=benchmark)
    tensor = autotuned_kernels.StandInTensor()
    try:
        kernel[(1, )](tensor, tensor, tensor, 64)
    except Exception:  # noqa: BLE001  (the launch: no GPU here)
        pass
    threaded = [(began, ended) for began, ended, thread in frontend_windows if thread == "kiln-compile"]
    overlapping = [window for window in threaded
                   if any(began < window[1] and window[0] < ended for began, ended in windows)]
    return {"benchmarks": len(windows), "frontends_in_threads": len(threaded), "overlapping": len(overlapping)}


def main():
    if "--kill-kilnd-at" in sys.argv:
        at = sys.argv.index("--kill-kilnd-at")
        _kill_kilnd_at(sys.argv[at + 1], int(sys.argv[at + 2]))
    if "--note-client-import" in sys.argv:
        _note_client_import(sys.argv[sys.argv.index("--note-client-import") + 1])
    if "--as-inductor" in sys.argv:
        # Only the module's name, not inductor: what Kiln decides by (whether
        # inductor is loaded in this process) is what the test checks.
        import types

        sys.modules.setdefault("torch._inductor", types.ModuleType("torch._inductor"))
    if "--enable" in sys.argv:
        import kiln

        kiln.enable()
    if "--disable" in sys.argv:
        import kiln

        kiln.disable()
    client_load = _hold_client_load() if "--hold-client-load" in sys.argv else None
    mode = sys.argv[1]
    result = {"suite": suite, "ptxas-error": ptxas_error, "spawn-child": spawn_child,
              "launcher": lambda: launcher(sys.argv[2]), "launchers": launchers,
              "unloadable-launcher": lambda: unloadable_launcher(*sys.argv[2:4]),
              "first": lambda: suite(kernel_suite.SUITE[:1], (90,)),
              "first-sm80": lambda: suite(kernel_suite.SUITE[:1], (80,)),
              "first-sm89-twice": lambda: suite(kernel_suite.SUITE[:1], (89, 89)),
              "suite-sm80": lambda: suite(arches=(80,)), "suite-sm89": lambda: suite(arches=(89,)),
              "suite-sm90": lambda: suite(arches=(90,)),
              "user-program": lambda: suite(kernel_suite.USER_PROGRAM, (90,)),
              "loops-carrying-nothing": lambda: suite(kernel_suite.LOOPS_CARRYING_NOTHING, (90,)),
              "device-dependent": device_dependent, "early-launcher": early_launcher,
              "deferred-texts": deferred_texts, "text-gone": text_gone,
              "hit-gone": lambda: hit_gone(sys.argv[2]),
              "frontend-error": frontend_error, "where-warning": where_warning,
              "override": lambda: override(sys.argv[2]), "put-file": put_file,
              "inductor-cache": lambda: inductor_cache(sys.argv[2], sys.argv[3]),
              "higher-order": lambda: higher_order(sys.argv[2]), "autotune-warmup": autotune_warmup,
              "autotune-warmup-failing": lambda: autotune_warmup(failing=True),
              "autotune-benchmarks": autotune_benchmarks, "autotune-timed": autotune_timed}[mode]()
    result["frontend_runs"] = frontend_runs
    if "--mark-done" in sys.argv:  # the kernels are compiled; what the process does at exit is still to come
        open(sys.argv[sys.argv.index("--mark-done") + 1], "w").close()
    if client_load is not None:
        let_go, loaded = client_load
        result["client_loaded_meanwhile"] = bool(loaded)
        let_go.set()
    import os

    result["cache_manager"] = os.environ.get("TRITON_CACHE_MANAGER")
    # Kiln's modules that Python's own finder loaded, not kiln._own_modules from their .pyc files.
    result["kiln_modules_by_pythons_finder"] = sorted(
        name for name, module in list(sys.modules.items())
        if name.startswith("kiln") and type(getattr(module.__spec__, "loader", None)).__name__ != "_PycLoader")
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
