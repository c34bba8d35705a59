"""Retention policies (keep all, newest N, best N by a score) and keep, against a real server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from blobsvc._exceptions import BadRequest, InvalidArgument, NotFound
from blobsvc.checkpoints import CheckpointStore
from tests.conftest import ServerThread


@pytest.fixture
def address(server_thread: ServerThread) -> Iterator[str]:
    yield server_thread.address


def take(store: CheckpointStore, **properties: object) -> int:
    with store.begin(tasks=["0"], properties=properties) as pending:
        pending.acknowledge("0", store.snapshot("0", b"state"))
    return pending.id


def kept(store: CheckpointStore) -> list[int]:
    return [record["id"] for record in store.records()]


def test_retain_none_keeps_every_checkpoint(address: str) -> None:
    with CheckpointStore(address, "all", retain=None) as store:
        ids = [take(store) for _ in range(4)]
        assert kept(store) == ids


@pytest.mark.parametrize(
    ("order", "losses", "expected"), [("min", [5, 1, 3, 9, 2], [1, 2]), ("max", [5, 1, 3, 9, 2], [5, 9])]
)
def test_the_best_n_by_a_score_and_the_latest_are_kept(
    address: str, order: str, losses: list[int], expected: list[int]
) -> None:
    with CheckpointStore(address, f"best-{order}", retain=2, score="loss", score_order=order) as store:
        ids = {loss: take(store, loss=loss) for loss in losses}
        survivors = {ids[loss] for loss in expected} | {ids[losses[-1]]}
        assert kept(store) == sorted(survivors)
        best = store.best()
        assert best is not None and best.properties["loss"] == expected[0 if order == "min" else -1]
        newest = take(store, loss=100 if order == "min" else -100)  # the worst: kept only as the latest
        assert kept(store) == sorted({ids[loss] for loss in expected} | {newest})


def test_a_checkpoint_without_a_numeric_score_is_refused(address: str) -> None:
    with CheckpointStore(address, "scored", retain=1, score="loss", score_order="min") as store:
        for properties in ({}, {"loss": "low"}, {"loss": True}, {"loss": float("nan")}):
            with pytest.raises(InvalidArgument, match="loss"):
                store.begin(tasks=["0"], properties=properties)
        with store.begin(tasks=["0"], savepoint=True) as savepoint:  # savepoints are outside every policy
            savepoint.acknowledge("0", store.snapshot("0", b"s"))
        best, latest, worst = take(store, loss=0.5), take(store, loss=1.5), take(store, loss=2.5)
        assert kept(store) == [savepoint.id, best, worst] and latest not in kept(store)
    # The server does not take the client's word: a coordinator that asks for a score policy
    # and completes a checkpoint without the property (the store's check bypassed).
    with CheckpointStore(address, "scored-raw", retain=1) as store:
        pending = store.begin(tasks=["0"])
        pending.acknowledge("0", store.snapshot("0", b"x"))
        store.coordinator.options = replace(store.options, score="loss")
        with pytest.raises(BadRequest, match="'loss'"):
            store.coordinator.finish(pending)
        assert kept(store) == []


def test_keep_makes_a_checkpoint_a_savepoint_never_subsumed(address: str) -> None:
    with CheckpointStore(address, "keeper", retain=1) as store:
        first = take(store)
        store.keep(first)
        second = take(store)
        third = take(store)
        assert kept(store) == [first, third] and second not in kept(store)
        assert store.history()[-1]["kind"] == "savepoint"
        with pytest.raises(NotFound):
            store.keep(second)
