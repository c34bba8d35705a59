"""Unpacking a venv-pack environment of 150 MB or more: this checkout's unpacker against the
one on ``main`` (``git show main:blobsvc/cache/_extract.py``, loaded as a module of its own),
in the same run, alternating so that drift hits both alike.

The environment is what venv-pack makes: a tar.gz of some 3,000 files in a few hundred
directories of ``lib/python3.X/site-packages``, scripts in ``bin``, ``bin/python`` a link to
an absolute interpreter, ``pyvenv.cfg`` twice. Each unpack goes into a fresh directory, which
is removed (untimed) before the next.

Prints one JSON object per measurement and a summary with the ratio of the medians; exits 1
when it is over ``--max-ratio``.

    .venv/bin/python benchmarks/bench_unpack.py [--size-mib 160] [--repeat 3] [--base main] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

from blobsvc.cache import _extract
from blobsvc.cache._trees import remove_unpacked

REPO = Path(__file__).resolve().parent.parent
FILE_BYTES = 50 << 10


def environment(path: Path, size: int) -> Path:
    """A venv-pack-like tar.gz of about ``size`` bytes of files, half of each random (as
    compiled extensions are) and half text."""
    with tarfile.open(path, "w:gz", compresslevel=1) as out:
        for name, data in (("pyvenv.cfg", b"home = /usr/bin\n"), ("pyvenv.cfg", b"home = /usr/local/bin\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("bin/python")
        link.type, link.linkname = tarfile.SYMTYPE, "/usr/bin/python3"
        out.addfile(link)
        text = b"def f(x):\n    return x + 1\n" * (FILE_BYTES // 56)
        for number in range(size // FILE_BYTES):
            package = f"lib/python3.11/site-packages/pkg{number // 10}"
            data = os.urandom(FILE_BYTES // 2) + text[: FILE_BYTES // 2]
            info = tarfile.TarInfo(f"{package}/mod{number % 10}.py")
            info.size, info.mode = len(data), 0o644
            out.addfile(info, io.BytesIO(data))
    return path


def baseline(base: str, directory: Path) -> types.ModuleType:
    """``blobsvc/cache/_extract.py`` as it is on ``base``, written into ``directory``."""
    code = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{base}:blobsvc/cache/_extract.py"], capture_output=True, check=True
    ).stdout
    path = directory / "_extract_base.py"
    path.write_bytes(code)
    spec = importlib.util.spec_from_file_location("blobsvc.cache._extract_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def timed(extract: Callable[..., int], archive: Path, dest: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one unpack (the CPU's is the steadier on a shared machine)."""
    dest.mkdir()
    os.sync()  # the last tree's writeback is not this one's to pay
    started, cpu = time.perf_counter(), time.process_time()
    extract(archive, "tar", dest, environment=True, max_bytes=1 << 40)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    remove_unpacked(dest)
    return seconds, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=160)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base", default="main", help="The commit whose unpacker is the baseline.")
    parser.add_argument("--max-ratio", type=float, default=1.1)
    parser.add_argument("--dir", type=Path, default=None, help="Where the archive and the trees go.")
    parser.add_argument("--quick", action="store_true", help="4 MiB once, no target: that it runs.")
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.repeat, args.max_ratio = 4, 1, float("inf")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-unpack-") as work:
        unpackers = {"base": baseline(args.base, Path(work)).extract, "this": _extract.extract}
        times: dict[str, list[float]] = {name: [] for name in unpackers}
        cpus: dict[str, list[float]] = {name: [] for name in unpackers}
        archive = environment(Path(work) / "env.tar.gz", args.size_mib << 20)
        archive_bytes = archive.stat().st_size
        for round_ in range(args.repeat):
            for name, extract in unpackers.items():
                seconds, cpu = timed(extract, archive, Path(work) / f"tree-{name}-{round_}")
                times[name].append(seconds)
                cpus[name].append(cpu)
                record = {"unpacker": name, "round": round_, "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3)}
                print(json.dumps({"bench": "unpack", **record}), flush=True)
    base, this = statistics.median(times["base"]), statistics.median(times["this"])
    summary = {
        "bench": "unpack",
        "summary": True,
        "size_mib": args.size_mib,
        "archive_bytes": archive_bytes,
        "base_seconds": round(base, 3),
        "this_seconds": round(this, 3),
        "ratio": round(this / base, 3),
        "base_cpu_seconds": round(statistics.median(cpus["base"]), 3),
        "this_cpu_seconds": round(statistics.median(cpus["this"]), 3),
        "cpu_ratio": round(statistics.median(cpus["this"]) / statistics.median(cpus["base"]), 3),
        "max_ratio": args.max_ratio,
        "loadavg": os.getloadavg()[0],
    }
    print(json.dumps(summary), flush=True)
    return 0 if this / base <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
