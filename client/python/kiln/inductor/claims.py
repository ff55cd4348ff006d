"""Single flight for inductor's graph caches: when several processes miss the
same FX graph or AOTAutograd key at once, one compiles it and the others wait
for its result, through kilnd's claims (LookupOrClaim, as Triton kernels do).

Where waiting is safe. Inductor asks its remote cache with `get`, compiles on
a miss, and stores with `put`; nothing tells the cache that a compile ended
without a `put` (the graph raised, was not cacheable, or failed to pickle). So
a miss claims its key only inside a scope that ends on every one of those
paths, and the claim ends with the scope at the latest:

- an FX graph: `torch._inductor.compile_fx._compile_fx_inner`, which looks
  the graph up, compiles it and saves it;
- an AOTAutograd graph: `aot_module_simplified`, which tries its cache,
  traces and compiles the forward (and, unless lazy, backward) graphs, and
  saves the entry. A lazily compiled backward saves later, at the first
  backward call; the claim has ended by then and waiters that find nothing
  compile themselves, their FX graphs still single flight.

A claim held while waiting on another: an AOTAutograd claim waits on FX
graphs, an FX graph (a compile) waits on nothing of these, so no two
processes can wait on each other. A claimant that dies or drops its
connection releases at once (kilnd sees its call end). While it compiles, a
thread of its own renews its claims, each at a third of the time kilnd gives
it (claim_timeout_seconds, 60 s), so a graph that takes minutes to compile is
still compiled once; kilnd stops renewals at compile_timeout_seconds (10 min)
after the claim was taken. A process stuck so that this thread cannot run
lapses after the claim timeout. Waiters then compile themselves, as does
every waiter whose claimant failed.

Autotune results: inductor reads one when it loads a kernel and writes it
after benchmarking the kernel's configs at its first run. A claim held across
that gap could make two processes wait on each other, so the miss at load
time claims nothing; the benchmark itself is the scope
(`CachingAutotuner.autotune_to_one_config`): it asks the cache again, claiming
on a miss, and a process whose claimant benchmarked meanwhile takes its
result. A benchmark waits on nothing, so this wait ends with it.
"""

import contextlib
import functools
import logging
import threading
import time

log = logging.getLogger("kiln")

_claims = {}  # key -> the open LookupOrClaim call of this process's claim on it
_renewals = {}  # key -> [when to renew it next (monotonic), renew()], for claims kilnd lets lapse
_claims_lock = threading.Condition()
_renewer = None  # the thread renewing _renewals, once one was needed
_scopes = threading.local()  # .stack: [(kind, [key claimed in that scope])], innermost last
GRAPHS = "graphs"  # a compile's scope: FX graph and AOTAutograd misses claim
AUTOTUNING = "autotuning"  # a benchmark's scope: autotune misses claim


def in_scope(kind):
    """Whether a miss of that kind of cache on this thread may claim: the
    innermost scope is of its kind, and will end the claim."""
    stack = getattr(_scopes, "stack", None)
    return bool(stack) and stack[-1][0] == kind


def hold(key, call, lapses_in=0.0, renew=None):
    """Keeps this process's claim on key until release(key) (its put) or the
    scope ends. kilnd lets the claim lapse `lapses_in` seconds from now unless
    renewed: renew() does, returning the seconds it then has left, or None
    when it is no longer this process's (0: a kilnd that does not say)."""
    global _renewer
    with _claims_lock:
        previous = _claims.pop(key, None)
        _claims[key] = call
        _renewals.pop(key, None)
        if renew is not None and 0 < lapses_in < float("inf"):
            _renewals[key] = [time.monotonic() + lapses_in / 3, renew]
            if _renewer is None:
                _renewer = threading.Thread(target=_renew_claims, name="kiln-claim-renewer", daemon=True)
                _renewer.start()
            _claims_lock.notify_all()
    if previous is not None:
        previous.cancel()
    _scopes.stack[-1][1].append(key)


