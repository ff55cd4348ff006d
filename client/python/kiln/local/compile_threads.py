"""The threads that compile kernels ahead of their first use: an autotuned
kernel's configs (triton/autotune_ahead) and a torch.compile graph's Triton kernels
(inductor/threads). One pool for both, so they never add up to more threads
than it has. Each thread runs the frontend and make_ttir in this process (they
need this Python) while the stages from TTGIR to the cubin run in kilnd's
worker processes (triton/remote), or here when none of them is idle on a
machine whose cores the threads fill (compile_here_when_kilnd_is_busy).

KILN_COMPILE_THREADS sets how many (KILN_AUTOTUNE_THREADS, its first name, is
read too); the default is half the cores, 2 to 8: kilnd's workers need the
rest, and on an H100 machine of 16 cores 4 and 8 threads beat 16 to an
autotuned kernel's first result."""

import contextlib
import os
import threading
import time

_executor = None
_executor_lock = threading.Lock()

# What the threads compiled, for kilnd's stats (reported with the hits,
# _index.flush): each compile's serial cost is what it would take alone, the
# CPU time of its thread here (not its waits for the GIL or kilnd) plus the
# stage times kilnd's workers report; the time saved is those added up, less
# the wall time during which any of them was compiling.
_account = threading.Lock()
_running = 0
_busy_since = 0.0
_period = [0, 0.0]  # compiles and their serial seconds in the busy period now
_unreported = [0, 0.0]  # compiles and seconds saved, of busy periods that ended
_this_thread = threading.local()

# Turns: the Python part of a compile (the JIT's preamble, the frontend) holds
# the GIL, so compiles started together finish together, late. Taking turns in
# the order they were asked for, each runs its Python part alone and goes on
# to the stages that let go of the GIL (and to kilnd) while the next takes its
# turn: the first config is ready as soon as it would be alone, the others one
# by one after it. A turn longer than _TURN_LIMIT lets the next ones start
# anyway: turns order compiles, never hold one back for long.
_TURN_LIMIT = 1.0
_turns = threading.Condition()
_tickets_given = 0
_turn_now = 0
_turn_since = 0.0
_turns_ended = set()

# Timed regions (kiln/local/timed_regions: the autotuner's and inductor's
# benchmarks, do_bench): while one runs, no compile thread runs Python (it
# would take the GIL from the launches being timed, and tip a decision made
# by timing). A thread waits at its turn, and again once kilnd has answered;
# a region begins once the threads' Python parts under way have ended, or a
# turn's limit has passed.
_timed = 0            # regions running, guarded by _turns
_running_python = 0   # compile threads in their Python parts, guarded by _turns


