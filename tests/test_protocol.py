"""The sans-IO protocol core on bytes alone: no sockets, no event loop."""

from __future__ import annotations

import ast
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import blake3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blobsvc import ConnectionClosed, InvalidArgument, LocalProtocolError, RemoteProtocolError
from blobsvc.wire._protocol import (
    CLOSED,
    MAX_CHECKPOINTS_REPLY_BYTES,
    MAX_CHECKPOINTS_REQUEST_BYTES,
    MAX_HEARTBEAT_BYTES,
    MAX_HOSTS_BYTES,
    MAX_NAME_BYTES,
    MAX_STATUS_BYTES,
    NEED_DATA,
    AuthOk,
    AuthRequest,
    CheckpointsOk,
    CheckpointsRequest,
    ClientConnection,
    ContentKey,
    Data,
    DeleteOk,
    DeleteRequest,
    EndOfBody,
    ErrorFrame,
    GetOk,
    GetRequest,
    HeartbeatOk,
    HeartbeatRequest,
    Hello,
    HostsOk,
    HostsRequest,
    JobBlob,
    ListEntry,
    ListOk,
    ListRequest,
    PutOk,
    PutRequest,
    PutTrailer,
    ServerConnection,
    ServerHello,
    Signal,
    StatOk,
    StatRequest,
    StatusOk,
    StatusRequest,
    WholeJob,
    encode_request,
)

HELLO_KEY = bytes.fromhex("ea8f163db38682925e4491c5e58d4bb3506ef8c14eb78a86e908c5624a67200f")
KEY = bytes(range(32))
JOB = bytes(range(100, 116))


def drain(connection: ServerConnection | ClientConnection) -> list[Any]:
    """Every event the buffered bytes make, merging body chunks so that feeding the same
    bytes in different pieces yields the same list."""
    events: list[Any] = []
    while True:
        event = connection.next_event()
        if event is NEED_DATA:
            return events
        if isinstance(event, Data) and events and isinstance(events[-1], Data):
            events[-1] = Data(bytes(events[-1].data) + bytes(event.data))
        else:
            events.append(event)
        if event is CLOSED:
            return events


def feed(connection: ServerConnection | ClientConnection, data: bytes, mode: str) -> list[Any]:
    """h11's three ways: the whole buffer, one byte at a time, and in uneven pieces."""
    if mode == "whole":
        connection.receive_data(data)
        return drain(connection)
    step = 1 if mode == "bytewise" else 7
    events: list[Any] = []
    for start in range(0, len(data), step):
        connection.receive_data(data[start : start + step])
        for event in drain(connection):
            if isinstance(event, Data) and events and isinstance(events[-1], Data):
                events[-1] = Data(bytes(events[-1].data) + bytes(event.data))
            else:
                events.append(event)
    return events


MODES = ["whole", "bytewise", "uneven"]

# (request frames, wire bytes) pairs: every request of protocol.md with its exact encoding.
REQUEST_CASES: list[tuple[Sequence[Any], bytes]] = [
    ([PutRequest(0)], b"\x00\x00" + bytes(8)),
    ([GetRequest(ContentKey(KEY), 5)], b"\x01\x00" + KEY + struct.pack("<Q", 5)),
    ([GetRequest(JobBlob(JOB, "a/b"))], b"\x01\x01" + JOB + b"\x03\x00a/b" + bytes(8)),
    ([DeleteRequest(ContentKey(KEY))], b"\x02\x00" + KEY),
    ([DeleteRequest(JobBlob(JOB, ".."))], b"\x02\x01" + JOB + b"\x02\x00.."),
    ([DeleteRequest(WholeJob(JOB))], b"\x02\x02" + JOB),
    ([StatRequest(ContentKey(KEY))], b"\x03\x00" + KEY),
    ([StatRequest(JobBlob(JOB, "x"))], b"\x03\x01" + JOB + b"\x01\x00x"),
    ([ListRequest(JOB)], b"\x04\x02" + JOB),
    ([AuthRequest(KEY)], b"\x7f" + KEY),
    ([StatusRequest()], b"\x06"),
    ([HostsRequest()], b"\x08"),
    ([CheckpointsRequest({"action": "list"})], b"\x09\x11\x00\x00\x00" + b'{"action":"list"}'),
    ([HeartbeatRequest({"agent": "h:1", "jobs": []})], b"\x07\x19\x00\x00\x00" + b'{"agent":"h:1","jobs":[]}'),
]


