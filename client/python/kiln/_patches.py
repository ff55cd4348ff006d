"""Every change Kiln makes to a module of Triton or torch: (the module, the
installer that changes it, as "kiln module:function"). An installer's module
is imported only once the module it changes is (_after_import), so an
interpreter under KILN=1 imports nothing of Kiln's at start but this table."""

TRITON = (
    # What stock works out again in every process, remembered across processes.
    ("triton.runtime.cache", "kiln.triton.memos:install_triton_key"),
    ("triton.compiler.compiler", "kiln.triton.memos:install_triton_key"),  # Triton 3.4
    ("triton.knobs", "kiln.triton.memos:install_tool_versions"),
    ("triton.backends.nvidia.compiler", "kiln.triton.memos:install_ptxas_version"),
    ("triton.runtime.build", "kiln.triton.memos:install_platform_key"),
    # ... and computed on a thread as Triton imports (after install_tool_versions).
    ("triton.knobs", "kiln.triton.memos:prefetch"),
    ("triton", "kiln.triton.memos:note_triton_imported"),
    # Kernels of one launcher source share the module loaded first.
    ("triton.backends.nvidia.driver", "kiln.triton.loaded_launchers:install"),
    # Kernels from Kiln's cache read their IR texts only when asked.
    ("triton.compiler.compiler", "kiln.triton.deferred_texts:install"),
    # What generated a launcher's source, which kilnd builds it from.
    ("triton.backends.nvidia.driver", "kiln.triton.launcher_origin:follow"),
    # Modules are built by kilnd even in a process that has not activated Kiln.
    ("triton.knobs", "kiln.triton.build_hook:install"),
    # Kiln's stages, in place wherever Triton compiles (Triton 3.6).
    ("triton.knobs", "kiln.triton.stages_hook:install"),
    # The user's kilnd started while the program still starts.
    ("triton.runtime.jit", "kiln.service.early_start:install"),
    # Decisions made by timing, timed with no compile of Kiln's running Python beside
    # them (inductor's benchmarkers too: Kiln's threads compile for both).
    ("triton.testing", "kiln.local.timed_regions:install_triton_testing"),
    ("torch._inductor.runtime.benchmarking", "kiln.local.timed_regions:install_inductor_benchmarking"),
    # An autotuned kernel's configs compiled at once.
    ("triton.runtime.autotuner", "kiln.triton.autotune_ahead:install"),
)

INDUCTOR = (
    # What stock works out again in every process, remembered across processes.
    ("torch._inductor.codecache", "kiln.inductor.memos:install_torch_key"),
    # kilnd as the store behind inductor's remote caches.
    ("torch._inductor.remote_cache", "kiln.inductor.caches:install"),
    # Misses compiled once across processes: a claim scope around each compile.
    ("torch._inductor.runtime.triton_heuristics", "kiln.inductor.claims:install_triton_heuristics"),
    ("torch._inductor.compile_fx", "kiln.inductor.claims:install_compile_fx"),
    ("torch._functorch.aot_autograd", "kiln.inductor.claims:install_aot_module_simplified"),
    # It imports aot_module_simplified by name: its copy needs the scope too.
    ("torch._dynamo.backends.common", "kiln.inductor.claims:install_aot_module_simplified"),
    # No compile workers for a process whose graphs all come from the cache.
    ("torch._inductor.async_compile", "kiln.inductor.pool:install_async_compile"),
    # A graph's Triton kernels compiled at once, in Kiln's threads, as each is generated.
    ("torch._inductor.async_compile", "kiln.inductor.threads:install"),
    ("torch._inductor.codegen.triton", "kiln.inductor.threads:install_codegen"),
    ("torch._functorch._aot_autograd.autograd_cache", "kiln.inductor.pool:install_autograd_cache"),
    ("torch._inductor.compile_fx", "kiln.inductor.pool:install_compile_fx"),
)
