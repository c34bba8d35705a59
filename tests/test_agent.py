"""``blobsvc agent``: a real agent process in front of a real server, asked over HTTP as Spark's
fetcher, curl and pip ask it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import io
import os
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import blake3
import pytest

from benchmarks.harness.agent import AgentProcess, run_agent, start_agent
from blobsvc import AsyncBlobClient, BlobCache, BlobClient, BlobServer, Settings, new_job_id
from blobsvc.agent._heartbeat import MAX_INTERVAL, MIN_INTERVAL, Heartbeats
from blobsvc.agent._python import launcher_script
from blobsvc.agent._source import CacheSource
from blobsvc.config import package_version
from blobsvc.http import blob_url, python_path, signed_url
from blobsvc.wire._protocol import ContentKey, JobBlob

from .conftest import ServerThread, with_secret
from .test_cache_faults import FaultyProxy, running

pytestmark = pytest.mark.timeout(120)

SECRET = b"agent test secret"


@pytest.fixture
def put(server_thread: ServerThread) -> Iterator[BlobClient]:
    with BlobClient(server_thread.address, timeout=10) as client:
        yield client


@pytest.fixture
def agent(server_thread: ServerThread, tmp_path: Path) -> Iterator[AgentProcess]:
    with run_agent(server_thread.address, tmp_path / "cache", "--io-timeout", "1") as running_agent:
        yield running_agent


def gets(server: ServerThread) -> int:
    """GETs the server has answered (the agent's downloads)."""
    return server.server.requests["GET"]


def test_content_and_job_blobs_are_fetched_once_and_then_served_locally(
    server_thread: ServerThread, put: BlobClient, agent: AgentProcess
) -> None:
    data = os.urandom(3 << 20)
    key = put.put(data)
    job = new_job_id()
    put.put(data, job=job, name="lib/app.jar")

    assert agent.get(f"/blobs/{key}/app.jar") == (200, data)
    assert agent.get(f"/jobs/{job}/lib/app.jar") == (200, data), "the same bytes, linked: no download"
    for _ in range(3):
        assert agent.get(f"/blobs/{key}") == (200, data)
    assert gets(server_thread) == 1
    assert agent.metric("blobsvc_agent_bytes_fetched_total") == len(data)
    assert agent.metric("blobsvc_agent_misses_total") == 1
    assert agent.metric("blobsvc_agent_bytes_served_total") >= 5 * len(data)
    assert agent.metric("blobsvc_agent_jobs") == 1, "the agent holds the job it served"


def test_requests_that_arrive_together_share_one_download(
    server_thread: ServerThread, put: BlobClient, agent: AgentProcess
) -> None:
    data = os.urandom(8 << 20)
    key = put.put(data)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: agent.get(f"/blobs/{key}"), range(16)))
    assert all(answer == (200, data) for answer in answers)
    assert gets(server_thread) == 1


def test_a_waiter_cancelled_does_not_cancel_the_fetch_others_wait_for(
    server_thread: ServerThread, put: BlobClient, tmp_path: Path
) -> None:
    """A request cancelled mid-wait (at shutdown, say) leaves the shared fetch running."""
    data = os.urandom(8 << 20)
    key = put.put(data)
    proxy = FaultyProxy(server_thread.server.address, throttle=0.01)  # a second or so for 8 MiB

    async def fetch_twice_cancelling_one() -> bytes:
        source = CacheSource(BlobCache(proxy.address, tmp_path / "cache"), proxy.address)
        try:
            target = ContentKey(bytes.fromhex(key))
            first = asyncio.create_task(source.open_blob(target))
            second = asyncio.create_task(source.open_blob(target))
            await asyncio.sleep(0.2)
            first.cancel()
            with await second as blob:
                return os.pread(blob.fd, blob.size, 0)
        finally:
            source.close()

    with running(proxy, server_thread):
        assert asyncio.run(fetch_twice_cancelling_one()) == data
        assert len(proxy.get_offsets(key)) == 1