def server_after_hello() -> ServerConnection:
    server = ServerConnection()
    server.receive_data(b"BLOB\x01\x00")
    assert server.next_event() == Hello()
    return server


def test_spec_example_put_of_hello_is_byte_exact() -> None:
    client = ClientConnection()
    wire = b"".join(
        bytes(client.send(frame))
        for frame in (Hello(), PutRequest(5), Data(b"hello"), PutTrailer(blake3.blake3(b"hello").digest()))
    )
    assert wire == bytes.fromhex("424c4f420100" + "0000" + "0500000000000000" + "68656c6c6f") + HELLO_KEY
    server = ServerConnection()
    server.receive_data(wire)
    assert drain(server) == [Hello(), PutRequest(5), Data(b"hello"), PutTrailer(HELLO_KEY)]
    reply = server.send(ServerHello()) + server.send(PutOk(HELLO_KEY))
    assert reply == b"BLOB\x01\x00" + b"\x00" + HELLO_KEY
    client.receive_data(reply)
    assert drain(client) == [ServerHello(), PutOk(HELLO_KEY)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("frames", "wire"), REQUEST_CASES)
def test_every_request_encodes_and_parses_exactly(frames: Sequence[Any], wire: bytes, mode: str) -> None:
    assert b"".join(encode_request(frame) for frame in frames) == wire
    server = server_after_hello()
    assert feed(server, wire, mode) == list(frames)


@pytest.mark.parametrize("mode", MODES)
def test_put_body_and_trailer_come_out_in_order_however_the_bytes_arrive(mode: str) -> None:
    body = bytes(range(256)) * 40
    digest = blake3.blake3(body).digest()
    wire = encode_request(PutRequest(len(body), JobBlob(JOB, "model.bin"))) + body + digest
    events = feed(server_after_hello(), wire, mode)
    assert events == [PutRequest(len(body), JobBlob(JOB, "model.bin")), Data(body), PutTrailer(digest)]


def test_trailing_bytes_of_the_next_request_are_left_for_it() -> None:
    server = server_after_hello()
    server.receive_data(encode_request(StatRequest(ContentKey(KEY))) + b"\x04")
    assert server.next_event() == StatRequest(ContentKey(KEY))
    assert server.next_event() is NEED_DATA
    assert server.trailing_data == (b"\x04", False)


def test_a_put_body_is_buffered_only_once_its_trailer_is_too() -> None:
    """What lets the server skip the body's deadline: nothing left to wait for."""
    body = b"x" * 100
    wire = encode_request(PutRequest(len(body))) + body + HELLO_KEY
    server = server_after_hello()
    server.receive_data(wire[:-1])
    assert not server.body_buffered  # a header alone is no body
    assert isinstance(server.next_event(), PutRequest)
    assert not server.body_buffered  # one trailer byte still to come
    server.receive_data(wire[-1:])
    assert server.body_buffered
    assert server.next_event() == Data(body)
    assert server.body_buffered
    assert server.next_event() == PutTrailer(HELLO_KEY)
    assert not server.body_buffered


