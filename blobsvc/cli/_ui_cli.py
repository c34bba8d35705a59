"""``blobsvc ui``: the link to the operator's page, signed when the server has a secret."""

from __future__ import annotations

from typing import Any

import click

from ._cli_settings import load_settings, setting_option

__all__ = ["ui"]

DEFAULT_VALID_FOR = 8 * 3600.0  # a working day


@click.command()
@click.option(
    "--http-url",
    help="Base URL of the server's HTTP face, e.g. http://blobs.example.org:6180 "
    "(default: http://<--server host>:<--http-port>, https:// when tls_ca is set).",
)
@click.option(
    "--valid-for", type=click.FloatRange(min=1, max=366 * 86400), default=DEFAULT_VALID_FOR, show_default=True,
    help="Seconds the link, and the cookie it sets in the browser that opens it, stay valid.",
)  # fmt: skip
@setting_option("server", "-s")
@setting_option("http_port")
@setting_option("secret_file", type=click.Path(dir_okay=False, exists=True))
@click.pass_context
def ui(ctx: click.Context, /, http_url: str | None, valid_for: float, **options: Any) -> None:
    """Print the link to the operator's page (/ui/ on the server's HTTP face).

    With the shared secret (--secret-file or BLOBSVC_SECRET_FILE) the link is signed: opening
    it sets a cookie for the page, valid as long as the link. Treat it as a password.
    """
    from ..ui import page_link

    settings = load_settings(ctx, options)
    http_url = http_url or settings.http_url
    if http_url is None:
        raise click.UsageError("give --http-url, or --http-port (one port) to go with --server's host")
    click.echo(page_link(http_url, settings.secret(), valid_for))