def thread_count():
    asked = os.environ.get("KILN_COMPILE_THREADS") or os.environ.get("KILN_AUTOTUNE_THREADS") or "0"
    try:
        count = int(asked)
    except ValueError:
        count = 0
    return count if count > 0 else max(2, min(8, (os.cpu_count() or 4) // 2))


def compile_here_when_kilnd_is_busy():
    """Whether a compile ahead that finds every worker of kilnd's busy compiles
    in its own thread here instead of waiting (CompileRequest's
    no_wait_for_busy_workers). Where the threads fill the machine's cores (2
    threads on 2 cores) a worker kilnd would start for it costs a core the
    compiles need for about a second; elsewhere that start runs on a spare
    core, and kilnd's workers keep the compiles' GIL-bound stages out of this
    process. KILN_COMPILE_HERE_WHEN_BUSY=1 or 0 decides whatever the cores."""
    asked = os.environ.get("KILN_COMPILE_HERE_WHEN_BUSY", "")
    if asked in ("0", "1"):
        return asked == "1"
    return thread_count() >= (os.cpu_count() or 1)


def pool():
    global _executor
    with _executor_lock:
        if _executor is None:
            from concurrent.futures import ThreadPoolExecutor

            _executor = ThreadPoolExecutor(max_workers=thread_count(), thread_name_prefix="kiln-compile")
        return _executor


def submit(function, *args, after=None):
    """Runs function(*args) in the pool, accounted as one compile ahead; first,
    before its turn, after() where given (a wait for work elsewhere)."""
    return pool().submit(_accounted, function, *args, after=after)


def in_compile_thread():
    """Whether this thread is running a compile ahead."""
    return hasattr(_this_thread, "remote_seconds")


def note_remote_seconds(seconds):
    """Stage seconds kilnd's workers spent on a compile of this thread."""
    if hasattr(_this_thread, "remote_seconds"):
        _this_thread.remote_seconds += seconds


def _wait_for_turn():
    global _tickets_given, _turn_since
    with _turns:
        ticket = _tickets_given
        _tickets_given += 1
        if ticket == _turn_now:  # nobody's turn until now: it begins
            _turn_since = time.perf_counter()
        while ticket != _turn_now:
            left = _TURN_LIMIT - (time.perf_counter() - _turn_since)
            if left <= 0:
                break
            _turns.wait(left)
        _enter_python_locked()
    _this_thread.turn = ticket


def _enter_python_locked():
    """With _turns held: waits while a timed region runs, then counts this
    thread as running Python."""
    global _running_python
    while _timed:
        _turns.wait()
    _running_python += 1
    _this_thread.running_python = True


def _stop_running_python():
    """With _turns held."""
    global _running_python
    if getattr(_this_thread, "running_python", False):
        _this_thread.running_python = False
        _running_python -= 1
        _turns.notify_all()


def pause_python():
    """A compile thread about to wait on kilnd, which needs no GIL: a timed
    region need not wait for it."""
    with _turns:
        _stop_running_python()


def resume_python():
    """A compile thread about to run Python again (a stage here, or kilnd
    answered): waits while a timed region runs. Does nothing outside a
    compile thread."""
    if not in_compile_thread() or getattr(_this_thread, "running_python", False):
        return
    with _turns:
        _enter_python_locked()


@contextlib.contextmanager
def timed():
    """A region whose timing decides something: no compile thread runs
    Python in it. In a compile thread (a benchmark of its own), nothing."""
    global _timed
    if in_compile_thread():
        yield
        return
    with _turns:
        _timed += 1
        deadline = time.perf_counter() + _TURN_LIMIT
        while _running_python and (left := deadline - time.perf_counter()) > 0:
            _turns.wait(left)
    try:
        yield
    finally:
        with _turns:
            _timed -= 1
            _turns.notify_all()


def python_part_done(compile_ended=False):
    """Ends this thread's turn: its compile reached stages that let go of the
    GIL. Does nothing outside a turn, unless the compile ended: then this
    thread runs no more Python of it either (resume_python said it would)."""
    ticket = getattr(_this_thread, "turn", None)
    if ticket is None and not compile_ended:
        return
    _this_thread.turn = None
    with _turns:
        _stop_running_python()
        if ticket is not None:
            _end_turn_locked(ticket)


def end_turn():
    """Ends this thread's turn, its compile still running Python (a timed region
    waits for it): the next compile's turn begins. Does nothing outside a turn."""
    ticket = getattr(_this_thread, "turn", None)
    if ticket is None:
        return
    _this_thread.turn = None
    with _turns:
        _end_turn_locked(ticket)


def _end_turn_locked(ticket):
    global _turn_now, _turn_since
    _turns_ended.add(ticket)
    while _turn_now in _turns_ended:
        _turns_ended.remove(_turn_now)
        _turn_now += 1
        _turn_since = time.perf_counter()
    _turns.notify_all()


def has_unreported():
    return _unreported[0] > 0


def take_unreported():
    """(compiles, seconds saved) since the last call, of busy periods that ended."""
    with _account:
        taken = tuple(_unreported)
        _unreported[:] = [0, 0.0]
    return taken


def _accounted(function, *args, after=None):
    global _running, _busy_since
    begun, cpu_begun = time.perf_counter(), time.thread_time()
    _this_thread.remote_seconds = 0.0
    with _account:
        if _running == 0:
            _busy_since = begun
        _running += 1
    try:
        if after is not None:
            after()
        _wait_for_turn()
        return function(*args)
    finally:
        python_part_done(compile_ended=True)
        serial = time.thread_time() - cpu_begun + _this_thread.remote_seconds
        del _this_thread.remote_seconds
        ended = time.perf_counter()
        with _account:
            _running -= 1
            _period[0] += 1
            _period[1] += serial
            if _running == 0:
                _unreported[0] += _period[0]
                _unreported[1] += max(0.0, _period[1] - (ended - _busy_since))
                _period[:] = [0, 0.0]
