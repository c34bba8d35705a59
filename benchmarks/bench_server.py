"""Throughput benchmark of a real ``blobsvc serve`` child process, against raw-socket baselines
measured in the same run on the same machine.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_server            # the full run (about a minute)
    .venv/bin/python -m benchmarks.bench_server --quick    # a smoke test (a few seconds)

Every measurement is printed as one JSON object per line on stdout, ending with a line
``{"summary": {...}, "targets_met": {...}}``. Throughput is in MB/s with MB = 10**6 bytes.

What is measured (see benchmarks/RESULTS.md for figures and what limits each):

* ``baseline_sendfile``: a child process ``os.sendfile``-s the source file into a loopback
  socket; this process reads it with ``recv_into`` into a preallocated buffer. The ceiling of
  a GET.
* ``baseline_write_fsync``: the same sender; this process receives into a 1 MiB buffer,
  ``os.write``-s each piece to a file and fsyncs it at the end. The reference for a PUT.
* ``baseline_read_send``: ``baseline_sendfile`` with the sender doing ``pread`` + ``sendall``
  of 1 MiB chunks instead: what a well-made copy path could do.
* ``put_<size>`` / ``get_<size>``: one large blob through the server, driven by a lean
  client that speaks the protocol with :mod:`blobsvc.wire._protocol` and moves the body exactly as
  the baselines do (``os.sendfile`` up, ``recv_into`` a preallocated buffer down), so the
  ratio to the baseline is the server's own cost. Each PUT stores a new object (the blob is
  deleted before it); the GET's bytes are hashed and checked afterwards.
* ``get_<size>_copy``: the same GET from a server whose ``INLINE_READ_LIMIT`` is raised so
  that it reads the body and sends it with its header instead of using ``sendfile``.
* ``client_put_<size>`` / ``client_get_<size>``: the same transfers through
  :class:`blobsvc.AsyncBlobClient` (hashing, verification, buffering), for reference.
* ``put_4KiB`` / ``get_4KiB``: small blobs over 8 concurrent connections, one request in
  flight on each, from a single uvloop process of raw asyncio protocols (pre-encoded
  requests, replies read straight into preallocated buffers). Every PUT stores a new blob;
  the GETs cycle through 1024 of them. ``get_4KiB`` takes the server's default read+send
  path. ``baseline_publish_4KiB`` makes the syscalls of publishing a new blob (write, fsync,
  rename, fsync dir, link, fsync dir) from 8 threads: what the disk allows ``put_4KiB``.
* ``get_{4KiB,64KiB,1MiB}_sendfile`` and ``get_{64KiB,1MiB}_copy``: GETs over the same 8
  connections from servers whose ``INLINE_READ_LIMIT`` forces one path for every size, to
  show where sendfile starts to pay (``get_4KiB`` is the copy figure for 4 KiB).

The server runs on a temporary data directory on the real disk (``$TMPDIR`` or /tmp when it is
not a tmpfs, otherwise ``benchmarks/out/`` in the repository; ``--tmp-dir`` chooses) and is
killed by PID at the end. Everything talks to 127.0.0.1 only; every loop is bounded in count
and in time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import cast

import blake3

from blobsvc.bench._measure import (
    ALWAYS_COPY,
    ALWAYS_SENDFILE,
    CONNECTIONS,
    IO_TIMEOUT,
    BenchError,
    RawClient,
    ServerProcess,
    Stopwatch,
    Throughput,
    Timing,
    baseline_publish,
    baseline_transfer,
    choose_tmp_parent,
    emit,
    filesystem_of,
    machine,
    make_source,
    measure,
    ratio_record,
    receive_write_fsync,
    recv_into_all,
    run_async,
    running_server,
    server_get,
    server_put,
    size_label,
    small_gets,
    small_puts,
)
from blobsvc.client import AsyncBlobClient

# What other benchmarks import from here (some of it lives in blobsvc.bench._measure now).
__all__ = [
    "SMALL_MAX_OPS",
    "SMALL_MAX_SECONDS",
    "SMALL_SIZE",
    "BenchError",
    "choose_tmp_parent",
    "emit",
    "machine",
    "main",
    "running_server",
    "small_gets",
    "small_puts",
]

MiB = 1 << 20
KiB = 1 << 10
REPO = Path(__file__).resolve().parent.parent

SMALL_SIZE = 4 * KiB
SWEEP_SIZES = (64 * KiB, MiB)  # GET body sizes measured on both paths, besides 4 KiB
SWEEP_SECONDS = 2.0  # duration of each of those
SWEEP_BLOBS = 32  # distinct blobs of each sweep size
SMALL_SECONDS = 5.0  # default duration of each small-op measurement
SMALL_MAX_OPS = 2_000_000  # hard cap on any small-op measurement
SMALL_MAX_SECONDS = 120.0  # hard cap when --small-ops gives a count
TARGETS = {"get_ratio": 0.70, "put_ratio": 0.60, "get_4KiB_ops_s": 5000.0}


# --- the full client, for reference -------------------------------------------------------------


def client_transfers(server: ServerProcess, source: Path, key: bytes, size: int) -> tuple[Throughput, Throughput]:
    put = Throughput(f"client_put_{size_label(size)}", size, local_sends=True)
    get = Throughput(f"client_get_{size_label(size)}", size)

    async def put_once() -> Timing:
        async with AsyncBlobClient(("127.0.0.1", server.port), timeout=IO_TIMEOUT, retries=0) as client:
            await client.delete(key.hex())
            await asyncio.to_thread(os.sync)
            watch = Stopwatch()
            stored = await client.put(source)
            timing = watch.stop()
        if stored != key.hex():
            raise BenchError("the client stored another key")
        return timing

    async def get_once() -> Timing:
        async with AsyncBlobClient(("127.0.0.1", server.port), timeout=IO_TIMEOUT, retries=0) as client:
            watch = Stopwatch()
            data = await client.get(key.hex())  # verified by the client
            timing = watch.stop()
        if len(data) != size:
            raise BenchError("the client got a short blob")
        return timing

    measure(put, lambda: cast(Timing, run_async(put_once())), server)
    measure(get, lambda: cast(Timing, run_async(get_once())), server)
    return put, get


# --- the run --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_server", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--size-mib", type=int, default=None, help="Large blob size in MiB (default 512; 8 with --quick)."
    )
    parser.add_argument(
        "--small-ops",
        type=int,
        default=None,
        help=f"4 KiB operations per small measurement (default: as many as fit in {SMALL_SECONDS:g} s; "
        "100 with --quick).",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="Runs of each large measurement; the best counts (default 5; 1 with --quick).",
    )
    parser.add_argument("--quick", action="store_true", help="Tiny sizes and counts: a smoke test, not a measurement.")
    parser.add_argument(
        "--tmp-dir", help="Parent of the temporary data directory (default: $TMPDIR or /tmp unless tmpfs)."
    )
    parser.add_argument("--keep", action="store_true", help="Keep the data directory (and the server logs).")
    args = parser.parse_args(argv)
    if args.size_mib is None:
        args.size_mib = 8 if args.quick else 512
    if args.repeat is None:
        args.repeat = 1 if args.quick else 5
    if args.size_mib < 1 or args.repeat < 1 or (args.small_ops is not None and args.small_ops < 1):
        parser.error("sizes and counts must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    size = args.size_mib * MiB
    if args.small_ops is not None:
        max_ops, max_seconds = min(args.small_ops, SMALL_MAX_OPS), SMALL_MAX_SECONDS
    elif args.quick:
        max_ops, max_seconds = 100, SMALL_MAX_SECONDS
    else:
        max_ops, max_seconds = SMALL_MAX_OPS, SMALL_SECONDS
    warmup = 20 if args.quick else 500
    if args.quick:
        sweep = (20, SMALL_MAX_SECONDS, 5)
    else:
        sweep = (max_ops, SWEEP_SECONDS if args.small_ops is None else SMALL_MAX_SECONDS, 50)

    parent = choose_tmp_parent(args.tmp_dir, REPO / "benchmarks" / "out")
    work = Path(tempfile.mkdtemp(prefix="blobsvc-bench-", dir=parent))
    mount, fs_type = filesystem_of(work)
    data_dir, source = work / "data", work / "source.bin"
    emit(
        {
            "bench": "setup",
            **machine(),
            "data_dir": str(data_dir),
            "filesystem": fs_type,
            "mount": mount,
            "size": size,
            "repeat": args.repeat,
            "connections": CONNECTIONS,
            "small_ops": args.small_ops,
            "quick": args.quick,
        }
    )
    try:
        return run(args, work, data_dir, source, size, max_ops, max_seconds, warmup, sweep)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run(
    args: argparse.Namespace,
    work: Path,
    data_dir: Path,
    source: Path,
    size: int,
    max_ops: int,
    max_seconds: float,
    warmup: int,
    sweep: tuple[int, float, int],
) -> int:
    label = size_label(size)
    sweep_ops, sweep_seconds, sweep_warmup = sweep
    key = make_source(source, size)
    buffer = bytearray(size)  # the preallocated receive buffer of every large download
    view = memoryview(buffer)
    fd = os.open(source, os.O_RDONLY)
    sink = work / "baseline.bin"
    try:
        os.pread(fd, size, 0)  # the source is in the page cache for every sender
        base_sendfile = Throughput("baseline_sendfile", size)
        base_copy = Throughput("baseline_read_send", size)
        base_write = Throughput("baseline_write_fsync", size)
        put = Throughput(f"put_{label}", size, local_sends=True)
        get = Throughput(f"get_{label}", size)
        get_copy = Throughput(f"get_{label}_copy", size)

        def write_fsync_once() -> Timing:
            sink.unlink(missing_ok=True)
            return baseline_transfer("sendfile", source, size, lambda s: receive_write_fsync(s, sink, size))

        with running_server(data_dir, work / "server.log") as server:
            for _ in range(args.repeat):  # interleaved, so that a busy moment hits both sides
                measure(base_write, write_fsync_once)
                sink.unlink(missing_ok=True)
                with RawClient(server.port) as client:
                    client.delete(key)  # every PUT stores a new object, none is a duplicate
                measure(put, lambda: server_put(server.port, fd, size, key), server)
                measure(
                    base_sendfile,
                    lambda: baseline_transfer("sendfile", source, size, lambda s: recv_into_all(s, view)),
                )
                measure(get, lambda: server_get(server.port, key, view), server)
                if blake3.blake3(buffer, max_threads=blake3.blake3.AUTO).digest() != key:
                    raise BenchError("the GET body does not hash to its key")
            emit(base_sendfile.record())
            emit(base_write.record())
            emit(ratio_record(put, base_write, TARGETS["put_ratio"]))
            emit(ratio_record(get, base_sendfile, TARGETS["get_ratio"], path="sendfile"))

            small_put, keys = small_puts(server, SMALL_SIZE, max_ops, max_seconds, warmup)
            publish = baseline_publish(work / "publish", SMALL_SIZE, max_ops, max_seconds)
            emit(publish.record("baseline_publish_4KiB"))
            publish_ops = publish.ops / publish.seconds
            emit(
                small_put.record(
                    "put_4KiB",
                    baseline="baseline_publish_4KiB",
                    ratio=round(small_put.ops / small_put.seconds / publish_ops, 3),
                )
            )
            small_get = small_gets(server, keys, SMALL_SIZE, max_ops, max_seconds, warmup)
            get_4k_ops = small_get.ops / small_get.seconds
            emit(
                small_get.record(
                    "get_4KiB",
                    path="read+send",
                    target_ops_s=TARGETS["get_4KiB_ops_s"],
                    target_met=get_4k_ops >= TARGETS["get_4KiB_ops_s"],
                )
            )
            client_put, client_get = client_transfers(server, source, key, size)
            emit(ratio_record(client_put, base_write, TARGETS["put_ratio"], client="AsyncBlobClient"))
            emit(ratio_record(client_get, base_sendfile, TARGETS["get_ratio"], client="AsyncBlobClient"))
            sweep_keys = {body: small_puts(server, body, SWEEP_BLOBS, SMALL_MAX_SECONDS, 0)[1] for body in SWEEP_SIZES}

        with running_server(data_dir, work / "server-sendfile.log", ALWAYS_SENDFILE) as server:
            small_get_sendfile = small_gets(server, keys, SMALL_SIZE, max_ops, max_seconds, warmup)
            emit(small_get_sendfile.record("get_4KiB_sendfile", path="sendfile", inline_read_limit=ALWAYS_SENDFILE))
            for body, body_keys in sweep_keys.items():
                result = small_gets(server, body_keys, body, sweep_ops, sweep_seconds, sweep_warmup)
                emit(
                    result.record(
                        f"get_{size_label(body)}_sendfile", path="sendfile", inline_read_limit=ALWAYS_SENDFILE
                    )
                )

        with running_server(data_dir, work / "server-copy.log", ALWAYS_COPY) as server:
            for _ in range(args.repeat):
                measure(
                    base_copy,
                    lambda: baseline_transfer("read_send", source, size, lambda s: recv_into_all(s, view)),
                )
                measure(get_copy, lambda: server_get(server.port, key, view), server)
            emit(ratio_record(base_copy, base_sendfile, TARGETS["get_ratio"]))
            emit(
                ratio_record(
                    get_copy, base_sendfile, TARGETS["get_ratio"], path="read+send", inline_read_limit=ALWAYS_COPY
                )
            )
            for body, body_keys in sweep_keys.items():
                result = small_gets(server, body_keys, body, sweep_ops, sweep_seconds, sweep_warmup)
                emit(result.record(f"get_{size_label(body)}_copy", path="read+send", inline_read_limit=ALWAYS_COPY))
    finally:
        os.close(fd)

    get_ratio, put_ratio = get.best / base_sendfile.best, put.best / base_write.best
    targets_met = {
        f"get_{label}": get_ratio >= TARGETS["get_ratio"],
        f"put_{label}": put_ratio >= TARGETS["put_ratio"],
        "get_4KiB": get_4k_ops >= TARGETS["get_4KiB_ops_s"],
    }
    emit(
        {
            "summary": {
                "baseline_sendfile_MB_s": round(base_sendfile.best, 1),
                "baseline_write_fsync_MB_s": round(base_write.best, 1),
                "baseline_read_send_MB_s": round(base_copy.best, 1),
                f"get_{label}_MB_s": round(get.best, 1),
                f"get_{label}_ratio": round(get_ratio, 3),
                f"get_{label}_copy_MB_s": round(get_copy.best, 1),
                f"put_{label}_MB_s": round(put.best, 1),
                f"put_{label}_ratio": round(put_ratio, 3),
                "get_4KiB_ops_s": round(get_4k_ops, 1),
                "get_4KiB_sendfile_ops_s": round(small_get_sendfile.ops / small_get_sendfile.seconds, 1),
                "put_4KiB_ops_s": round(small_put.ops / small_put.seconds, 1),
                "baseline_publish_4KiB_ops_s": round(publish_ops, 1),
                f"client_get_{label}_MB_s": round(client_get.best, 1),
                f"client_put_{label}_MB_s": round(client_put.best, 1),
                "targets": TARGETS,
            },
            "targets_met": targets_met,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