def test_head_range_and_etag_answer_as_the_server_does(put: BlobClient, agent: AgentProcess) -> None:
    data = bytes(range(256)) * 1000
    key = put.put(data)
    assert agent.get(f"/blobs/{key}", "HEAD") == (200, b"")
    assert agent.get(f"/blobs/{key}", headers={"Range": "bytes=10-19"}) == (206, data[10:20])
    assert agent.get(f"/blobs/{key}", headers={"Range": "bytes=-5"}) == (206, data[-5:])
    assert agent.get(f"/blobs/{key}", headers={"If-None-Match": f'"{key}"'})[0] == 304
    status, body = agent.get(f"/blobs/{key}", headers={"Range": f"bytes={1 << 60}-"})
    assert status == 416 and b"outside" in body


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        (f"/blobs/{'ab' * 32}", 404, b"no blob with key"),
        (f"/jobs/{'0' * 32}/missing.jar", 404, b"no blob named"),
        (f"/jobs/{'0' * 32}/..", 404, b"no blob named '..'"),
        ("/blobs/xyz", 400, b"key"),
        ("/blobs/" + "a" * 5000, 400, b"5000 characters"),
        ("/jobs/xyz/name", 400, b"job id"),
        ("/../../etc/passwd", 404, b"/blobs/<key>"),
        ("/", 404, b"/blobs/<key>"),
    ],
)
def test_unknown_and_malformed_paths_get_clear_errors(
    agent: AgentProcess, path: str, status: int, words: bytes
) -> None:
    got, body = agent.get(path)
    assert (got, words in body) == (status, True), body


def test_a_stalled_client_is_closed_and_others_are_served_meanwhile(put: BlobClient, agent: AgentProcess) -> None:
    key = put.put(b"served")
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as stalled:
        stalled.sendall(b"GET /blobs/")  # and nothing more
        assert agent.get(f"/blobs/{key}") == (200, b"served")
        began = time.monotonic()
        assert stalled.recv(100) == b"", "closed within the agent's io_timeout"
        assert time.monotonic() - began < 5


def test_an_unreachable_server_is_a_502_naming_it(tmp_path: Path) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{placeholder.getsockname()[1]}"  # nobody listens there
        with run_agent(address, tmp_path / "cache") as lonely:
            status, body = lonely.get(f"/blobs/{'cd' * 32}")
            launcher = lonely.get(python_path("cd" * 32, "env.tar.gz", "env-python"))
    assert status == 502 and address.encode() in body and body[-1:] == b"\n" and body.count(b"\n") == 1
    assert launcher[0] == 502 and address.encode() in launcher[1]


def test_a_blob_larger_than_the_cache_is_a_507(server_thread: ServerThread, put: BlobClient, tmp_path: Path) -> None:
    key = put.put(os.urandom(2 << 20))
    with run_agent(server_thread.address, tmp_path / "cache", "--max-bytes", "1MiB") as small:
        status, body = small.get(f"/blobs/{key}")
        launcher = small.get(python_path(key, "env.tar.gz", "env-python"))
    assert status == 507 and b"limit" in body
    assert launcher[0] == 507 and b"limit" in launcher[1]


def test_a_secret_requires_signed_urls(settings: Settings, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    server = ServerThread(replace(settings, secret_file=secret_file)).start()
    try:
        with BlobClient(server.address, secret=SECRET, timeout=10) as client:
            key = client.put(b"for the signed only")
        with run_agent(server.address, tmp_path / "cache", "--secret-file", str(secret_file)) as signed:
            assert signed.get(f"/blobs/{key}")[0] == 403
            url = blob_url(signed.url, key=key, name="x.bin", secret=SECRET)
            assert signed.get(url.removeprefix(signed.url)) == (200, b"for the signed only")
            # A launcher's URL is signed over its own path, as a blob's.
            with BlobClient(server.address, secret=SECRET, timeout=10) as client:
                env = client.put(environment_tar(tmp_path / "env.tar.gz"))
            path = python_path(env, "env.tar.gz", "environment-python")
            assert signed.get(path)[0] == 403
            query = blob_url(signed.url, key=env, name="env.tar.gz", secret=SECRET).partition("?")[2]
            assert signed.get(f"{path}?{query}")[0] == 403, "a blob's signature is not the launcher's"
            assert signed.get(signed_url("", path, SECRET))[0] == 200
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("secret", "words"),
    [(None, "requires a shared secret, and this agent has none"), (b"not the server's", "refused this agent's secret")],
    ids=["none", "another"],
)
def test_an_agent_without_the_secret_refuses_to_start_in_front_of_a_server_that_requires_it(
    settings: Settings, tmp_path: Path, secret: bytes | None, words: str
) -> None:
    """Without it, it would serve unsigned what the host's secret-holding processes put in the cache."""
    server = ServerThread(with_secret(settings, tmp_path, SECRET)).start()
    address = server.address
    command = [sys.executable, "-m", "blobsvc", "agent", "-s", address, "--cache-dir", str(tmp_path / "c"),
               "--host", "127.0.0.1", "--port", "0"]  # fmt: skip
    if secret is not None:
        (tmp_path / "agent-secret").write_bytes(secret)
        command += ["--secret-file", str(tmp_path / "agent-secret")]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        server.stop()
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("Error: ") and words in line and address in line