@pytest.mark.parametrize("after", [b"", encode_request(StatRequest(ContentKey(KEY)))])
def test_a_buffered_put_body_and_its_trailer_are_taken_in_one_step(after: bytes) -> None:
    """What the server's reader callback does with a small PUT that came whole: the same
    bytes as the Data frames and trailer, and the next request is left in place."""
    body = b"x" * 100
    server = server_after_hello()
    server.receive_data(encode_request(PutRequest(len(body))) + body + HELLO_KEY[:-1])
    assert isinstance(server.next_event(), PutRequest)
    with pytest.raises(LocalProtocolError, match="buffered"):
        server.take_body()  # one trailer byte still to come
    server.receive_data(HELLO_KEY[-1:] + after)
    assert server.take_body() == (bytearray(body), HELLO_KEY)
    assert server.next_event() == (StatRequest(ContentKey(KEY)) if after else NEED_DATA)
    assert server.between_requests


def test_an_empty_put_body_is_taken_with_its_trailer() -> None:
    server = server_after_hello()
    server.receive_data(encode_request(PutRequest(0)) + KEY)
    assert server.next_event() == PutRequest(0)
    assert server.take_body() == (bytearray(), KEY)
    assert server.between_requests


def test_a_put_body_is_taken_whole_only_mid_body() -> None:
    server = server_after_hello()
    with pytest.raises(LocalProtocolError):
        server.take_body()


def test_put_body_bytes_received_as_bytes_are_passed_on_without_a_copy() -> None:
    server = server_after_hello()
    server.receive_data(encode_request(PutRequest(1 << 20)))
    assert isinstance(server.next_event(), PutRequest)
    chunk = bytes(1 << 20)
    server.receive_data(chunk)
    event = server.next_event()
    assert isinstance(event, Data) and event.data is chunk


@pytest.mark.parametrize(
    ("wire", "code", "words"),
    [
        (b"GET / HTTP/1.1\r\n", 1, "magic"),
        (b"BLOC", 1, "magic"),
        (b"BLOB\x02\x00", 10, "version 2"),
        (b"BLOB\x01\x01", 1, "flags"),
        (b"BLOB\x01\x00\x0a", 1, "opcode 0x0a"),
        (b"BLOB\x01\x00\x01\x07", 1, "addressing byte 0x07"),
        (b"BLOB\x01\x00\x01\x02", 1, "GET does not take addressing JOB_ALL"),
        (b"BLOB\x01\x00\x00\x02", 1, "PUT does not take addressing JOB_ALL"),
        (b"BLOB\x01\x00\x03\x02", 1, "STAT does not take addressing JOB_ALL"),
        (b"BLOB\x01\x00\x04\x00", 1, "LIST does not take addressing CONTENT"),
        (b"BLOB\x01\x00\x01\x01" + JOB + b"\x00\x00", 1, "1 to 255 bytes"),
        (b"BLOB\x01\x00\x01\x01" + JOB + b"\x00\x01", 1, "1 to 255 bytes"),
        (b"BLOB\x01\x00\x01\x01" + JOB + b"\x03\x00a\x00b", 1, "NUL"),
        (b"BLOB\x01\x00\x01\x01" + JOB + b"\x02\x00\xff\xfe", 1, "UTF-8"),
    ],
)
def test_malformed_input_raises_remote_error_with_its_code(wire: bytes, code: int, words: str) -> None:
    server = ServerConnection()
    server.receive_data(wire)
    with pytest.raises(RemoteProtocolError, match=words) as caught:
        drain(server)
    assert caught.value.code == code


def test_wrong_magic_is_caught_at_the_first_wrong_byte() -> None:
    server = ServerConnection()
    server.receive_data(b"X")
    with pytest.raises(RemoteProtocolError, match="magic"):
        server.next_event()


def test_a_255_byte_name_is_accepted_and_256_is_not() -> None:
    longest = "n" * MAX_NAME_BYTES
    assert feed(server_after_hello(), encode_request(StatRequest(JobBlob(JOB, longest))), "whole") == [
        StatRequest(JobBlob(JOB, longest))
    ]
    with pytest.raises(LocalProtocolError):
        JobBlob(JOB, longest + "n")


