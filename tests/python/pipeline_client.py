"""Builds kilnd requests from Triton's frontend output, as a client would."""

import contextlib
import json
import os
import signal
import sys
import threading
import time

from kiln.service import api as _api

import triton_frontend


def compile_request(frontend, *, triton_key=None, priority=_api.PRIORITY["PRIORITY_INTERACTIVE"], **overrides):
    target = frontend.target
    request = _api.CompileRequest(
        triton_key=triton_key or triton_frontend.toolchain_key(),
        stage=_api.STAGE["STAGE_TTIR"],
        ir=frontend.ttir,
        target=_api.Target(backend=target.backend, arch=str(target.arch), warp_size=target.warp_size),
        options_json=json.dumps(frontend.options),
        env=frontend.env,
        namespace="triton",
        cache_key=frontend.hash,
        priority=priority,
    )
    for field, value in overrides.items():
        setattr(request, field, value)
    return request


def blobs_by_name(entry):
    return {blob.name: blob.data for blob in entry.blobs}


def local_python():
    return sys.executable


@contextlib.contextmanager
def only_worker_held(kilnd, frontend):
    """kilnd's one worker stopped (SIGSTOP) with the Compile of `frontend` in
    its hands, until the block ends; then it resumes and finishes that job."""
    (worker,) = kilnd.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    held = threading.Thread(target=kilnd.stub.Compile, args=(compile_request(frontend),))
    try:
        held.start()
        deadline = time.time() + 30
        while kilnd.stats().compiles < 1 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # from counting the job to handing it to the worker: microseconds
        yield
    finally:
        os.kill(worker, signal.SIGCONT)
        held.join()
