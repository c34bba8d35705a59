"""Edge cases of auth, timeouts, resumption, shutdown and a full disk, each a way blobsvc
once went wrong. Real sockets on 127.0.0.1 and real directories throughout; a few storage
calls are made slow or failing by monkeypatching (a disk cannot be made slow or full at one
exact syscall on demand), as tests/test_crash_safety.py does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import blake3
import pytest
from click.testing import CliRunner

from blobsvc import (
    AsyncBlobClient,
    BlobClient,
    BlobServer,
    BlobStorage,
    InsufficientStorage,
    ReadTimeout,
    Settings,
    TooLarge,
    new_job_id,
)
from blobsvc.cli import main
from blobsvc.storage import Publication, StagedUpload

from .conftest import CuttingProxy, assert_no_staging

HELLO = b"BLOB\x01\x00"
STEP = 5.0
MiB = 1 << 20


def digest(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


# --- 1. an empty secret file silently turns authentication off ---------------------------


@pytest.mark.parametrize("text", [b"", b"\n"])
async def test_an_empty_secret_file_does_not_silently_disable_auth(
    settings: Settings, tmp_path: Path, text: bytes
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(text)  # e.g. `touch secret` before the secret was written into it
    try:
        server = BlobServer(replace(settings, secret_file=secret))
        await server.start()
    except ValueError:
        return  # refusing to start with an unusable secret is a right answer
    try:
        reader, writer = await asyncio.open_connection(*server.address)
        try:
            writer.write(HELLO)
            await writer.drain()
            hello = await asyncio.wait_for(reader.readexactly(6), STEP)
        finally:
            writer.close()
        assert hello[5] & 1, "secret_file is set, yet the server serves anyone without AUTH"
    finally:
        await server.shutdown()


# --- 2. a PUT whose reply is slow raises a bare TimeoutError -----------------------------


async def test_a_put_reply_slower_than_the_timeout_is_a_read_timeout(
    server: BlobServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = BlobStorage.publish_batch

    def slow_publish(storage: BlobStorage, batch: Sequence[Publication]) -> list[bytes | Exception]:
        time.sleep(1.0)  # a loaded disk's fsync
        return original(storage, batch)

    monkeypatch.setattr(BlobStorage, "publish_batch", slow_publish)
    async with AsyncBlobClient(server.address, timeout=0.3, retries=0) as client:
        with pytest.raises(ReadTimeout):  # is: builtins.TimeoutError, no message, not retried
            await client.put(b"a blob whose publication is slow")


# --- 3. an early error frame is swallowed when the send then fails ------------------------


async def test_an_error_frame_received_during_a_stalled_send_is_raised_not_the_broken_pipe() -> None:
    async def refuse_then_reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # What blobsvc's server does on a slow link: TOO_LARGE right after the header, then
        # its one-second linger runs out while the client is still inside a chunk.
        await reader.readexactly(6)
        writer.write(HELLO)
        await reader.readexactly(10)  # PUT CONTENT u64 length
        message = b"over this server's limit"
        writer.write(struct.pack("<BHI", 1, 4, len(message)) + message)
        await writer.drain()
        await asyncio.sleep(0.5)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    fake = await asyncio.start_server(refuse_then_reset, "127.0.0.1", 0)
    async with fake:
        address = fake.sockets[0].getsockname()[:2]
        async with AsyncBlobClient(address, timeout=STEP, retries=0) as client:
            async with asyncio.timeout(STEP):
                with pytest.raises(TooLarge):  # is: ConnectionClosed("connection lost: ...")
                    await client.put(bytes(64 * MiB))


# --- 4. a resumed GET of a name replaced by a shorter blob ends in BadOffset -------------


async def test_a_get_resumed_after_its_name_was_replaced_by_a_shorter_blob_returns_the_new_blob(
    server: BlobServer,
) -> None:
    job, name = new_job_id(), "model.bin"
    old, new = os.urandom(4 * MiB), b"a much shorter replacement"
    async with AsyncBlobClient(server.address) as direct:
        await direct.put(old, job=job, name=name)

        async def replace_the_blob() -> None:
            await direct.put(new, job=job, name=name)

        proxy = CuttingProxy(server.address, cuts=1, after=MiB, on_cut=replace_the_blob)
        async with proxy as address, AsyncBlobClient(address, retries=2, backoff=0.01) as client:
            # is: BadOffset("offset 1048535 is past the end of a 26-byte blob"), for a plain get()
            assert await client.get(job=job, name=name) == new


# --- 5. a call's timeout= does not bound connecting and the preamble ---------------------


async def test_a_calls_timeout_also_bounds_the_servers_preamble() -> None:
    async def say_nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    silent = await asyncio.start_server(say_nothing, "127.0.0.1", 0)
    async with silent:
        address = silent.sockets[0].getsockname()[:2]
        async with AsyncBlobClient(address, timeout=60.0, retries=0) as client:
            with pytest.raises(ReadTimeout):  # is: still waiting after 3 s (the client's 60 s applies)
                async with asyncio.timeout(3.0):
                    await client.stat("0" * 64, timeout=0.3)


# --- 6. BlobClient.close() strands calls in flight on other threads forever --------------


def test_closing_a_blocking_client_does_not_strand_a_call_in_flight_forever() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            accepted.append(listener.accept()[0])  # and never answer the preamble

    threading.Thread(target=accept, daemon=True).start()
    client = BlobClient(f"127.0.0.1:{port}", timeout=2.0, retries=0)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            client.stat("0" * 64)
        except BaseException as exc:  # any end will do
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    time.sleep(0.5)  # the call waits for the server's preamble, bounded by timeout=2.0
    client.close()  # another thread of the same Spark task finishes and closes the client
    caller.join(5.0)
    try:
        assert not caller.is_alive(), "stat(timeout 2 s) has not returned after 5 s: close() stopped its loop"
    finally:
        if caller.is_alive():  # free the stranded thread: run the loop until its timeout fires
            loop = client._loop
            assert loop is not None
            threading.Thread(target=loop.run_forever, daemon=True).start()
            caller.join(STEP)
            loop.call_soon_threadsafe(loop.stop)
        for sock in accepted:
            sock.close()
        listener.close()


# --- 7. a publication that fails after storing its object leaks the object ---------------


async def test_a_put_refused_for_lack_of_space_leaves_no_orphaned_object(
    server: BlobServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(storage: BlobStorage, directory: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))

    # The disk fills between storing the object and creating the job's directory.
    monkeypatch.setattr(BlobStorage, "_make_dirs", full_disk)
    body = os.urandom(1 * MiB)
    async with AsyncBlobClient(server.address, retries=0) as client:
        with pytest.raises(InsufficientStorage):
            await client.put(body, job=new_job_id(), name="a")
    await assert_no_staging(server.settings.data_dir)
    objects = sorted(p.name for p in server.storage.layout.objects.iterdir())
    # INSUFFICIENT_STORAGE promises "nothing stored"; is: [digest(body).hex()] until a restart
    assert objects == [], "an object no name links to stays on the full disk"


# --- 8. a malformed key or job id on the command line is a traceback ---------------------


@pytest.mark.parametrize(
    "args",
    [
        ["stat", "not-a-key"],
        ["get", "--job", "not-a-job-id", "--name", "x"],
        ["delete", "--job", "1234"],
    ],
)
def test_a_malformed_key_or_job_id_is_a_one_line_error_not_a_traceback(args: list[str]) -> None:
    result = CliRunner().invoke(main, [*args, "-s", "127.0.0.1:1", "--retries", "0"])
    assert isinstance(result.exception, SystemExit), f"uncaught {result.exception!r}"
    assert result.exit_code in (1, 2) and "Error:" in result.stderr


# --- 9. a second cancellation (second Ctrl-C) leaves a thread writing a removed upload ---


async def test_abort_during_shutdown_waits_for_a_thread_writing_the_staging_file(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = threading.Event()
    used_after_discard: list[str] = []
    original_write = StagedUpload.write

    def slow_write(upload: StagedUpload, data: bytes | bytearray | memoryview) -> None:
        if len(data) >= 256 << 10:  # written by a worker thread
            started.set()
            time.sleep(0.5)  # a loaded disk
            if upload._fd is None:
                used_after_discard.append(upload.path.name)
                return
        original_write(upload, data)

    monkeypatch.setattr(StagedUpload, "write", slow_write)
    server = BlobServer(replace(settings, io_timeout=30.0, idle_timeout=30.0))
    await server.start()
    body = os.urandom(8 * MiB)
    _, writer = await asyncio.open_connection(*server.address)
    try:
        writer.write(HELLO + b"\x00\x00" + struct.pack("<Q", len(body)) + body[: 4 * MiB])
        await writer.drain()
        assert await asyncio.to_thread(started.wait, STEP)
        shutting_down = asyncio.ensure_future(server.shutdown(timeout=0.05))  # first Ctrl-C
        await asyncio.sleep(0.15)
        server.abort_requests()  # second Ctrl-C: "cancel every connection now"
        await asyncio.wait_for(shutting_down, STEP)
        await asyncio.sleep(0.6)  # a thread left running records itself by now
        assert used_after_discard == [], "a worker thread wrote to a staging file after it was removed"
    finally:
        writer.close()
        await server.shutdown()