def test_clean_close_between_requests_is_closed_and_mid_frame_is_an_error() -> None:
    server = server_after_hello()
    server.receive_data(b"")
    assert server.next_event() is CLOSED
    server = server_after_hello()
    server.receive_data(b"\x01\x00" + KEY[:10])
    server.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="mid-frame"):
        server.next_event()


def test_short_put_body_then_close_is_an_error() -> None:
    server = server_after_hello()
    server.receive_data(encode_request(PutRequest(100)) + b"x" * 10)
    assert isinstance(server.next_event(), PutRequest)
    assert server.next_event() == Data(b"x" * 10)
    server.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        server.next_event()


# --- client side --------------------------------------------------------------------------


def client_after_hello(nonce: bytes | None = None) -> ClientConnection:
    client = ClientConnection()
    client.send(Hello())
    client.receive_data(ServerConnection().send(ServerHello(nonce=nonce)))
    assert client.next_event() == ServerHello(nonce=nonce)
    return client


@pytest.mark.parametrize("mode", MODES)
def test_client_parses_every_reply_matching_pipelined_requests(mode: str) -> None:
    client = client_after_hello()
    server = ServerConnection()
    body = b"0123456789" * 100
    requests_and_replies: list[tuple[Any, list[Any]]] = [
        (GetRequest(ContentKey(KEY), 3), [GetOk(len(body), KEY, 3)]),
        (StatRequest(ContentKey(KEY)), [StatOk(7, KEY)]),
        (DeleteRequest(WholeJob(JOB)), [DeleteOk()]),
        (ListRequest(JOB), [ListOk((ListEntry("a", 1, KEY), ListEntry("é/..", 2, HELLO_KEY)))]),
        (ListRequest(JOB), [ListOk(())]),
        (AuthRequest(KEY), [AuthOk()]),
        (GetRequest(JobBlob(JOB, "x")), [ErrorFrame(2, "no such blob")]),
    ]
    wire = b""
    for request, replies in requests_and_replies:
        client.send(request)
        wire += b"".join(server.send(reply) for reply in replies)
        if isinstance(replies[0], GetOk):
            wire += body[3:]
    expected = [
        GetOk(len(body), KEY, 3),
        Data(body[3:]),
        EndOfBody(),
        StatOk(7, KEY),
        DeleteOk(),
        ListOk((ListEntry("a", 1, KEY), ListEntry("é/..", 2, HELLO_KEY))),
        ListOk(()),
        AuthOk(),
        ErrorFrame(2, "no such blob"),
    ]
    assert feed(client, wire, mode) == expected
    assert client.pending == 0 and not client.closed


@pytest.mark.parametrize("mode", MODES)
def test_a_status_reply_is_a_length_prefixed_json_object(mode: str) -> None:
    status = {"version": "1.0", "blobs": 2, "requests": {"GET": 1}}
    wire = ServerConnection().send(StatusOk(status))
    document = b'{"version":"1.0","blobs":2,"requests":{"GET":1}}'
    assert wire == b"\x00" + struct.pack("<I", len(document)) + document
    client = client_after_hello()
    client.send(StatusRequest())
    client.send(StatRequest(ContentKey(KEY)))  # pipelined behind it
    assert feed(client, wire + ServerConnection().send(StatOk(1, KEY)), mode) == [StatusOk(status), StatOk(1, KEY)]


@pytest.mark.parametrize(
    ("document", "words"),
    [(b"[1, 2]", "not a JSON object"), (b"{nope", "not UTF-8 JSON"), (b'{"\xff": 1}', "not UTF-8 JSON")],
)
def test_a_status_reply_that_is_no_json_object_is_a_remote_error(document: bytes, words: str) -> None:
    client = client_after_hello()
    client.send(StatusRequest())
    client.receive_data(b"\x00" + struct.pack("<I", len(document)) + document)
    with pytest.raises(RemoteProtocolError, match=words):
        client.next_event()


