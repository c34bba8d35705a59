"""Small blobs served from memory never outlive their deletion or replacement."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blobsvc import AsyncBlobClient, BlobServer, NotFound, new_job_id
from blobsvc.storage._hotblobs import HotBlob, HotBlobs
from blobsvc.wire._protocol import ContentKey, JobBlob

KEY = ContentKey(bytes(32))


async def test_a_deleted_small_blob_is_not_found_after_being_served_from_memory(
    client: AsyncBlobClient, server: BlobServer
) -> None:
    key = await client.put(b"hot")
    assert await client.get(key) == b"hot"
    assert server.storage.hot.get(ContentKey(bytes.fromhex(key))) is not None  # served from memory next
    assert await client.get(key) == b"hot"
    await client.delete(key)
    with pytest.raises(NotFound):
        await client.get(key)


async def test_a_replaced_or_deleted_job_name_serves_its_new_state(client: AsyncBlobClient) -> None:
    job = new_job_id()
    await client.put(b"first", job=job, name="conf")
    assert await client.get(job=job, name="conf") == b"first"
    assert await client.get(job=job, name="conf") == b"first"
    await client.put(b"second", job=job, name="conf")
    assert await client.get(job=job, name="conf") == b"second"
    await client.delete_job(job)
    with pytest.raises(NotFound):
        await client.get(job=job, name="conf")


async def test_a_get_with_an_offset_is_served_from_memory_too(client: AsyncBlobClient, tmp_path: Path) -> None:
    data = os.urandom(1000)
    key = await client.put(data)
    assert await client.get(key) == data  # now in memory
    partial = tmp_path / "partial"
    partial.write_bytes(data[:300])
    info = await client.resume_file(partial, key)  # a GET from offset 300
    assert info.size == 1000 and partial.read_bytes() == data


def test_an_entry_read_before_a_forget_is_not_kept() -> None:
    hot = HotBlobs()
    generation = hot.generation  # a GET reads the blob...
    hot.forget(KEY)  # ...while a DELETE removes it
    hot.remember(KEY, generation, HotBlob(3, bytes(32), b"old"))
    assert hot.get(KEY) is None


def test_the_least_recently_used_go_first_beyond_the_byte_limit() -> None:
    hot = HotBlobs(max_bytes=10)
    keys = [ContentKey(bytes([i]) * 32) for i in range(3)]
    hot.remember(keys[0], 0, HotBlob(4, bytes(32), b"aaaa"))
    hot.remember(keys[1], 0, HotBlob(4, bytes(32), b"bbbb"))
    assert hot.get(keys[0]) is not None  # now the most recent
    hot.remember(keys[2], 0, HotBlob(4, bytes(32), b"cccc"))
    assert hot.get(keys[1]) is None
    assert hot.get(keys[0]) is not None and hot.get(keys[2]) is not None


def test_a_job_entry_whose_name_now_holds_another_file_is_not_served(tmp_path: Path) -> None:
    path = os.path.join(tmp_path, "name")
    with open(path, "wb") as out:
        out.write(b"v1")
    target = JobBlob(bytes(16), "name")
    hot = HotBlobs()
    hot.remember(target, 0, HotBlob(2, bytes(32), b"v1", path, os.stat(path).st_ino))
    assert hot.get(target) is not None
    replacement = path + ".new"
    with open(replacement, "wb") as out:
        out.write(b"v2")
    os.replace(replacement, path)
    assert hot.get(target) is None
    os.unlink(path)
    assert hot.get(target) is None
