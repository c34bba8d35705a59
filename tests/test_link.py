"""LINK (opcode 0x05): naming content the server holds under a job name, without its bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import blake3
import pytest

from blobsvc import AsyncBlobClient, BlobServer, DigestMismatch, NotFound, RemoteProtocolError
from blobsvc import client as client_module
from blobsvc.storage import BlobStorage
from blobsvc.wire._protocol import (
    ClientConnection,
    ContentKey,
    ErrorFrame,
    Hello,
    JobBlob,
    LinkOk,
    LinkRequest,
    ServerConnection,
    ServerHello,
    encode_request,
)

from .conftest import put_streamed as put
from .conftest import read_blob as read
from .test_protocol import JOB, KEY, MODES, feed, server_after_hello

OTHER_JOB = bytes(range(1, 17))


@pytest.mark.parametrize("mode", MODES)
def test_link_request_encodes_and_parses_exactly(mode: str) -> None:
    frame = LinkRequest(JobBlob(JOB, "model.bin"), KEY)
    wire = b"\x05\x01" + JOB + b"\x09\x00model.bin" + KEY
    assert encode_request(frame) == wire
    assert feed(server_after_hello(), wire, mode) == [frame]


@pytest.mark.parametrize("mode", MODES)
def test_link_replies_are_size_and_digest_or_an_error(mode: str) -> None:
    client = ClientConnection()
    client.send(Hello())
    client.receive_data(ServerConnection().send(ServerHello()))
    client.next_event()
    client.send(LinkRequest(JobBlob(JOB, "a"), KEY))
    client.send(LinkRequest(JobBlob(JOB, "b"), KEY))
    server = ServerConnection()
    wire = server.send(LinkOk(7, KEY)) + server.send(ErrorFrame(2, "no blob"))
    assert wire[: 1 + 8 + 32] == b"\x00" + struct.pack("<Q", 7) + KEY
    assert feed(client, wire, mode) == [LinkOk(7, KEY), ErrorFrame(2, "no blob")]
    assert client.pending == 0 and not client.closed


@pytest.mark.parametrize("addressing", [b"\x00", b"\x02"])
def test_link_takes_job_addressing_only(addressing: bytes) -> None:
    server = server_after_hello()
    server.receive_data(b"\x05" + addressing + KEY + KEY)
    with pytest.raises(RemoteProtocolError, match="LINK does not take addressing") as caught:
        server.next_event()
    assert caught.value.code == 1


def test_storage_links_content_under_a_job_name_and_replaces_atomically(storage: BlobStorage) -> None:
    key = put(storage, b"model")
    old = put(storage, b"older", JobBlob(JOB, "m"))
    assert storage.link(key, JobBlob(JOB, "m")) == 5
    assert read(storage, JobBlob(JOB, "m")) == b"model"
    # The replaced content had no other name: its object is gone, the linked one stays once.
    assert not storage.layout.object(old).exists()
    assert storage.layout.object(key).stat().st_nlink == 3  # object, content name, job name


def test_linking_a_name_to_the_content_it_holds_already_leaves_nothing_behind(storage: BlobStorage) -> None:
    """rename(2) of two links to one file does nothing: the temporary link must still go (a
    checkpoint links its unchanged state files again and again)."""
    key = put(storage, b"unchanged state", JobBlob(JOB, "state"))
    for _ in range(3):
        storage.link(key, JobBlob(JOB, "state"))
    assert [p.name for p in storage.layout.job_dir(JOB).iterdir()] == [storage.layout.job_blob(JOB, "state").name]
    assert storage.layout.object(key).stat().st_nlink == 2  # the object and its one name
    storage.delete(JobBlob(JOB, "state"))
    assert not storage.layout.object(key).exists()  # nothing else held it


def test_storage_links_content_that_only_another_job_names(storage: BlobStorage) -> None:
    key = put(storage, b"jar bytes", JobBlob(OTHER_JOB, "app.jar"))
    storage.link(key, JobBlob(JOB, "app.jar"))
    storage.delete(JobBlob(OTHER_JOB, "app.jar"))
    assert read(storage, JobBlob(JOB, "app.jar")) == b"jar bytes"
    with pytest.raises(NotFound):
        storage.open_blob(ContentKey(key))


def test_storage_link_of_absent_content_is_not_found_and_creates_nothing(storage: BlobStorage) -> None:
    with pytest.raises(NotFound, match="no blob with key"):
        storage.link(KEY, JobBlob(JOB, "x"))
    assert not storage.layout.job_dir(JOB).exists()


async def test_put_file_sends_bytes_only_when_the_server_lacks_them(server: BlobServer, tmp_path: Path) -> None:
    source = tmp_path / "model.bin"
    source.write_bytes(b"weights" * 1000)
    key = blake3.blake3(source.read_bytes()).hexdigest()
    async with AsyncBlobClient(server.address, timeout=5.0) as client:
        first, sent = await client.put_file(source, job=JOB, name="model.bin")
        assert (first.key, first.size, sent) == (key, 7000, True)
        second, sent = await client.put_file(source, job=OTHER_JOB, name="model.bin")
        assert (second.key, second.size, sent) == (key, 7000, False)
        assert await client.get(job=OTHER_JOB, name="model.bin") == source.read_bytes()
        # The bytes outlive the job that brought them: the next run sends none either.
        await client.delete_job(JOB)
        await client.delete_job(OTHER_JOB)
        third, sent = await client.put_file(source, job=JOB, name="model.bin")
        assert (third.key, sent) == (key, False)
    assert server.requests["PUT"] == 1 and server.requests["LINK"] == 4


async def test_put_file_hashes_new_bytes_once_and_a_stale_key_stores_nothing(
    server: BlobServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The digest ``put_file`` computed to look for the bytes is the upload's trailer: the
    client does not hash the file a second time while sending it. The server still hashes
    what it receives, so a key that is not the file's (the file changed since) is refused."""
    source = tmp_path / "model.bin"
    source.write_bytes(b"weights" * 100_000)  # large enough to be hashed on a thread
    hashed: list[int] = []
    real = client_module._WholeBody._hash

    def counted(body: client_module._WholeBody) -> bytes:
        hashed.append(body.length)
        return real(body)

    monkeypatch.setattr(client_module._WholeBody, "_hash", counted)
    async with AsyncBlobClient(server.address, timeout=5.0) as client:
        info, sent = await client.put_file(source, job=JOB, name="model.bin")
        assert sent and info.key == blake3.blake3(source.read_bytes()).hexdigest()
        assert hashed == []
        stale = blake3.blake3(b"what the file held before").hexdigest()
        with pytest.raises(DigestMismatch, match=r"model\.bin does not hash to"):
            await client.put_file(source, job=OTHER_JOB, name="model.bin", key=stale)
        with pytest.raises(NotFound):
            await client.stat(job=OTHER_JOB, name="model.bin")
    assert server.requests["PUT"] == 2


async def test_link_of_unknown_key_is_not_found_and_keeps_the_connection(client: AsyncBlobClient) -> None:
    with pytest.raises(NotFound):
        await client.link(KEY.hex(), job=JOB, name="x")
    key = await client.put(b"abc")
    assert (await client.link(key, job=JOB, name="x")).size == 3
    assert await client.get(job=JOB, name="x") == b"abc"
