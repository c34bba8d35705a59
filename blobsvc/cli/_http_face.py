"""What the commands that print a link to the server's HTTP face share (``url``, ``ui``):
where the face is, and the settings whose secret signs the link."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..config import Settings
from ._cli_settings import load_settings, setting_option

__all__ = ["http_face", "http_face_options"]

_F = TypeVar("_F", bound=Callable[..., Any])

_HTTP_URL = click.option(
    "--http-url",
    help="Base URL of the server's HTTP face, e.g. http://blobs.example.org:6180 "
    "(default: http://<--server host>:<--http-port>, https:// when tls_ca is set).",
)
_SETTINGS = (
    setting_option("server", "-s"),
    setting_option("http_port"),
    setting_option("secret_file", type=click.Path(dir_okay=False, exists=True)),
)


def http_face_options(command: _F) -> _F:
    """``--http-url`` and the settings that find the face and sign the link: --server,
    --http-port, --secret-file."""
    for option in reversed((_HTTP_URL, *_SETTINGS)):
        command = option(command)
    return command


def http_face(ctx: click.Context, options: dict[str, Any], http_url: str | None) -> tuple[str, Settings]:
    """The face's base URL (``--http-url``, else the settings') and the settings; a usage
    error (exit 2) when neither names it."""
    settings = load_settings(ctx, options)
    http_url = http_url or settings.http_url
    if http_url is None:
        raise click.UsageError("give --http-url, or --http-port (one port) to go with --server's host")
    return http_url, settings