@pytest.mark.parametrize(
    ("request_", "frame", "limit"),
    [(StatusRequest(), StatusOk, MAX_STATUS_BYTES), (HostsRequest(), HostsOk, MAX_HOSTS_BYTES)],
)
def test_a_status_or_hosts_reply_over_the_limit_is_refused_before_it_is_buffered(
    request_: Any, frame: Any, limit: int
) -> None:
    client = client_after_hello()
    client.send(request_)
    client.receive_data(b"\x00" + struct.pack("<I", limit + 1))
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        client.next_event()
    with pytest.raises(LocalProtocolError, match="over the limit"):
        ServerConnection().send(frame({"x": "y" * limit}))


@pytest.mark.parametrize("mode", MODES)
def test_a_hosts_reply_is_a_length_prefixed_json_object(mode: str) -> None:
    hosts = {"hosts": [{"agent": "h:1", "state": "live"}], "now": 1.5}
    wire = ServerConnection().send(HostsOk(hosts))
    document = b'{"hosts":[{"agent":"h:1","state":"live"}],"now":1.5}'
    assert wire == b"\x00" + struct.pack("<I", len(document)) + document
    client = client_after_hello()
    client.send(HostsRequest())
    client.send(StatRequest(ContentKey(KEY)))  # pipelined behind it
    assert feed(client, wire + ServerConnection().send(StatOk(1, KEY)), mode) == [HostsOk(hosts), StatOk(1, KEY)]


@pytest.mark.parametrize("mode", MODES)
def test_a_heartbeat_reply_is_a_length_prefixed_json_object(mode: str) -> None:
    reply = {"interval": 10.0, "lost_after": 30.0, "gone_jobs": [JOB.hex()]}
    wire = ServerConnection().send(HeartbeatOk(reply))
    document = b'{"interval":10.0,"lost_after":30.0,"gone_jobs":["' + JOB.hex().encode() + b'"]}'
    assert wire == b"\x00" + struct.pack("<I", len(document)) + document
    client = client_after_hello()
    client.send(HeartbeatRequest({"agent": "h:1"}))
    client.send(StatRequest(ContentKey(KEY)))  # pipelined behind it
    assert feed(client, wire + ServerConnection().send(StatOk(1, KEY)), mode) == [HeartbeatOk(reply), StatOk(1, KEY)]


def test_the_heartbeat_example_of_the_spec_is_byte_exact() -> None:
    report = {"agent": "10.0.0.7:6140", "jobs": ["00112233445566778899aabbccddeeff"]}
    request = bytes.fromhex("0745000000") + b'{"agent":"10.0.0.7:6140","jobs":["00112233445566778899aabbccddeeff"]}'
    assert encode_request(HeartbeatRequest(report)) == request
    reply = {"interval": 10.0, "lost_after": 30.0, "gone_jobs": []}
    assert ServerConnection().send(HeartbeatOk(reply)) == bytes.fromhex("0032000000") + (
        b'{"interval":10.0,"lost_after":30.0,"gone_jobs":[]}'
    )


def test_the_bytes_after_a_heartbeat_are_left_for_the_next_request() -> None:
    server = server_after_hello()
    server.receive_data(encode_request(HeartbeatRequest({"agent": "h:1"})) + b"\x06\x04")
    assert server.next_event() == HeartbeatRequest({"agent": "h:1"})
    assert server.next_event() == StatusRequest()
    assert server.next_event() is NEED_DATA
    assert server.trailing_data == (b"\x04", False)


DEEP = b"[" * 5000  # past Python's recursion limit: json.loads raises RecursionError, not ValueError


