"""Reads the junit XML files that tests/gpu/triton_suite.sh writes, one per mode.

  triton_suite_report.py mode NAME XML WALL_SECONDS
      one mode's counts, wall time and failed test ids
  triton_suite_report.py compare WORK_DIR DIFF_FILE MODE...
      for each kiln mode: tests failing in it but passing in stock and the reverse, and the
      wall-time ratio against stock (WORK_DIR holds MODE.xml and MODE.wall); the complete
      lists go to DIFF_FILE. Exits 1 when a kiln mode fails a test that passes in stock.

Needs nothing beyond the standard library (it also runs without Triton or a GPU).
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SHOWN = 25  # ids printed per list; DIFF_FILE has them all


def outcomes(xml_path):
    """{test id: 'passed' | 'failed' | 'skipped'}; errors (setup, teardown, collection) count as
    failed, xfail as skipped. An unreadable or missing file gives None."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    result = {}
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            state = "failed"
        elif "skipped" in tags:
            state = "skipped"
        else:
            state = "passed"
        # A test with a teardown error appears twice; failed wins.
        if result.get(test_id) != "failed":
            result[test_id] = state
    return result


def count(results):
    return {state: sum(1 for s in results.values() if s == state) for state in ("passed", "failed", "skipped")}


def show(lines, limit=SHOWN):
    for line in sorted(lines)[:limit]:
        print(f"    {line}")
    if len(lines) > limit:
        print(f"    ... and {len(lines) - limit} more")


def mode_summary(name, xml_path, wall):
    results = outcomes(xml_path)
    if results is None:
        print(f"[{name}] no junit report at {xml_path}")
        return 1
    counts = count(results)
    print(f"[{name}] {len(results)} tests: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped; wall {float(wall):.1f} s")
    failed = [t for t, s in results.items() if s == "failed"]
    if failed:
        print(f"[{name}] failed:")
        show(failed)
    return 0


def compare(work, diff_file, modes):
    work = Path(work)
    results = {m: outcomes(work / f"{m}.xml") for m in modes}
    walls = {}
    for m in modes:
        try:
            walls[m] = float((work / f"{m}.wall").read_text())
        except (OSError, ValueError):
            walls[m] = None
    print("== summary")
    for m in modes:
        if results[m] is None:
            print(f"  {m:10s} no report")
            continue
        c = count(results[m])
        wall = f"{walls[m]:.1f} s" if walls[m] is not None else "?"
        print(f"  {m:10s} {len(results[m]):6d} tests {c['passed']:6d} passed {c['failed']:5d} failed "
              f"{c['skipped']:6d} skipped  wall {wall}")
    stock = results.get("stock")
    regressions = False
    with open(diff_file, "w") as diff:
        for m in modes:
            if m == "stock" or results[m] is None:
                continue
            if stock is None:
                print(f"== {m}: no stock run to compare with")
                continue
            mine = results[m]
            worse = [t for t, s in mine.items() if s == "failed" and stock.get(t) == "passed"]
            better = [t for t, s in mine.items() if s == "passed" and stock.get(t) == "failed"]
            other = [f"{t}: stock {stock.get(t, 'absent')}, {m} {mine.get(t, 'absent')}"
                     for t in set(mine) | set(stock)
                     if stock.get(t) != mine.get(t) and t not in worse and t not in better]
            ratio = (f"{walls[m] / walls['stock']:.2f}x stock ({walls[m]:.1f} s vs {walls['stock']:.1f} s)"
                     if walls.get(m) and walls.get("stock") else "?")
            print(f"== {m} vs stock: wall {ratio}")
            print(f"  fail in {m}, pass in stock: {len(worse)}")
            show(worse)
            print(f"  pass in {m}, fail in stock: {len(better)}")
            show(better)
            if other:
                print(f"  other differences (skipped, absent): {len(other)}")
                show(other, 10)
            regressions = regressions or bool(worse)
            for title, ids in ((f"fail in {m}, pass in stock", worse), (f"pass in {m}, fail in stock", better),
                               (f"other differences, {m} vs stock", other)):
                diff.write(f"== {title}: {len(ids)}\n")
                diff.writelines(f"{t}\n" for t in sorted(ids))
        for m in modes:
            if results[m] is not None:
                failed = sorted(t for t, s in results[m].items() if s == "failed")
                diff.write(f"== failed in {m}: {len(failed)}\n")
                diff.writelines(f"{t}\n" for t in failed)
    return 1 if regressions else 0


def main(argv):
    if len(argv) == 5 and argv[1] == "mode":
        return mode_summary(argv[2], argv[3], argv[4])
    if len(argv) >= 5 and argv[1] == "compare":
        return compare(argv[2], argv[3], argv[4:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
