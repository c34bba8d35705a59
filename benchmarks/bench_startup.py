"""What starting blobsvc costs: whole processes, each against the bare interpreter, same run.

Every round runs, one after another, ``python -c "import asyncio"`` (the floor: the
interpreter with the event loop every command needs), ``blobsvc --version``, ``blobsvc
--help``, ``import blobsvc``, ``import blobsvc.client``, ``import blobsvc.spark`` and
``blobsvc stat KEY`` against a ``blobsvc serve`` child holding that blob. With ``--before
DIR`` (a tree holding an older ``blobsvc/`` package, e.g. ``git archive <commit> blobsvc |
tar -x -C DIR``) each command runs a second time per round with ``PYTHONPATH=DIR``, so old
and new share the round's load. Interleaving spreads a shared machine's load over all of
them alike; medians and the median of each round's difference to the floor are quoted.

    .venv/bin/python -m benchmarks.bench_startup --rounds 20
    .venv/bin/python -m benchmarks.bench_startup --quick    # a smoke run
    .venv/bin/python -m benchmarks.bench_startup --rounds 20 --before /tmp/blobsvc-old

One JSON object per command on stdout (wall-clock and CPU seconds, the CPU of the child alone),
with the load average before and after.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._serve import serve

FLOOR = "import asyncio"


def commands(server: str, key: str) -> dict[str, list[str]]:
    python = sys.executable
    blobsvc = [python, "-c", "import sys; from blobsvc.cli import main; sys.argv[0] = 'blobsvc'; sys.exit(main())"]
    return {
        "floor": [python, "-c", FLOOR],
        "blobsvc --version": [*blobsvc, "--version"],
        "blobsvc --help": [*blobsvc, "--help"],
        "import blobsvc": [python, "-c", "import blobsvc"],
        "import blobsvc.client": [python, "-c", "import blobsvc.client"],
        "import blobsvc.spark": [python, "-c", "import blobsvc.spark"],
        "blobsvc stat KEY": [*blobsvc, "stat", "-s", server, key],
    }


def seconds(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock seconds and CPU seconds (user + system) of one whole process."""
    started = time.perf_counter()
    # From the root directory: "python -c" puts the working directory first on sys.path.
    child = subprocess.Popen(argv, env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise subprocess.CalledProcessError(child.returncode, argv)
    return wall, usage.ru_utime + usage.ru_stime


def _package_dir() -> Path:
    spec = importlib.util.find_spec("blobsvc")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def summary(name: str, tree: str, runs: list[tuple[float, float]], floor: list[tuple[float, float]]) -> dict[str, Any]:
    walls, cpus = [wall for wall, _ in runs], [cpu for _, cpu in runs]
    return {
        "bench": "startup",
        "command": name,
        "tree": tree,
        "rounds": len(runs),
        "median_s": round(statistics.median(walls), 4),
        "min_s": round(min(walls), 4),
        "over_floor_median_s": round(statistics.median(r[0] - f[0] for r, f in zip(runs, floor, strict=True)), 4),
        # CPU seconds, which a busy machine inflates less than wall-clock ones.
        "cpu_median_s": round(statistics.median(cpus), 4),
        "cpu_over_floor_median_s": round(statistics.median(r[1] - f[1] for r, f in zip(runs, floor, strict=True)), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--before", type=Path, help="a tree holding an older blobsvc/ package, run alongside")
    parser.add_argument("--quick", action="store_true", help="one round: a smoke run, not a measurement")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    trees = {"this": str(_package_dir().parent)}
    if args.before is not None:
        trees["before"] = str(args.before.resolve())
    for root in trees.values():
        compileall.compile_dir(Path(root, "blobsvc"), quiet=1)  # as installed: bytecode cached, not compiled each run
    load_before = os.getloadavg()
    with serve() as server, tempfile.NamedTemporaryFile() as blob:
        blob.write(os.urandom(4096))
        blob.flush()
        put = [sys.executable, "-m", "blobsvc", "put", "-s", server, blob.name]
        key = subprocess.run(put, check=True, capture_output=True, text=True).stdout.strip()
        argvs = commands(server, key)
        times: dict[tuple[str, str], list[tuple[float, float]]] = {(n, t): [] for n in argvs for t in trees}
        for _ in range(args.rounds):
            for tree, root in trees.items():
                env = {**os.environ, "PYTHONPATH": root}
                for name, argv in argvs.items():
                    times[name, tree].append(seconds(argv, env))
    load_after = os.getloadavg()
    for (name, tree), runs in times.items():
        record = summary(name, tree, runs, times["floor", tree])
        record["loadavg_before"], record["loadavg_after"] = load_before, load_after
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
