"""Streams in and out: a pipe is spooled so a broken PUT can be retried; ``get_into`` writes
to a stream as bytes arrive and refuses to start over on one."""

from __future__ import annotations

import asyncio
import io
import os
import threading

import pytest

from blobsvc import AsyncBlobClient, BlobServer, DigestMismatch

from .conftest import CuttingProxy


async def test_a_put_from_a_pipe_is_retried_after_a_cut(server: BlobServer) -> None:
    data = bytes(range(256)) * 8192  # 2 MiB
    read_end, write_end = os.pipe()

    def feed() -> None:
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    # The first connection is cut right after the server's preamble, mid-upload.
    async with (
        CuttingProxy(server.address, cuts=1, after=6) as address,
        AsyncBlobClient(address, retries=2, backoff=0.01, timeout=5.0) as client,
    ):
        with os.fdopen(read_end, "rb") as pipe:
            key = await client.put(pipe)
        assert await client.get(key) == data
    feeder.join(10)


async def test_get_into_writes_a_verified_blob_to_a_stream(server: BlobServer) -> None:
    data = os.urandom(3 << 20)
    async with AsyncBlobClient(server.address, retries=2, backoff=0.01) as client:
        key = await client.put(data)
        out = io.BytesIO()
        info = await client.get_into(out, key)
    assert out.getvalue() == data
    assert info.key == key


async def test_get_into_cannot_start_over_when_the_blob_changes_mid_read(server: BlobServer) -> None:
    """The name is replaced while the first connection is cut: a file would start over,
    a stream (whose first bytes are gone) fails instead."""
    job, old, new = "0" * 32, os.urandom(1 << 20), os.urandom(1 << 20)

    async def replace_blob() -> None:
        async with AsyncBlobClient(server.address) as other:
            await other.put(new, job=job, name="n")

    async with AsyncBlobClient(server.address) as client:
        await client.put(old, job=job, name="n")
    async with (
        CuttingProxy(server.address, cuts=1, after=300_000, on_cut=replace_blob) as address,
        AsyncBlobClient(address, retries=2, backoff=0.01) as client,
    ):
        with pytest.raises(DigestMismatch, match="cannot start over"):
            await client.get_into(io.BytesIO(), job=job, name="n")


async def test_a_cancelled_put_from_a_pipe_stops_reading_it(server: BlobServer) -> None:
    """A pipe that never ends is spooled chunk by chunk: once the PUT is cancelled, at most the
    chunk being read is taken, and then nobody drains the pipe any more (its writer finds it
    full) instead of copying it into $TMPDIR until it ends."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    os.write(write_end, b"x" * 4096)
    async with AsyncBlobClient(server.address, retries=0) as client:
        with os.fdopen(read_end, "rb") as pipe:
            put = asyncio.ensure_future(client.put(pipe))
            await asyncio.sleep(0.2)
            put.cancel()
            with pytest.raises(asyncio.CancelledError):
                await put
            offered, written = 16 << 20, 0
            for _ in range(200):  # up to 2 s of offering bytes to whoever reads the pipe
                try:
                    written += os.write(write_end, b"y" * 65536)
                except BlockingIOError:
                    await asyncio.sleep(0.01)
                if written >= offered:
                    break
            os.close(write_end)  # the read in hand ends; the spool is gone with the PUT
    # One chunk in hand (1 MiB) plus the pipe's buffer, not the 16 MiB a drain would take.
    assert written < 4 << 20
