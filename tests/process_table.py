"""The processes running now, as Linux /proc shows them: what tests and
benchmarks read to find the processes a kilnd started (its workers, their
ptxas, the inductor fork server and its children) and the CPU they used.
Importable on Windows (client_probe.py runs there too); only Linux calls it."""

import os
from pathlib import Path
from typing import NamedTuple


class Process(NamedTuple):
    parent: int
    # utime, stime, cutime and cstime: its own CPU and that of the children it
    # has waited for, which holds every process under it that has ended.
    cpu_ticks: int
    command_line: bytes


def running():
    """{pid: Process} of the processes running now."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command_line = (entry / "cmdline").read_bytes()
        except OSError:  # it ended meanwhile: its parent's waited-for time has it
            continue
        table[int(entry.name)] = Process(int(fields[1]), sum(int(value) for value in fields[11:15]), command_line)
    return table


def tree(root, table):
    """`root` and every process of `table` under it, breadth first."""
    found = [root]
    for parent in found:  # grows as it goes
        found += [pid for pid, process in table.items() if process.parent == parent]
    return found


def tree_cpu_seconds(root):
    """CPU `root` and every process under it have used so far, those that
    have ended included."""
    table = running()
    return sum(table[pid].cpu_ticks for pid in tree(root, table) if pid in table) / os.sysconf("SC_CLK_TCK")