def test_an_agent_without_a_secret_stops_once_its_server_comes_back_requiring_one(
    settings: Settings, tmp_path: Path
) -> None:
    """A server that cannot be reached says nothing of its rule; its first answer that does ends the agent."""
    beating = replace(settings, agent_heartbeat_interval=0.1)
    first = ServerThread(beating).start()
    port = first.server.address[1]
    agent = start_agent(first.address, tmp_path / "cache")
    try:
        with BlobClient(first.address, timeout=10) as client:
            key = client.put(b"cached unsigned")
        assert agent.get(f"/blobs/{key}") == (200, b"cached unsigned")
        first.stop()
        second = ServerThread(replace(with_secret(beating, tmp_path, SECRET), port=str(port))).start()
        try:
            assert agent.process.wait(30) == 1
        finally:
            second.stop()
        assert agent.process.stderr is not None
        last = agent.process.stderr.read().splitlines()[-1]
        assert last.startswith("Error: server ") and "this agent has none" in last
    finally:
        agent.kill()


def test_killed_mid_download_it_serves_no_partial_file_and_restarted_serves_its_cache_alone(
    server_thread: ServerThread, put: BlobClient, tmp_path: Path
) -> None:
    cached, large = b"cached before the kill", os.urandom(16 << 20)
    cached_key, large_key = put.put(cached), put.put(large)
    cache_dir = tmp_path / "cache"
    proxy = FaultyProxy(server_thread.server.address, throttle=0.01)  # a chunk per 10 ms: seconds for 16 MiB
    with running(proxy, server_thread):
        address = proxy.address
        agent = start_agent(address, cache_dir)
        try:
            proxy.throttle = 0.0
            assert agent.get(f"/blobs/{cached_key}") == (200, cached)
            proxy.throttle = 0.01
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pending = pool.submit(agent.get, f"/blobs/{large_key}")
                partial = _wait_for_partial(cache_dir)
                agent.kill()
                with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
                    pending.result(timeout=30)  # no answer at all, never a 200 with part of the body
            assert 0 < partial.stat().st_size < len(large)
            assert not (cache_dir / "content" / large_key).exists()
        finally:
            agent.kill()
    with run_agent(address, cache_dir) as restarted:  # nothing listens there any more: no server
        assert restarted.get(f"/blobs/{cached_key}") == (200, cached)
        status, body = restarted.get(f"/blobs/{large_key}")
        assert status == 502 and body != large[: len(body)]
    assert not (cache_dir / "content" / large_key).exists()


def _wait_for_partial(cache_dir: Path, min_size: int = 1) -> Path:
    """The partial file of a download under way, once it holds ``min_size`` bytes."""
    for _ in range(500):
        partials = [p for p in (cache_dir / "partial").iterdir() if p.stat().st_size >= min_size]
        if partials:
            return partials[0]
        time.sleep(0.01)
    raise AssertionError("no download began")


def test_sigterm_stops_it_cleanly(agent: AgentProcess) -> None:
    assert agent.terminate() == 0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--port", "notaport"], "not a port"),
        (["--max-bytes", "lots"], "not a size"),
        (["-s", "host:port"], "not a server address"),
    ],
)
def test_bad_flags_are_one_line_usage_errors(tmp_path: Path, args: list[str], words: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "blobsvc", "agent", "--cache-dir", str(tmp_path / "c"), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and words in done.stderr.lower() and "Traceback" not in done.stderr


def test_a_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "blobsvc", "agent", "--cache-dir", str(tmp_path / "c"), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1 and done.stderr == f"Error: port {port} on 127.0.0.1 is in use\n"


def test_the_agent_class_serves_in_process(server_thread: ServerThread, put: BlobClient, tmp_path: Path) -> None:
    """``Agent`` is usable from Python as ``blobsvc agent`` uses it."""
    from blobsvc.agent import Agent

    key = put.put(b"in process")
    settings = Settings(server=server_thread.address, cache_dir=tmp_path / "cache", agent_port="0")

    async def fetch() -> bytes:
        async with Agent(settings) as agent:
            host, port = agent.address
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"GET /blobs/{key} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n".encode())
            answer = await reader.read()
            writer.close()
            return answer

    answer = asyncio.run(fetch())
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"in process")
    assert blake3.blake3(b"in process").hexdigest() == key


