"""python -m kiln misses [--last N] [--json]: the latest compiles and what was new
for each (the kernel, its source, options, environment, Triton, an eviction)."""

import sys


def misses(last, as_json):
    import json
    import time

    from kiln.service import api as _api
    from kiln.service import connection as _service

    try:
        stub = _service.connect(autostart=False).stub
    except _service.KilnUnavailable as error:
        print(f"kilnd is not reachable: {error}", file=sys.stderr)
        return 3
    found = stub.ListMisses(_api.ListMissesRequest(last=last), timeout=10).misses
    if as_json:
        print(json.dumps([{"unix_ms": m.unix_ms, "namespace": m.namespace, "key": m.key, "kernel": m.kernel,
                           "reasons": list(m.reasons)} for m in found], indent=1))
        return 0
    for miss in found:
        when = time.strftime("%H:%M:%S", time.localtime(miss.unix_ms / 1000))
        print(f"{when}  {miss.kernel or miss.key[:16]:40}  {', '.join(miss.reasons)}")
    return 0
