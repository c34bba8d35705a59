"""``blobsvc ui``: the link to the operator's page, signed when the server has a secret."""

from __future__ import annotations

from typing import Any

import click

from ._http_face import http_face, http_face_options

__all__ = ["ui"]

DEFAULT_VALID_FOR = 8 * 3600.0  # a working day


@click.command()
@http_face_options
@click.option(
    "--valid-for", type=click.FloatRange(min=1, max=366 * 86400), default=DEFAULT_VALID_FOR, show_default=True,
    help="Seconds the link, and the cookie it sets in the browser that opens it, stay valid.",
)  # fmt: skip
@click.pass_context
def ui(ctx: click.Context, /, http_url: str | None, valid_for: float, **options: Any) -> None:
    """Print the link to the operator's page (/ui/ on the server's HTTP face).

    With the shared secret (--secret-file or BLOBSVC_SECRET_FILE) the link is signed: opening
    it sets a cookie for the page, valid as long as the link. Treat it as a password.
    """
    from ..ui import page_link

    http_url, settings = http_face(ctx, options, http_url)
    click.echo(page_link(http_url, settings.secret(), valid_for))
