"""python -m kiln status: is kilnd reachable, is this Python's Triton registered,
and what has the cache done.
python -m kiln misses [--last N] [--json]: the latest compiles and what was new
for each (the kernel, its source, options, environment, Triton, an eviction).
python -m kiln prewarm FILE --target cuda:89 [--target ...]: compile a bundle's
kernels (`kiln export`) for other GPUs, so their clients start warm.
python -m kiln service install|uninstall|status: kilnd as the machine's service,
from this platform wheel, with this Python registered (Windows, elevated)."""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kiln")
    parser.add_argument("command", choices=["status", "misses", "prewarm", "service"])
    parser.add_argument("file", nargs="?", help="prewarm: the bundle; service: install, uninstall or status")
    parser.add_argument("--last", type=int, default=20, help="misses: how many (at most 1000)")
    parser.add_argument("--json", action="store_true", help="misses: as JSON")
    parser.add_argument("--target", action="append", default=[], help="prewarm: a GPU to compile for, e.g. cuda:89")
    args = parser.parse_args(argv)
    if args.command == "misses":
        from kiln.commands import misses

        return misses.misses(args.last, args.json)
    if args.command == "prewarm":
        if args.file is None:
            parser.error("prewarm needs FILE")
        from kiln.commands import prewarm

        return prewarm.prewarm(args.file, args.target)
    if args.command == "service":
        if args.file not in ("install", "uninstall", "status"):
            parser.error("service needs install, uninstall or status")
        from kiln.commands import service

        return service.main(args.file)
    from kiln.commands import status

    return status.status()


if __name__ == "__main__":
    sys.exit(main())
