"""``blobsvc checkpoints list | show | history | restore | keep | delete``: a pipeline's checkpoints.

Built by :func:`checkpoints_group` with the command line's client options and error handling
(this module never imports the CLI's own), so that ``-s``, the secret and the TLS files work
here as in every other command. The client and the checkpoints are imported when a command
runs, not when ``--help`` is asked for. A mistake found once a command runs (a destination that
exists, a task the checkpoint lacks) is one ``Error:`` line and exit status 1, not a usage block.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import click

from .._exceptions import CheckpointError, InvalidArgument
from ._cli_settings import load_settings
from ._text import when

if TYPE_CHECKING:
    from ..checkpoints import CheckpointStore, CompletedCheckpoint

__all__ = ["checkpoints_group"]

_F = TypeVar("_F", bound=Callable[..., Any])


class _Options(Protocol):
    def __call__(self, command: _F, /) -> _F: ...


def checkpoints_group(
    client_options: _Options,
    client_settings: tuple[str, ...],
    errors: Callable[[], contextlib.AbstractContextManager[None]],
) -> click.Group:
    """The ``checkpoints`` group: ``client_options`` adds the options named ``client_settings``;
    ``errors()`` turns blobsvc's errors into one line."""

    @contextlib.contextmanager
    def opened(ctx: click.Context, args: dict[str, Any], pipeline: str) -> Iterator[CheckpointStore]:
        from ..checkpoints import CheckpointStore
        from ..client import BlobClient

        settings = load_settings(ctx, {name: args.pop(name) for name in client_settings})
        with (
            errors(),
            BlobClient.from_settings(settings, one_shot=True) as client,
            CheckpointStore(client, pipeline) as store,
        ):
            try:
                yield store
            except InvalidArgument as exc:  # the arguments parsed; what they name does not fit
                raise click.ClickException(str(exc)) from None

    @click.group(name="checkpoints")
    def checkpoints() -> None:
        """A pipeline's checkpoints on the server: list, show, history, restore, keep, delete."""

    @checkpoints.command(name="list")
    @click.argument("pipeline")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object per checkpoint.")
    @client_options
    @click.pass_context
    def list_(ctx: click.Context, /, pipeline: str, as_json: bool, **args: Any) -> None:
        """List PIPELINE's completed checkpoints, oldest first: id, time, kind (checkpoint or
        savepoint), tasks, bytes of state; one that cannot be restored says why."""
        with opened(ctx, args, pipeline) as store:
            records = store.records()
            if not records:
                click.echo(f"pipeline {pipeline} has no completed checkpoint on this server", err=True)
            for record in records:
                try:
                    checkpoint = store.load(record) if "problem" not in record else None
                    problem = record.get("problem")
                except CheckpointError as exc:
                    checkpoint, problem = None, str(exc)
                if as_json:
                    document = checkpoint.to_json() if checkpoint is not None else {"id": record["id"]}
                    document["tasks"] = len(checkpoint.tasks) if checkpoint is not None else None
                    click.echo(json.dumps({**document, "problem": problem}, sort_keys=True))
                elif checkpoint is None:
                    click.echo(f"{record['id']}\t-\tDAMAGED\t{problem}")
                else:
                    kind = "savepoint" if checkpoint.savepoint else "checkpoint"
                    line = f"{checkpoint.id}\t{when(checkpoint.timestamp)}\t{kind}\t{len(checkpoint.tasks)}"
                    click.echo(f"{line}\t{checkpoint.size}")

    @checkpoints.command()
    @click.argument("pipeline")
    @click.argument("checkpoint_id", metavar="[ID]", type=int, required=False)
    @click.option("--json", "as_json", is_flag=True, help="Print the checkpoint as one JSON object.")
    @client_options
    @click.pass_context
    def show(ctx: click.Context, /, pipeline: str, checkpoint_id: int | None, as_json: bool, **args: Any) -> None:
        """Show checkpoint ID of PIPELINE (the latest that can be restored when no ID is
        given): its time, properties, and each task's files and bytes."""
        with opened(ctx, args, pipeline) as store:
            checkpoint = _chosen(store, checkpoint_id)
            if as_json:
                click.echo(json.dumps(checkpoint.to_json(), sort_keys=True))
                return
            click.echo(f"checkpoint {checkpoint.id} of {pipeline}{' (savepoint)' if checkpoint.savepoint else ''}")
            click.echo(f"taken: {when(checkpoint.timestamp)}")
            click.echo(f"properties: {json.dumps(dict(checkpoint.properties), sort_keys=True)}")
            click.echo(f"state: {checkpoint.size} bytes")
            for task, handle in sorted(checkpoint.tasks.items()):
                click.echo(f"task {task}: {handle.kind}, {len(handle.files)} files, {handle.size} bytes")

    @checkpoints.command()
    @click.argument("pipeline")
    @click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True, help="At most this many.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object per checkpoint.")
    @client_options
    @click.pass_context
    def history(ctx: click.Context, /, pipeline: str, limit: int, as_json: bool, **args: Any) -> None:
        """PIPELINE's recent checkpoints as the server saw them, newest first (Flink's
        checkpoint history): id, status, kind, trigger time, duration, tasks acknowledged of
        expected, bytes of state, bytes sent; an aborted one says why."""
        with opened(ctx, args, pipeline) as store:
            entries = store.history(limit)
            if not entries:
                click.echo(f"pipeline {pipeline} has no checkpoint in this server's history", err=True)
            for entry in entries:
                if as_json:
                    click.echo(json.dumps(entry, sort_keys=True))
                    continue
                fields = [
                    entry["id"],
                    entry["status"],
                    entry["kind"],
                    when(entry["trigger_time"]),
                    "-" if entry["duration"] is None else f"{entry['duration']:.3f}s",
                    f"{_dash(entry['acknowledged'])}/{_dash(entry['expected'])}",
                    _dash(entry["state_bytes"]),
                    _dash(entry["bytes_sent"]),
                ]
                if entry["reason"]:
                    fields.append(entry["reason"])
                click.echo("\t".join(map(str, fields)))

    @checkpoints.command()
    @click.argument("pipeline")
    @click.argument("checkpoint_id", metavar="ID", type=int)
    @client_options
    @click.pass_context
    def keep(ctx: click.Context, /, pipeline: str, checkpoint_id: int, **args: Any) -> None:
        """Make completed checkpoint ID of PIPELINE a savepoint: no retention policy subsumes
        it; it stays until deleted."""
        with opened(ctx, args, pipeline) as store:
            store.keep(checkpoint_id)
            click.echo(f"kept checkpoint {checkpoint_id} of {pipeline} as a savepoint")

    @checkpoints.command()
    @click.argument("pipeline")
    @click.argument("checkpoint_id", metavar="[ID]", type=int, required=False)
    @click.option("--task", "-t", help="The task whose state to restore (every task's, under OUTPUT/<task>, if none).")
    @click.option(
        "--output",
        "-o",
        required=True,
        type=click.Path(path_type=Path),
        help="Where to write it: a new path, or an empty directory.",
    )
    @click.option("--writable", is_flag=True, help="Leave the files writable (they are read-only otherwise).")
    @client_options
    @click.pass_context
    def restore(
        ctx: click.Context,
        /,
        pipeline: str,
        checkpoint_id: int | None,
        task: str | None,
        output: Path,
        writable: bool,
        **args: Any,
    ) -> None:
        """Write TASK's state of checkpoint ID of PIPELINE (the latest when no ID is given) to
        OUTPUT, or without --task every task's under OUTPUT/<task>; every byte verified,
        nothing left at OUTPUT when it fails."""
        with opened(ctx, args, pipeline) as store:
            checkpoint = _chosen(store, checkpoint_id)
            if task is None:
                checkpoint.restore_all(output, writable=writable)
                click.echo(f"restored {len(checkpoint.tasks)} tasks of checkpoint {checkpoint.id} to {output}")
                return
            checkpoint.restore(task, output, writable=writable)
            click.echo(f"restored task {task} of checkpoint {checkpoint.id} to {output}")

    @checkpoints.command()
    @click.argument("pipeline")
    @click.argument("checkpoint_id", metavar="ID", type=int)
    @client_options
    @click.pass_context
    def delete(ctx: click.Context, /, pipeline: str, checkpoint_id: int, **args: Any) -> None:
        """Delete checkpoint (or savepoint) ID of PIPELINE; its state goes unless a retained
        checkpoint or a restore under way still uses it."""
        with opened(ctx, args, pipeline) as store:
            discarded = store.delete(checkpoint_id)
            click.echo(f"deleted checkpoint {checkpoint_id} of {pipeline}; {discarded} blobs of state discarded")

    return checkpoints


def _chosen(store: CheckpointStore, checkpoint_id: int | None) -> CompletedCheckpoint:
    if checkpoint_id is not None:
        return store.get(checkpoint_id)
    latest = store.latest()
    if latest is None:
        raise click.ClickException(f"pipeline {store.pipeline} has no completed checkpoint that can be restored")
    return latest


def _dash(value: object) -> object:
    return "-" if value is None else value
