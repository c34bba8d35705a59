"""TLS with real certificates made by trustme: server authentication, host name checks,
mutual TLS, the minimum version, and a plain peer meeting a TLS one (a clear error at once)."""

from __future__ import annotations

import asyncio
import http.client
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import trustme
from click.testing import CliRunner

from blobsvc import (
    AsyncBlobClient,
    BadRequest,
    BlobClient,
    BlobServer,
    ConnectTimeout,
    Settings,
    TLSError,
    TooLarge,
    client_tls_context,
    digest_of,
    new_job_id,
)
from blobsvc.cli import main

from .conftest import ServerThread


@dataclass
class Pki:
    """A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate."""

    ca: Path
    server_cert: Path  # chain and key in one file
    client_ca: Path
    client_cert: Path
    other_ca: Path  # trusts nothing blobsvc presents


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca, client_ca, other = trustme.CA(), trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    client_ca.cert_pem.write_to_path(str(root / "client-ca.pem"))
    other.cert_pem.write_to_path(str(root / "other-ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_and_cert_chain_pem.write_to_path(str(root / "server.pem"))
    client = client_ca.issue_cert("executor-1.example.org")
    client.private_key_and_cert_chain_pem.write_to_path(str(root / "client.pem"))
    return Pki(root / "ca.pem", root / "server.pem", root / "client-ca.pem", root / "client.pem", root / "other-ca.pem")


@pytest.fixture
def tls_settings(settings: Settings, pki: Pki) -> Settings:
    return replace(settings, tls_cert=pki.server_cert)


@pytest.fixture
async def tls_server(tls_settings: Settings) -> AsyncIterator[BlobServer]:
    async with BlobServer(tls_settings) as running:
        yield running


def _client(address: tuple[str, int] | str, context: ssl.SSLContext | None, **options: float) -> AsyncBlobClient:
    chosen: dict[str, float] = {"timeout": 5.0, "connect_timeout": 5.0, "retries": 2, "backoff": 0.01, **options}
    return AsyncBlobClient(address, tls=context, **chosen)  # type: ignore[arg-type]


async def test_put_and_get_over_tls_round_trip_small_and_large_blobs(tls_server: BlobServer, pki: Pki) -> None:
    large = bytes(range(256)) * (12 << 12)  # 12 MiB: the encrypted file path, in several pieces
    job = new_job_id()
    async with _client(tls_server.address, client_tls_context(pki.ca)) as client:
        small_key = await client.put(b"hello")
        large_key = await client.put(large, job=job, name="big.bin")
        assert await client.get(small_key) == b"hello"
        assert await client.get(small_key) == b"hello"  # from memory: the task answers, encrypted
        assert await client.get(job=job, name="big.bin") == large
        assert large_key == digest_of(large).hex()
        assert [info.name for info in await client.list(job)] == ["big.bin"]


async def test_resumed_get_over_tls_starts_at_its_offset(tls_server: BlobServer, pki: Pki, tmp_path: Path) -> None:
    data = bytes(range(256)) * 4096
    async with _client(tls_server.address, client_tls_context(pki.ca)) as client:
        key = await client.put(data)
        partial = tmp_path / "part"
        partial.write_bytes(data[:300_000])
        await client.resume_file(partial, key)
    assert partial.read_bytes() == data


async def test_a_certificate_from_another_ca_is_refused_without_retrying(tls_server: BlobServer, pki: Pki) -> None:
    async with _client(tls_server.address, client_tls_context(pki.other_ca), retries=3) as client:
        with pytest.raises(TLSError, match="certificate verify failed") as caught:
            await client.stat(digest_of(b"x"))
    assert str(caught.value).endswith("(server 127.0.0.1:" + str(tls_server.address[1]) + ", 1 attempt)")
    assert "\n" not in str(caught.value)


async def test_the_host_name_must_be_in_the_certificate(settings: Settings, tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert("blobs.example.org").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "s.pem"))
    async with (
        BlobServer(replace(settings, tls_cert=tmp_path / "s.pem")) as server,
        _client(server.address, client_tls_context(tmp_path / "ca.pem")) as client,
    ):
        with pytest.raises(TLSError, match="mismatch"):
            await client.stat(digest_of(b"x"))


async def test_mutual_tls_admits_a_client_certificate_from_its_ca_only(tls_settings: Settings, pki: Pki) -> None:
    async with BlobServer(replace(tls_settings, tls_client_ca=pki.client_ca)) as server:
        with_cert = client_tls_context(pki.ca, cert=pki.client_cert)
        async with _client(server.address, with_cert) as client:
            assert await client.get(await client.put(b"signed")) == b"signed"
        async with _client(server.address, client_tls_context(pki.ca)) as client:
            # TLS 1.3 finishes the client's handshake before the server checks; the refusal
            # arrives as an alert on the first read.
            with pytest.raises(TLSError, match="certificate"):
                await client.stat(digest_of(b"x"))
        wrong = client_tls_context(pki.ca, cert=pki.server_cert)  # a real certificate, from the wrong CA
        async with _client(server.address, wrong) as client:
            with pytest.raises(TLSError):
                await client.stat(digest_of(b"x"))


async def test_the_minimum_version_refuses_older_clients(tls_settings: Settings, pki: Pki) -> None:
    old = client_tls_context(pki.ca)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    async with BlobServer(tls_settings) as server, _client(server.address, old) as client:
        with pytest.raises(TLSError, match="version"):
            await client.stat(digest_of(b"x"))
    async with (
        BlobServer(replace(tls_settings, tls_min_version="1.2")) as server,
        _client(server.address, old) as client,
    ):
        assert await client.get(await client.put(b"tls 1.2")) == b"tls 1.2"


async def test_a_plain_client_meeting_a_tls_server_is_told_at_once(tls_server: BlobServer) -> None:
    started = time.monotonic()
    async with _client(tls_server.address, None) as client:
        with pytest.raises(BadRequest, match="requires TLS"):
            await client.stat(digest_of(b"x"))
    assert time.monotonic() - started < 2.0, "well inside the connect timeout"


async def test_a_tls_client_meeting_a_plain_server_is_told_at_once(server: BlobServer, pki: Pki) -> None:
    started = time.monotonic()
    async with _client(server.address, client_tls_context(pki.ca)) as client:
        with pytest.raises(TLSError, match="does not use TLS"):
            await client.stat(digest_of(b"x"))
    assert time.monotonic() - started < 2.0, "well inside the connect timeout"


async def test_a_silent_tls_server_times_out_within_the_connect_timeout(pki: Pki) -> None:
    """A peer that accepts and never answers the ClientHello: the handshake is part of
    connecting, so connect_timeout bounds it."""
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    address = silent.sockets[0].getsockname()[:2]
    started = time.monotonic()
    try:
        async with _client(address, client_tls_context(pki.ca), connect_timeout=0.5) as client:
            client.retries = 0
            with pytest.raises(ConnectTimeout, match="timed out"):
                await client.stat(digest_of(b"x"))
    finally:
        silent.close()
    assert time.monotonic() - started < 3.0


def test_cli_serves_and_fetches_over_tls(tls_settings: Settings, pki: Pki, tmp_path: Path) -> None:
    running = ServerThread(tls_settings).start()
    try:
        source = tmp_path / "app.jar"
        source.write_bytes(b"jar bytes" * 1000)
        runner = CliRunner()
        common = ["-s", running.address, "--tls-ca", str(pki.ca)]
        put = runner.invoke(main, ["put", str(source), *common])
        assert put.exit_code == 0, put.output
        got = runner.invoke(main, ["get", put.output.strip(), "-o", str(tmp_path / "out"), *common])
        assert got.exit_code == 0, got.output
        assert (tmp_path / "out").read_bytes() == source.read_bytes()
        mutual = ServerThread(replace(tls_settings, tls_client_ca=pki.client_ca, data_dir=tmp_path / "m")).start()
        try:
            with_cert = ["-s", mutual.address, "--tls-ca", str(pki.ca), "--tls-client-cert", str(pki.client_cert)]
            assert runner.invoke(main, ["put", str(source), *with_cert]).exit_code == 0
            refused = runner.invoke(main, ["put", str(source), "-s", mutual.address, "--tls-ca", str(pki.ca)])
            assert refused.exit_code == 1
            assert "certificate required" in refused.output
        finally:
            mutual.stop()
        plain = runner.invoke(main, ["stat", put.output.strip(), "-s", running.address])
        assert plain.exit_code == 1
        assert plain.output.strip().splitlines() == [plain.output.strip()]
        assert "requires TLS" in plain.output
    finally:
        running.stop()


def test_serve_with_a_file_that_is_not_a_certificate_is_a_one_line_error(tmp_path: Path, settings: Settings) -> None:
    bogus = tmp_path / "cert.pem"
    bogus.write_text("not a certificate\n")
    result = CliRunner().invoke(
        main, ["serve", "--port", "0", "--data-dir", str(settings.data_dir), "--tls-cert", str(bogus)]
    )
    assert result.exit_code == 2
    assert f"cannot load TLS certificate {bogus}" in result.output
    assert "Traceback" not in result.output


def test_the_http_face_speaks_tls_with_the_same_certificate(tls_settings: Settings, pki: Pki) -> None:
    running = ServerThread(replace(tls_settings, http_port="0")).start()
    try:
        data = bytes(range(256)) * 1024  # past the inline limit: the encrypted file path
        with BlobClient(running.address, tls=client_tls_context(pki.ca)) as client:
            key = client.put(data)
        http_address = running.server.http_address
        assert http_address is not None
        host, port = http_address
        secured = http.client.HTTPSConnection(host, port, timeout=5, context=client_tls_context(pki.ca))
        try:
            secured.request("GET", f"/blobs/{key}")
            answer = secured.getresponse()
            assert answer.status == 200
            assert answer.read() == data
        finally:
            secured.close()
        plain = http.client.HTTPConnection(host, port, timeout=5)
        try:
            plain.request("GET", f"/blobs/{key}")
            answer = plain.getresponse()
            assert answer.status == 400
            assert b"requires TLS" in answer.read()
        finally:
            plain.close()
    finally:
        running.stop()


def test_blobsvc_url_is_https_when_the_client_uses_tls(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOBSVC_TLS_CA", str(pki.ca))
    result = CliRunner().invoke(main, ["url", "0" * 64, "-s", "blobs.example.org:6130", "--http-port", "6180"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"https://blobs.example.org:6180/blobs/{'0' * 64}"


async def test_an_early_refusal_reaches_the_client_over_tls(tls_settings: Settings, pki: Pki) -> None:
    """TOO_LARGE comes before the body ends, while the client still sends: it must arrive
    intact through the TLS stream and its closing, not as a broken pipe."""
    async with (
        BlobServer(replace(tls_settings, max_blob_size=1 << 20)) as server,
        _client(server.address, client_tls_context(pki.ca)) as client,
    ):
        with pytest.raises(TooLarge):
            await client.put(bytes(8 << 20))
        assert await client.get(await client.put(b"still served")) == b"still served"