@pytest.mark.parametrize(
    ("document", "words"),
    [
        (b"[1, 2]", "not a JSON object"),
        (b'"agent"', "not a JSON object"),
        (b"{nope", "not UTF-8 JSON"),
        (b'{"\xff": 1}', "not UTF-8 JSON"),
        (b"", "not UTF-8 JSON"),
        (DEEP, "not UTF-8 JSON"),
    ],
)
def test_a_heartbeat_that_is_no_json_object_is_a_bad_request(document: bytes, words: str) -> None:
    server = server_after_hello()
    server.receive_data(b"\x07" + struct.pack("<I", len(document)) + document)
    with pytest.raises(RemoteProtocolError, match=f"heartbeat document is {words}") as caught:
        server.next_event()
    assert caught.value.code == 1


@pytest.mark.parametrize("request_", [StatusRequest(), HeartbeatRequest({}), HostsRequest()])
def test_a_document_reply_nested_past_the_recursion_limit_is_a_remote_error(request_: Any) -> None:
    client = client_after_hello()
    client.send(request_)
    client.receive_data(b"\x00" + struct.pack("<I", len(DEEP)) + DEEP)
    with pytest.raises(RemoteProtocolError, match="not UTF-8 JSON"):
        client.next_event()


def test_a_heartbeat_over_the_limit_is_refused_before_it_is_buffered() -> None:
    server = server_after_hello()
    server.receive_data(b"\x07" + struct.pack("<I", MAX_HEARTBEAT_BYTES + 1))
    with pytest.raises(RemoteProtocolError, match="over the limit") as caught:
        server.next_event()
    assert caught.value.code == 1
    client = client_after_hello()
    client.send(HeartbeatRequest({}))
    client.receive_data(b"\x00" + struct.pack("<I", MAX_HEARTBEAT_BYTES + 1))
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        client.next_event()
    too_large = {"x": "y" * MAX_HEARTBEAT_BYTES}
    client = client_after_hello()
    with pytest.raises(LocalProtocolError, match="over the limit"):
        client.send(HeartbeatRequest(too_large))
    assert client.pending == 0  # nothing was sent, no reply is awaited: the connection can go on
    with pytest.raises(LocalProtocolError, match="over the limit"):
        ServerConnection().send(HeartbeatOk(too_large))


def test_a_heartbeat_of_exactly_the_limit_is_taken() -> None:
    report = {"x": "y" * (MAX_HEARTBEAT_BYTES - len(b'{"x":""}'))}
    wire = encode_request(HeartbeatRequest(report))
    assert len(wire) == 1 + 4 + MAX_HEARTBEAT_BYTES
    server = server_after_hello()
    server.receive_data(wire)
    assert server.next_event() == HeartbeatRequest(report)


def test_a_heartbeat_that_json_cannot_hold_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="plain JSON"):
        encode_request(HeartbeatRequest({"when": object()}))


@pytest.mark.parametrize("mode", MODES)
def test_a_checkpoints_reply_is_a_length_prefixed_json_object(mode: str) -> None:
    reply = {"id": 7}
    wire = ServerConnection().send(CheckpointsOk(reply))
    assert wire == b"\x00" + struct.pack("<I", 8) + b'{"id":7}'
    client = client_after_hello()
    client.send(CheckpointsRequest({"action": "trigger"}))
    client.send(StatRequest(ContentKey(KEY)))  # pipelined behind it
    assert feed(client, wire + ServerConnection().send(StatOk(1, KEY)), mode) == [CheckpointsOk(reply), StatOk(1, KEY)]


def test_the_checkpoints_example_of_the_spec_is_byte_exact() -> None:
    request = {"action": "trigger", "pipeline": "clicks", "epoch": 1, "timeout": 600}
    wire = bytes.fromhex("0940000000") + b'{"action":"trigger","pipeline":"clicks","epoch":1,"timeout":600}'
    assert encode_request(CheckpointsRequest(request)) == wire
    assert ServerConnection().send(CheckpointsOk({"id": 1})) == bytes.fromhex("0008000000") + b'{"id":1}'


