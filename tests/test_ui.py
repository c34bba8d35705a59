"""The operator's page over plain HTTP (the browser's view is tests/test_ui_browser.py): who may
see it, the headers every answer carries, the JSON's pages and bounds, what it lists."""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trustme
from click.testing import CliRunner

from blobsvc import BlobClient, Settings, new_job_id
from blobsvc.checkpoints import CheckpointAborted, CheckpointStore
from blobsvc.cli import main
from blobsvc.http import signed_url
from blobsvc.ui import COOKIE, MAX_PAGE, SECURITY_HEADERS, SNAPSHOT_SECONDS, page_link

from .conftest import ServerThread, with_secret

SECRET = b"operator page secret"


def _get(port: int, path: str, headers: dict[str, str] | None = None, method: str = "GET") -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(method, path, headers=headers or {})
    response = connection.getresponse()
    response.read()  # kept on the response for the caller: .body below
    return response


def _body(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    return response.status, response.read(), dict(response.getheaders())


def _json(port: int, path: str, headers: dict[str, str] | None = None) -> Any:
    status, body, _ = _body(port, path, headers)
    assert status == 200, body
    return json.loads(body)


@pytest.fixture
def page(settings: Settings) -> Iterator[ServerThread]:
    running = ServerThread(replace(settings, http_port="0", agent_heartbeat_interval=0.2, agent_lost_after=0.5)).start()
    yield running
    running.stop()


@pytest.fixture
def secret_page(settings: Settings, tmp_path: Path) -> Iterator[ServerThread]:
    running = ServerThread(replace(with_secret(settings, tmp_path, SECRET), http_port="0")).start()
    yield running
    running.stop()


def _port(server: ServerThread) -> int:
    address = server.server.http_address
    assert address is not None
    return address[1]


PATHS = ("/ui/", "/ui/app.js", "/ui/app.css", "/ui/icon.svg", "/ui/api/overview", "/ui/api/hosts", "/ui/api/jobs")


def test_every_answer_under_ui_carries_the_strict_policy_and_no_sniffing(page: ServerThread) -> None:
    port = _port(page)
    for path in (*PATHS, "/ui/nothing", "/ui/api/hosts?limit=0"):
        _, _, headers = _body(port, path)
        for name, value in SECURITY_HEADERS:
            assert headers.get(name) == value, (path, name)
    policy = dict(SECURITY_HEADERS)["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe" not in policy


def test_the_page_has_no_inline_script_and_names_only_its_own_files(page: ServerThread) -> None:
    _, html, _ = _body(_port(page), "/ui/")
    text = html.decode()
    assert '<script src="/ui/app.js" defer></script>' in text
    assert text.count("<script") == 1 and "http://" not in text and "https://" not in text


def test_the_page_is_read_only(page: ServerThread) -> None:
    for method in ("POST", "PUT", "DELETE"):
        assert _get(_port(page), "/ui/api/overview", method=method).status == 405


def test_lists_are_paged_and_a_page_is_at_most_max_page(page: ServerThread) -> None:
    port = _port(page)
    for bad in ("limit=0", f"limit={MAX_PAGE + 1}", "offset=-1", "limit=x", "offset=99999999999"):
        status, body, _ = _body(port, f"/ui/api/hosts?{bad}")
        assert status == 400 and body.count(b"\n") == 1, bad
    assert _json(port, f"/ui/api/jobs?limit={MAX_PAGE}")["limit"] == MAX_PAGE
    assert _body(port, "/ui/api/nothing")[0] == 404
    assert _body(port, "/ui/api/pipelines/no%20such")[0] == 400


def test_hosts_list_lost_ones_first_and_pages_through_them(page: ServerThread) -> None:
    port = _port(page)
    with BlobClient(page.address, timeout=10) as client:
        client.heartbeat({"agent": "z-gone:6140", "cache_bytes": 10, "cache_max_bytes": 100})
        time.sleep(0.7)  # past agent_lost_after
        for name in ("a-live", "b-live"):
            client.heartbeat({"agent": f"{name}:6140", "host": name, "jobs": [new_job_id()]})
    first = _json(port, "/ui/api/hosts?limit=2")
    assert first["total"] == 3
    assert [(h["agent"], h["state"]) for h in first["hosts"]] == [("z-gone:6140", "lost"), ("a-live:6140", "live")]
    assert first["hosts"][0]["cache_max_bytes"] == 100
    rest = _json(port, "/ui/api/hosts?offset=2&limit=2")
    assert [(h["agent"], h["jobs"]) for h in rest["hosts"]] == [("b-live:6140", 1)]


def test_jobs_show_their_blobs_and_bytes_and_names_on_demand(page: ServerThread) -> None:
    port = _port(page)
    job = new_job_id()
    with BlobClient(page.address, timeout=10) as client:
        client.put(b"x" * 10, job=job, name="lib/a.jar")
        client.put(b"y" * 5, job=job, name="b.py")
    (row,) = _json(port, "/ui/api/jobs")["jobs"]
    assert row == {"job": job, "blobs": 2, "bytes": 15}
    names = _json(port, f"/ui/api/jobs/{job}?limit=1")
    assert names["total"] == 2 and [n["name"] for n in names["names"]] == ["b.py"]
    assert _body(port, "/ui/api/jobs/not-a-job")[0] == 400


def test_the_overview_says_role_version_and_counts(page: ServerThread) -> None:
    overview = _json(_port(page), "/ui/api/overview")
    assert overview["role"] == "standalone" and overview["leader_http"] is None
    assert overview["version"] and overview["disk_free_bytes"] > 0
    assert overview["requests"] == {"HTTP_GET": 1}  # this very request: rates are drawn from these counts


def test_without_a_signed_link_a_secret_server_serves_nothing_of_the_page(secret_page: ServerThread) -> None:
    port = _port(secret_page)
    for path in PATHS:
        status, body, headers = _body(port, path)
        assert status == 403 and b"blobsvc ui" in body and SECRET not in body, path
        assert "Set-Cookie" not in headers
        assert all(headers.get(name) == value for name, value in SECURITY_HEADERS), path
    # A link signed for another path (a blob URL's signature) opens nothing.
    other = signed_url("", "/ui/api/overview", SECRET)
    assert _body(port, other)[0] == 403


def test_a_signed_link_sets_a_strict_cookie_and_leaves_the_address_bar(secret_page: ServerThread) -> None:
    port = _port(secret_page)
    link = page_link(f"http://127.0.0.1:{port}", SECRET, 600).removeprefix(f"http://127.0.0.1:{port}")
    status, _, headers = _body(port, link)
    assert status == 303 and headers["Location"] == "/ui/"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Secure" not in cookie  # plain HTTP: a browser would drop a Secure cookie
    max_age = int(cookie.split("Max-Age=")[1].split(";")[0])
    assert 590 <= max_age <= 600
    token = cookie.split(";")[0]
    assert _body(port, "/ui/api/overview", {"Cookie": token})[0] == 200
    assert _body(port, "/ui/", {"Cookie": token})[0] == 200
    altered = token[:-1] + ("0" if token[-1] != "0" else "1")
    assert _body(port, "/ui/api/overview", {"Cookie": altered})[0] == 403


def test_an_expired_link_or_cookie_is_refused(secret_page: ServerThread) -> None:
    port = _port(secret_page)
    link = page_link("", SECRET, -5)
    assert _body(port, link)[0] == 403
    token = link.split("expires=")[1].replace("&signature=", ".")
    status, body, _ = _body(port, "/ui/", {"Cookie": f"{COOKIE}={token}"})
    assert status == 403 and b"expired" in body


def test_blobsvc_ui_prints_a_link_the_server_accepts(secret_page: ServerThread, tmp_path: Path) -> None:
    port = _port(secret_page)
    secret_file = tmp_path / "secret"
    result = CliRunner().invoke(
        main, ["ui", "--http-url", f"http://127.0.0.1:{port}", "--secret-file", str(secret_file), "--valid-for", "60"]
    )
    assert result.exit_code == 0, result.output
    link = result.output.strip()
    assert link.startswith(f"http://127.0.0.1:{port}/ui/?expires=")
    assert _body(port, link.removeprefix(f"http://127.0.0.1:{port}"))[0] == 303
    unsigned = CliRunner().invoke(main, ["ui", "--http-url", f"http://127.0.0.1:{port}"])
    assert unsigned.output.strip() == f"http://127.0.0.1:{port}/ui/"
    missing = CliRunner().invoke(main, ["ui", "--server", "127.0.0.1:1"])
    assert missing.exit_code == 2 and "--http-port" in missing.output


def test_files_are_revalidated_by_etag_and_the_data_is_never_cached(page: ServerThread) -> None:
    port = _port(page)
    status, body, headers = _body(port, "/ui/app.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript") and body
    again = _get(port, "/ui/app.js", {"If-None-Match": headers["ETag"]})
    assert again.status == 304 and again.getheader("ETag") == headers["ETag"]
    assert _body(port, "/ui/api/overview")[2]["Cache-Control"] == "no-store"
    moved = _get(port, "/ui")
    assert moved.status == 308 and moved.getheader("Location") == "/ui/"


def test_hosts_are_read_at_most_once_a_snapshot_whatever_the_requests(page: ServerThread) -> None:
    port = _port(page)
    with BlobClient(page.address, timeout=10) as client:
        client.heartbeat({"agent": "first:6140"})
        assert _json(port, "/ui/api/hosts")["total"] == 1
        client.heartbeat({"agent": "second:6140"})
        assert _json(port, "/ui/api/hosts")["total"] == 1  # the same second's reading
        time.sleep(SNAPSHOT_SECONDS)
        assert _json(port, "/ui/api/hosts")["total"] == 2


def test_quick_page_benchmark_times_every_endpoint_a_page_load_and_both_get_rates(tmp_path: Path) -> None:
    from .test_bench_smoke import run_quick

    records = run_quick("benchmarks.bench_ui", "--tmp-dir", str(tmp_path))
    benches = {record.get("bench") for record in records}
    assert {"get_4KiB_page_closed", "get_4KiB_page_open", "page_load"} <= benches
    summary = records[-1]["summary"]
    assert set(summary["endpoint_ms"]) >= {"overview", "hosts", "jobs", "pipelines", "pipelines_history"}
    assert 0 < summary["page_load_bytes"] < 500_000 and summary["median_ops_open_over_closed"] > 0
    assert list(tmp_path.iterdir()) == []


def test_a_pipelines_history_is_newest_first_with_aborts_and_those_in_progress(page: ServerThread) -> None:
    port = _port(page)
    with CheckpointStore(page.address, "orders", retain=5, timeout=30) as store:
        for batch in range(2):
            with store.begin(tasks=["0"]) as pending:
                pending.acknowledge("0", store.snapshot("0", b"state %d" % batch))
        with pytest.raises(CheckpointAborted), store.begin(tasks=["0"]) as declined:
            declined.decline("0", "disk full")
        waiting = store.begin(tasks=["0"])
        assert _json(port, "/ui/api/pipelines")["pipelines"] == ["orders"]
        answer = _json(port, "/ui/api/pipelines/orders")
        rows = [(row["id"], row["status"], row["reason"]) for row in answer["history"]]
        assert rows[0] == (4, "in_progress", None) and rows[2:] == [(2, "completed", None), (1, "completed", None)]
        assert rows[1][:2] == (3, "aborted") and "disk full" in rows[1][2], rows
        assert answer["history"][2]["state_bytes"] > 0 and answer["history"][2]["duration"] is not None
        assert [row["id"] for row in _json(port, "/ui/api/pipelines/orders?limit=1")["history"]] == [4]
        assert _body(port, f"/ui/api/pipelines/orders?limit={MAX_PAGE + 1}")[0] == 400
        assert _body(port, "/ui/api/pipelines/unknown")[0] == 404
        waiting.abort("done looking")


def test_over_tls_the_cookie_is_secure(settings: Settings, tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    tls = replace(with_secret(settings, tmp_path, SECRET), http_port="0", tls_cert=tmp_path / "server.pem")
    server = ServerThread(tls).start()
    try:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        connection = http.client.HTTPSConnection("127.0.0.1", _port(server), timeout=10, context=context)
        connection.request("GET", page_link("", SECRET, 60))
        response = connection.getresponse()
        assert response.status == 303 and "; Secure" in (response.getheader("Set-Cookie") or "")
    finally:
        server.stop()
