"""One client process of bench/compile_bench.py: compiles the kernel suite for
sm80 and sm90, either with stock triton.compile (its file cache pointed at an
empty directory) or through kilnd as a Kiln client does: look the Triton key up
first, and only on a miss run the frontend and send the TTIR.

usage: compile_client.py stock|kiln|startup ENDPOINT
Prints the seconds the compile loop took (start-up excluded); "startup" only
starts, to measure what every client process costs before compiling."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

import kernel_suite  # noqa: E402
import triton_frontend  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

TARGETS = [GPUTarget("cuda", 80, 32), GPUTarget("cuda", 90, 32)]


def stock():
    import triton
    from triton.compiler.compiler import ASTSource

    for case in kernel_suite.SUITE:
        for target in TARGETS:
            triton.compile(ASTSource(case.fn, case.signature, case.constexprs), target=target, options=case.options)


def kiln(endpoint):
    import grpc

    from kiln.service import api as _api
    from pipeline_client import compile_request

    stub = _api.KilnStub(grpc.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", -1)]))
    for case in kernel_suite.SUITE:
        for target in TARGETS:
            key = triton_frontend.cache_key(case, target)
            if stub.Lookup(_api.LookupRequest(namespace="triton", key=key, wait_for_compile=True)).found:
                continue
            response = stub.Compile(compile_request(triton_frontend.run_frontend(case, target)))
            assert response.WhichOneof("result") == "entry", response.error


def main():
    # What every process that uses Triton pays before its first compile, stock
    # or not, happens before the clock starts: imports, and triton_key() (a
    # hash of Triton's sources and libtriton).
    import grpc  # noqa: F401
    import triton  # noqa: F401
    from triton.runtime.cache import triton_key

    triton_key()

    start = time.perf_counter()
    if sys.argv[1] == "stock":
        stock()
    elif sys.argv[1] == "kiln":
        kiln(sys.argv[2])
    print("%.3f" % (time.perf_counter() - start))


if __name__ == "__main__":
    main()