def test_a_checkpoints_request_or_reply_over_its_limit_is_refused_before_it_is_buffered() -> None:
    server = server_after_hello()
    server.receive_data(b"\x09" + struct.pack("<I", MAX_CHECKPOINTS_REQUEST_BYTES + 1))
    with pytest.raises(RemoteProtocolError, match=r"checkpoints request document of .* over the limit") as caught:
        server.next_event()
    assert caught.value.code == 1
    client = client_after_hello()
    with pytest.raises(LocalProtocolError, match="over the limit"):
        client.send(CheckpointsRequest({"x": "y" * MAX_CHECKPOINTS_REQUEST_BYTES}))
    client.send(CheckpointsRequest({"action": "list"}))
    client.receive_data(b"\x00" + struct.pack("<I", MAX_CHECKPOINTS_REPLY_BYTES + 1))
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        client.next_event()


def test_server_hello_with_auth_carries_the_nonce() -> None:
    nonce = bytes(range(32))
    assert ServerConnection().send(ServerHello(nonce=nonce)) == b"BLOB\x01\x01" + nonce
    assert client_after_hello(nonce).server_hello == ServerHello(nonce=nonce)


def test_error_frame_bytes_follow_the_spec() -> None:
    assert ServerConnection().send(ErrorFrame(4, "too big")) == b"\x01\x04\x00\x07\x00\x00\x00too big"


def test_a_refusal_at_the_door_replaces_the_server_hello() -> None:
    client = ClientConnection()
    client.send(Hello())
    client.receive_data(ServerConnection().send(ErrorFrame(8, "busy")))
    assert client.next_event() == ErrorFrame(8, "busy")
    assert client.closed


@pytest.mark.parametrize(("code", "stays_open"), [(1, False), (2, True), (3, True), (4, False), (12, True)])
def test_connection_state_after_an_error_follows_the_table(code: int, stays_open: bool) -> None:
    client = client_after_hello()
    client.send(StatRequest(ContentKey(KEY)))
    client.receive_data(ServerConnection().send(ErrorFrame(code, "")))
    assert client.next_event() == ErrorFrame(code, "")
    assert client.closed is not stays_open


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("server", "message"),
    [
        (b"blobsvc", "is a blobsvc HTTP face (a server's --http-port, or an agent), not the binary protocol port"),
        (b"nginx", "answered HTTP: it is an HTTP server, not the binary protocol port"),
    ],
)
def test_an_http_reply_in_place_of_the_server_hello_names_the_wrong_port(
    mode: str, server: bytes, message: str
) -> None:
    client = ClientConnection("blobs.example:6180")
    client.send(Hello())
    with pytest.raises(RemoteProtocolError) as raised:
        feed(client, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nServer: " + server + b"\r\n\r\n", mode)
    assert str(raised.value) == f"blobs.example:6180 {message}"
    assert client.closed


def test_an_http_reply_cut_short_still_names_the_wrong_port() -> None:
    client = ClientConnection("blobs.example:6180")
    client.send(Hello())
    client.receive_data(b"HTTP/1.1 400 Bad")
    client.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="answered HTTP: it is an HTTP server"):
        client.next_event()


@pytest.mark.parametrize(("first", "http"), [(b"GET /blobs/ab HTTP/1.1\r\n", True), (b"HELO", False)])
def test_a_server_tells_an_http_request_from_a_bad_preamble(first: bytes, http: bool) -> None:
    server = ServerConnection()
    server.receive_data(first)
    with pytest.raises(RemoteProtocolError):
        server.next_event()
    assert server.http_request is http


def test_server_closing_mid_reply_is_connection_closed() -> None:
    client = client_after_hello()
    client.send(GetRequest(ContentKey(KEY)))
    client.receive_data(ServerConnection().send(GetOk(10, KEY)) + b"abc")
    assert isinstance(client.next_event(), GetOk)
    assert client.next_event() == Data(b"abc")
    client.receive_data(b"")
    with pytest.raises(ConnectionClosed):
        client.next_event()