def test_a_blob_evicted_between_its_fetch_and_its_open_is_fetched_again(
    server_thread: ServerThread, put: BlobClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The eviction is simulated (os.open fails once as it would): a real one cannot be timed
    into that gap."""
    key = put.put(b"evicted once")
    real_open = os.open
    failures = [FileNotFoundError(2, "evicted")]

    def open_once_evicted(path: str | os.PathLike[str], flags: int, *args: int) -> int:
        if failures and str(path).endswith(f"content/{key}") and flags == os.O_RDONLY | os.O_CLOEXEC:
            raise failures.pop()
        return real_open(path, flags, *args)

    async def fetch() -> bytes:
        source = CacheSource(BlobCache(server_thread.address, tmp_path / "cache"), server_thread.address)
        try:
            with await source.open_blob(ContentKey(bytes.fromhex(key))) as blob:
                return os.pread(blob.fd, blob.size, 0)
        finally:
            source.close()

    monkeypatch.setattr(os, "open", open_once_evicted)
    assert asyncio.run(fetch()) == b"evicted once"
    assert not failures


@pytest.fixture
def beating_server(settings: Settings) -> Iterator[ServerThread]:
    """A server that asks agents for a heartbeat every 0.2 s and calls them lost after 1 s."""
    running_server = ServerThread(replace(settings, agent_heartbeat_interval=0.2, agent_lost_after=1.0)).start()
    yield running_server
    running_server.stop()


def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.05)


def test_the_agent_reports_to_the_server_and_is_listed_stopped_once_sigterm_stops_it(
    beating_server: ServerThread, tmp_path: Path
) -> None:
    with run_agent(beating_server.address, tmp_path / "cache") as agent:
        wait_for(lambda: len(beating_server.server.hosts.listing()) == 1)
        (host,) = beating_server.server.hosts.listing()
        assert host["agent"] == f"{socket.gethostname()}:{agent.port}"
        assert (host["state"], host["cache_max_bytes"], host["version"]) == ("live", 10 << 30, package_version())
        assert agent.terminate() == 0
        assert "INFO blobsvc.agent: shutting down" in agent.process.communicate(timeout=10)[1]
    (host,) = beating_server.server.hosts.listing()
    assert host["state"] == "stopped"
    time.sleep(1.5)  # longer than agent_lost_after: a host that said goodbye is not lost
    assert beating_server.server.hosts.states() == {"live": 0, "lost": 0, "stopped": 1}
    with run_agent(beating_server.address, tmp_path / "cache", "--port", str(agent.port)):  # back again: live
        wait_for(lambda: beating_server.server.hosts.listing()[0]["state"] == "live")


def test_a_killed_agent_is_listed_lost(beating_server: ServerThread, tmp_path: Path) -> None:
    with run_agent(beating_server.address, tmp_path / "cache") as agent:
        wait_for(lambda: len(beating_server.server.hosts.listing()) == 1)
        agent.kill()
    wait_for(lambda: beating_server.server.hosts.listing()[0]["state"] == "lost")


def test_a_job_deleted_on_the_server_is_released_and_its_files_go_while_its_content_stays(
    beating_server: ServerThread, tmp_path: Path
) -> None:
    data = os.urandom(1 << 20)
    first_job, later_job = new_job_id(), new_job_id()
    with BlobClient(beating_server.address, timeout=10) as client:
        client.put(data, job=first_job, name="udfs.jar")
        with run_agent(beating_server.address, tmp_path / "cache", "--cleanup-interval", "0.5") as agent:
            assert agent.get(f"/jobs/{first_job}/udfs.jar") == (200, data)
            job_dir = agent.cache_dir / "jobs" / first_job
            time.sleep(1.0)  # heartbeats name the job: it is held while it exists
            assert job_dir.exists() and agent.metric("blobsvc_agent_jobs") == 1

            client.delete_job(first_job)  # the end of a publish block
            wait_for(lambda: agent.metric("blobsvc_agent_jobs") == 0)
            wait_for(lambda: not job_dir.exists())  # one cleanup interval later
            key = blake3.blake3(data).hexdigest()
            assert (agent.cache_dir / "content" / key).exists(), "content stays under the LRU rule"

            client.put(data, job=later_job, name="udfs.jar")  # the next job ships the same jar
            downloads = gets(beating_server)
            assert agent.get(f"/jobs/{later_job}/udfs.jar") == (200, data)
            assert gets(beating_server) == downloads, "not downloaded again"


def test_a_job_the_server_reports_gone_answers_404_at_once_while_its_files_wait_for_cleanup(
    beating_server: ServerThread, tmp_path: Path
) -> None:
    job = new_job_id()
    with BlobClient(beating_server.address, timeout=10) as client:
        client.put(b"a jar", job=job, name="udfs.jar")
        with run_agent(beating_server.address, tmp_path / "cache", "--cleanup-interval", "3600") as agent:
            assert agent.get(f"/jobs/{job}/udfs.jar") == (200, b"a jar")
            client.delete_job(job)  # the end of a publish block
            wait_for(lambda: agent.metric("blobsvc_agent_jobs") == 0)  # the server said it is gone
            status, body = agent.get(f"/jobs/{job}/udfs.jar")
            assert status == 404 and b"udfs.jar" in body
            assert (agent.cache_dir / "jobs" / job).exists(), "the files stay for the cleanup interval"
            client.put(b"a jar", job=job, name="udfs.jar")  # the job id used again: served again
            assert agent.get(f"/jobs/{job}/udfs.jar") == (200, b"a jar")


def test_heartbeats_to_an_unreachable_server_release_nothing_and_warn_once(
    server_thread: ServerThread, put: BlobClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = new_job_id()
    put.put(b"held", job=job, name="a.jar")

    async def beat_three_times_into_the_void() -> list[str]:
        cache = BlobCache(server_thread.address, tmp_path / "cache")
        source = CacheSource(cache, server_thread.address)
        try:
            await source.open_blob(JobBlob(bytes.fromhex(job), "a.jar"))
            with socket.socket() as placeholder:
                placeholder.bind(("127.0.0.1", 0))  # nobody listens there
                nowhere = f"127.0.0.1:{placeholder.getsockname()[1]}"
                async with AsyncBlobClient(nowhere, retries=0, connect_timeout=1) as client:
                    heartbeats = Heartbeats(client, source, 6131, lambda: {})
                    for _ in range(3):
                        await heartbeats.beat()
            return source.jobs
        finally:
            source.close()

    assert asyncio.run(beat_three_times_into_the_void()) == [job]
    warnings = [r for r in caplog.records if r.name == "blobsvc.agent" and r.levelname == "WARNING"]
    assert len(warnings) == 1 and "heartbeat to 127.0.0.1:" in warnings[0].getMessage()


@pytest.mark.parametrize(("asked", "taken"), [(0.001, MIN_INTERVAL), (7200.0, MAX_INTERVAL)])
async def test_the_interval_an_answer_asks_for_is_held_between_the_agents_bounds(
    settings: Settings, tmp_path: Path, asked: float, taken: float
) -> None:
    served = replace(settings, agent_heartbeat_interval=asked, agent_lost_after=2 * asked)
    async with BlobServer(served) as server, AsyncBlobClient(server.address) as client:
        source = CacheSource(BlobCache(client.server, tmp_path / "cache"), client.server)
        try:
            heartbeats = Heartbeats(client, source, 6131, lambda: {})
            await heartbeats.beat()
            assert heartbeats.interval == taken
        finally:
            source.close()


# --- /python/<key>/<archive>/<launcher>: environments unpacked once per host ----------------


def environment_tar(path: Path, *members: tuple[str, bytes], python: bool = True) -> Path:
    """A venv-pack-like archive: ``bin/python`` links to this test's interpreter by its
    absolute path, as venv-pack's links to the base interpreter."""
    with tarfile.open(path, "w:gz") as out:
        if python:
            link = tarfile.TarInfo("bin/python")
            link.type, link.linkname = tarfile.SYMTYPE, sys.executable
            out.addfile(link)
        for name, data in (("pyvenv.cfg", b""), *members):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return path


def test_an_environment_is_unpacked_once_and_its_launcher_runs_its_python(
    server_thread: ServerThread, put: BlobClient, agent: AgentProcess, tmp_path: Path
) -> None:
    archive = environment_tar(tmp_path / "env.tar.gz", ("lib/probe.py", b"X = 1\n"))
    key = put.put(archive)
    path = python_path(key, "env.tar.gz", "environment-python")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: agent.get(path), range(8)))
    assert len(set(answers)) == 1 and answers[0][0] == 200, answers[0]
    tree = agent.cache_dir / "unpacked" / f"{key}.env"
    assert answers[0][1] == f'#!/bin/sh\nexec {tree}/bin/python "$@"\n'.encode()
    assert agent.metric("blobsvc_agent_unpacks_total") == 1, "requests that arrive together share one unpack"
    assert agent.metric("blobsvc_agent_bytes_fetched_total") == archive.stat().st_size
    assert agent.get(path, method="HEAD") == (200, b"")
    launcher = tmp_path / "environment-python"
    launcher.write_bytes(answers[0][1])
    launcher.chmod(0o755)
    ran = subprocess.run([launcher, "-c", "import sys; print(sys.executable)"], capture_output=True, timeout=30)
    assert ran.stdout.decode().strip() == f"{tree}/bin/python", ran.stderr
    assert agent.metric("blobsvc_agent_unpacks_total") == 1 and gets(server_thread) == 1