def _renew_claims():
    """Renews each held claim at a third of the time it has left, for as long as it is held."""
    while True:
        with _claims_lock:
            now = time.monotonic()
            due = [(key, renew) for key, (at, renew) in _renewals.items() if at <= now]
            if not due:
                _claims_lock.wait(min((at for at, _ in _renewals.values()), default=now + 3600) - now)
                continue
        for key, renew in due:
            try:
                left = renew()
            except Exception as error:  # kilnd unreachable: the claim lapses, waiters compile
                log.debug("claim on %s not renewed: %s", key, error)
                left = None
            with _claims_lock:
                if key not in _renewals or _renewals[key][1] is not renew:
                    continue  # released (or claimed again) meanwhile
                if left is None or not 0 < left < float("inf"):
                    log.debug("claim on %s ended in kilnd while compiling it: waiters compile too", key)
                    del _renewals[key]
                else:
                    _renewals[key][0] = time.monotonic() + left / 3


def storing(key):
    """This process is storing key's entry: kilnd ends the claim once it is
    stored, so the claim is renewed no more. A renewal answered after the
    store would find it gone, and would be taken for a lapse."""
    with _claims_lock:
        _renewals.pop(key, None)


def release(key):
    """Ends this process's claim on key, if it holds one: kilnd has ended it
    already when the key was stored; otherwise its waiters look again now."""
    with _claims_lock:
        call = _claims.pop(key, None)
        _renewals.pop(key, None)
    if call is not None:
        call.cancel()


@contextlib.contextmanager
def claim_scope(kind):
    """Misses of `kind` on this thread inside it may claim; their claims end with it."""
    stack = getattr(_scopes, "stack", None)
    if stack is None:
        stack = _scopes.stack = []
    stack.append((kind, []))
    try:
        yield
    finally:
        for key in stack.pop()[1]:
            release(key)


def scoped(compile_function):
    """compile_function, ending at its exit every claim taken during it."""
    if getattr(compile_function, "_kiln_claim_scope", False):
        return compile_function

    @functools.wraps(compile_function)
    def wrapper(*args, **kwargs):
        with claim_scope(GRAPHS):
            return compile_function(*args, **kwargs)

    wrapper._kiln_claim_scope = True
    return wrapper


def _single_flight_benchmark(autotune_to_one_config):
    """CachingAutotuner.autotune_to_one_config, asking the remote autotune
    cache again first inside a claim scope: one process benchmarks, the others
    wait for and take its choice."""
    if getattr(autotune_to_one_config, "_kiln_claim_scope", False):
        return autotune_to_one_config

    @functools.wraps(autotune_to_one_config)
    def wrapper(self, *args, **kwargs):
        autotune_cache = getattr(getattr(self, "save_cache_hook", None), "__self__", None)
        remote = getattr(autotune_cache, "remote_cache", None)
        if not isinstance(remote, tuple) or len(getattr(self, "launchers", ())) < 2:
            return autotune_to_one_config(self, *args, **kwargs)
        remote_cache, key = remote
        with claim_scope(AUTOTUNING):
            best = remote_cache.get(key)
            if isinstance(best, dict):
                from torch._inductor.runtime.autotune_cache import _load_cached_autotuning

                config = _load_cached_autotuning(dict(best), autotune_cache.configs_hash,
                                                 [launcher.config for launcher in self.launchers],
                                                 self.inductor_meta)
                chosen = [launcher for launcher in self.launchers if launcher.config is config]
                if chosen:
                    log.debug("autotuning of %s taken from another process's benchmark",
                              getattr(self.fn, "__name__", "a kernel"))
                    self.launchers = chosen[:1]
                    return None
            return autotune_to_one_config(self, *args, **kwargs)

    wrapper._kiln_claim_scope = True
    return wrapper


def _scope_function(module, name):
    function = getattr(module, name, None)
    if not callable(function):
        log.debug("%s.%s not found: inductor's graphs are not single flight", module.__name__, name)
        return
    setattr(module, name, scoped(function))


def install_compile_fx(module):
    _scope_function(module, "_compile_fx_inner")


def install_aot_module_simplified(module):
    _scope_function(module, "aot_module_simplified")


def install_triton_heuristics(module):
    autotuner = getattr(module, "CachingAutotuner", None)
    benchmark = getattr(autotuner, "autotune_to_one_config", None)
    if benchmark is None:
        log.debug("CachingAutotuner.autotune_to_one_config not found: autotuning is not single flight")
        return
    autotuner.autotune_to_one_config = _single_flight_benchmark(benchmark)
