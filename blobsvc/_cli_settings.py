"""Command-line options that are settings: each has its setting's help text, and what the
command line leaves unset comes from the environment, the TOML file or the default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from .config import Settings

__all__ = ["load_settings", "setting_option"]

_F = TypeVar("_F", bound=Callable[..., Any])


def setting_option(name: str, *decls: str, **kwargs: Any) -> Callable[[_F], _F]:
    """An option ``--<name>`` (and ``decls``) for a setting; unset means "not given"."""
    flag = "--" + name.replace("_", "-")
    return click.option(flag, *decls, name, default=None, help=Settings.help(name), **kwargs)


def load_settings(ctx: click.Context, options: dict[str, Any]) -> Settings:
    """The settings with ``options`` from the command line on top; a bad value is a usage error."""
    try:
        return Settings.load(options, config_file=ctx.find_root().obj)
    except (ValueError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