def test_a_launcher_path_is_quoted_for_the_shell() -> None:
    script = launcher_script(Path("/cache/it's $HOME/x"))
    assert script == b"#!/bin/sh\nexec '/cache/it'\"'\"'s $HOME/x/bin/python' \"$@\"\n"


def test_a_launcher_names_its_tree_absolutely_when_the_agent_was_given_a_relative_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    script = launcher_script(Path("cache/unpacked/k.env"))
    assert script == f'#!/bin/sh\nexec {tmp_path}/cache/unpacked/k.env/bin/python "$@"\n'.encode()


@pytest.mark.parametrize(
    ("archive", "name", "launcher", "status", "words"),
    [
        (None, "env.tar.gz", "env-python", 404, b"no blob with key"),
        ("env", "env.rar", "env-python", 400, b"not an archive blobsvc unpacks"),
        ("env", "env.tar.gz", "..", 400, b"not a plain file name"),
        ("env", "env.tar.gz", "a%20b", 400, b"not a plain file name"),
        ("unsafe", "env.tar.gz", "env-python", 400, b"climbs out"),
        ("no-python", "env.tar.gz", "env-python", 400, b"no bin/python"),
    ],
)
def test_bad_launcher_requests_get_clear_errors(
    put: BlobClient, agent: AgentProcess, tmp_path: Path, archive: str | None, name: str, launcher: str, status: int,
    words: bytes,
) -> None:  # fmt: skip
    archives = {
        "env": lambda: environment_tar(tmp_path / "env.tar.gz"),
        "unsafe": lambda: environment_tar(tmp_path / "env.tar.gz", ("../evil", b"x")),
        "no-python": lambda: environment_tar(tmp_path / "env.tar.gz", ("lib/x.py", b""), python=False),
    }
    key = "ab" * 32 if archive is None else put.put(archives[archive]())
    got, body = agent.get(f"/python/{key}/{name}/{launcher}")
    assert (got, words in body, body.count(b"\n")) == (status, True, 1), body


