"""What Kiln's compile threads (kiln/local/compile_threads.py) report to
kilnd's stats, in one process: how many compiles ran ahead, and the time they
saved against one after another. test_autotune_ahead and test_inductor_threads
see the reports arrive in kilnd; what the time saved adds up from is here,
where the compiles' lengths are known rather than up to the machine's load."""

import threading
import time

from kiln.local import compile_threads


def test_the_time_saved_is_what_the_compiles_cost_alone_less_the_wall_time_they_took_together():
    both_started = threading.Barrier(2)

    def compile_in_kilnd():
        compile_threads.python_part_done()  # as the stages hook does: the next may take its turn
        compile_threads.note_remote_seconds(1.0)  # the stage seconds kilnd's workers report
        both_started.wait(timeout=10)
        time.sleep(0.2)

    compile_threads.take_unreported()
    begun = time.perf_counter()
    for compiling in [compile_threads.submit(compile_in_kilnd) for _ in range(2)]:
        compiling.result()
    wall = time.perf_counter() - begun
    compiles, saved = compile_threads.take_unreported()
    # Alone: 1 s each in kilnd plus a little CPU here; together: about 0.2 s.
    assert compiles == 2
    assert 2.0 - wall < saved < 2.0 - 0.2 + 0.1, (saved, wall)
    assert compile_threads.take_unreported() == (0, 0.0)  # reported once


def test_a_compile_that_fails_is_counted_and_its_error_reaches_the_caller():
    def failing():
        compile_threads.python_part_done()
        compile_threads.note_remote_seconds(0.3)
        time.sleep(0.3)  # kilnd's worker, until it failed
        raise ValueError("the kernel's own error")

    compile_threads.take_unreported()
    failed = compile_threads.submit(failing)
    try:
        failed.result()
    except ValueError as error:
        assert str(error) == "the kernel's own error"
    else:
        raise AssertionError("the error did not reach the caller")
    compiles, saved = compile_threads.take_unreported()
    assert compiles == 1 and saved < 0.05  # alone: it took as long as it cost
