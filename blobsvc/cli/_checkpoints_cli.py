"""``blobsvc checkpoints list | show | restore | delete``: a pipeline's checkpoints on a server.

Built by :func:`checkpoints_group` with the command line's client options and error handling
(this module never imports the CLI's own), so that ``-s``, the secret and the TLS files work
here as in every other command. The client and the checkpoints are imported when a command
runs, not when ``--help`` is asked for.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import click

from .._exceptions import CheckpointError
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
            yield store

    @click.group(name="checkpoints")
    def checkpoints() -> None:
        """A pipeline's completed checkpoints on the server: list, show, restore, delete."""

    @checkpoints.command(name="list")
    @click.argument("pipeline")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object per checkpoint.")
    @client_options
    @click.pass_context
    def list_(ctx: click.Context, /, pipeline: str, as_json: bool, **args: Any) -> None:
        """List PIPELINE's completed checkpoints, oldest first: id, time, kind (checkpoint or
        savepoint), tasks, bytes of state; one that cannot be restored says why."""
        with opened(ctx, args, pipeline) as store:
            for record in store.records():
                try:
                    checkpoint = store.load(record) if "problem" not in record else None
                    problem = record.get("problem")
                except CheckpointError as exc:
                    checkpoint, problem = None, str(exc)
                if as_json:
                    document = checkpoint.to_json() if checkpoint is not None else {"id": record["id"]}
                    document.pop("tasks", None)
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
    @click.argument("checkpoint_id", metavar="[ID]", type=int, required=False)
    @click.option("--task", "-t", required=True, help="The task whose state to restore.")
    @click.option(
        "--output", "-o", required=True, type=click.Path(path_type=Path), help="Where to write it (must not exist)."
    )
    @click.option("--writable", is_flag=True, help="Leave the files writable (they are read-only otherwise).")
    @client_options
    @click.pass_context
    def restore(
        ctx: click.Context,
        /,
        pipeline: str,
        checkpoint_id: int | None,
        task: str,
        output: Path,
        writable: bool,
        **args: Any,
    ) -> None:
        """Write TASK's state of checkpoint ID of PIPELINE (the latest when no ID is given) to
        OUTPUT, every byte verified; nothing is left at OUTPUT when it fails."""
        with opened(ctx, args, pipeline) as store:
            checkpoint = _chosen(store, checkpoint_id)
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
            store.delete(checkpoint_id)

    return checkpoints


def _chosen(store: CheckpointStore, checkpoint_id: int | None) -> CompletedCheckpoint:
    if checkpoint_id is not None:
        return store.get(checkpoint_id)
    latest = store.latest()
    if latest is None:
        raise click.ClickException(f"pipeline {store.pipeline} has no completed checkpoint that can be restored")
    return latest