def test_an_environment_that_unpacks_past_the_cache_limit_is_a_507_and_leaves_nothing(
    server_thread: ServerThread, put: BlobClient, tmp_path: Path
) -> None:
    """A few kilobytes of tar.gz that unpack to 4 MiB, on an agent whose cache holds 1 MiB:
    refused at the limit, logged, and no tree (nor a part of one) is left."""
    key = put.put(environment_tar(tmp_path / "bomb.tar.gz", ("zeros", b"\0" * (4 << 20))))
    with run_agent(server_thread.address, tmp_path / "cache", "--max-bytes", "1MiB") as small:
        status, body = small.get(python_path(key, "bomb.tar.gz", "env-python"))
        small.kill()
    assert status == 507 and b"the most a tree may hold" in body and b"1048576 bytes" in body, body
    assert list((tmp_path / "cache" / "unpacked").iterdir()) == []
    assert small.process.stderr is not None
    logged = small.process.stderr.read()
    assert "WARNING" in logged and f"refused the environment {key}" in logged, logged


def test_an_environment_without_python_is_refused_logged_and_not_kept(
    put: BlobClient, agent: AgentProcess, tmp_path: Path
) -> None:
    key = put.put(environment_tar(tmp_path / "env.tar.gz", ("lib/x.py", b""), python=False))
    for _ in range(2):  # unpacked, found useless and removed each time
        status, body = agent.get(python_path(key, "env.tar.gz", "env-python"))
        assert status == 400 and b"no bin/python" in body, body
        assert [p.name for p in (agent.cache_dir / "unpacked").iterdir()] == [], "neither a tree nor its lock"
    agent.kill()
    assert agent.process.stderr is not None
    logged = agent.process.stderr.read()
    assert f"refused the environment {key} (env.tar.gz): the archive has no bin/python" in logged, logged