def test_unsolicited_bytes_and_unknown_status_are_remote_errors() -> None:
    client = client_after_hello()
    client.receive_data(b"\x00")
    with pytest.raises(RemoteProtocolError, match="nobody asked"):
        client.next_event()
    client = client_after_hello()
    client.send(DeleteRequest(ContentKey(KEY)))
    client.receive_data(b"\x07")
    with pytest.raises(RemoteProtocolError, match="status"):
        client.next_event()


def test_client_refuses_to_send_a_body_that_does_not_match_its_header() -> None:
    client = client_after_hello()
    client.send(PutRequest(3))
    with pytest.raises(LocalProtocolError):
        client.send(Data(b"four"))
    client.send(Data(b"abc"))
    with pytest.raises(LocalProtocolError):
        client.send(StatRequest(ContentKey(KEY)))  # the trailer is still owed
    client.send(PutTrailer(KEY))
    client.send(StatRequest(ContentKey(KEY)))


@pytest.mark.parametrize(
    "make",
    [
        lambda: ContentKey(b"short"),
        lambda: WholeJob(b"x" * 15),
        lambda: JobBlob(JOB, ""),
        lambda: JobBlob(JOB, "a\x00b"),
        lambda: GetRequest(ContentKey(KEY), -1),
        lambda: PutRequest(1 << 64),
    ],
)
def test_invalid_frames_cannot_be_built(make: Callable[[], object]) -> None:
    with pytest.raises(LocalProtocolError):
        make()


@given(name=st.text(min_size=1, max_size=60).filter(lambda n: "\x00" not in n and len(n.encode()) <= 255))
def test_any_valid_name_round_trips(name: str) -> None:
    try:
        target = JobBlob(JOB, name)
    except LocalProtocolError:  # lone surrogates are not UTF-8
        return
    server = server_after_hello()
    server.receive_data(encode_request(GetRequest(target)))
    assert server.next_event() == GetRequest(target)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_server_parser(data: bytes) -> None:
    server = ServerConnection()
    server.receive_data(data)
    try:
        while (event := server.next_event()) is not NEED_DATA and event is not CLOSED:
            pass
    except RemoteProtocolError:
        pass


def test_protocol_module_does_no_io() -> None:
    source = Path(__file__).parent.parent / "blobsvc" / "wire" / "_protocol.py"
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert not imported & {"asyncio", "socket", "selectors", "ssl", "os"}


def test_signals_are_distinct_sentinels() -> None:
    assert NEED_DATA is Signal.NEED_DATA and CLOSED is Signal.CLOSED
    assert repr(NEED_DATA) == "NEED_DATA"


def test_body_read_past_the_parser_is_accounted_and_ends_where_the_header_said() -> None:
    client = client_after_hello()
    client.send(GetRequest(ContentKey(KEY)))
    client.receive_data(ServerConnection().send(GetOk(10, KEY)) + b"abc")
    assert isinstance(client.next_event(), GetOk)
    assert client.body_unread == 7  # three of the ten are buffered
    with pytest.raises(LocalProtocolError, match="nothing buffered"):
        client.body_received(2)  # they would land ahead of the buffered three
    assert client.next_event() == Data(b"abc")
    assert client.next_event() is NEED_DATA
    with pytest.raises(LocalProtocolError, match="7 left"):
        client.body_received(8)
    client.body_received(7)
    assert client.body_unread == 0
    assert isinstance(client.next_event(), EndOfBody)
    with pytest.raises(LocalProtocolError):
        client.body_received(1)  # no body in progress


def test_no_body_is_unread_outside_a_get() -> None:
    client = client_after_hello()
    assert client.body_unread == 0
    client.send(StatRequest(ContentKey(KEY)))
    assert client.body_unread == 0
