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
connection releases at once (kilnd sees its call end); one alive but stuck
lapses after kilnd's claim timeout (60 s), after which waiters compile
themselves, as does every waiter whose claimant failed.

Autotune results are not claimed: inductor reads them when it loads a kernel
and writes them after the kernel's first run, and a claim held across that gap
could make two processes wait on each other.
"""

import functools
import logging
import threading

log = logging.getLogger("kiln")

_claims = {}  # key -> the open LookupOrClaim call of this process's claim on it
_claims_lock = threading.Lock()
_scopes = threading.local()  # .stack: [[key claimed in that scope]], innermost last


def in_scope():
    """Whether a miss on this thread may claim: some scope will end its claim."""
    return bool(getattr(_scopes, "stack", None))


def hold(key, call):
    """Keeps this process's claim on key until put_done(key) or the scope ends."""
    with _claims_lock:
        previous = _claims.pop(key, None)
        _claims[key] = call
    if previous is not None:
        previous.cancel()
    _scopes.stack[-1].append(key)


def release(key):
    """Ends this process's claim on key, if it holds one: kilnd has ended it
    already when the key was stored; otherwise its waiters look again now."""
    with _claims_lock:
        call = _claims.pop(key, None)
    if call is not None:
        call.cancel()


def scoped(compile_function):
    """compile_function, ending at its exit every claim taken during it."""
    if getattr(compile_function, "_kiln_claim_scope", False):
        return compile_function

    @functools.wraps(compile_function)
    def wrapper(*args, **kwargs):
        stack = getattr(_scopes, "stack", None)
        if stack is None:
            stack = _scopes.stack = []
        stack.append([])
        try:
            return compile_function(*args, **kwargs)
        finally:
            for key in stack.pop():
                release(key)

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


def install_aot_autograd(module):
    _scope_function(module, "aot_module_simplified")


def install_dynamo_backends_common(module):
    # It imports aot_module_simplified by name: its copy needs the scope too.
    _scope_function(module, "aot_module_simplified")


# Modules whose functions get a claim scope, each right after it is imported.
INSTALLERS = {
    "torch._inductor.compile_fx": install_compile_fx,
    "torch._functorch.aot_autograd": install_aot_autograd,
    "torch._dynamo.backends.common": install_dynamo_backends_common,
}
