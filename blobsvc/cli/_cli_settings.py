"""Command-line options that are settings: each has its setting's help text, value syntax and
default, and what the command line leaves unset comes from the environment, the TOML file or
the default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..config import Settings

__all__ = ["config_option", "given_before", "load_settings", "setting_help", "setting_option"]

_F = TypeVar("_F", bound=Callable[..., Any])

CONFIG_HELP = "TOML file of settings (below command-line options and BLOBSVC_* variables)."


def _checker(setting: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """Checks a value with its setting's own parser, so that a bad one is a usage error
    naming the option; the text itself goes on to :meth:`Settings.load`."""

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            try:
                Settings.parse(setting, value)
            except ValueError as exc:
                raise click.BadParameter(str(exc), ctx, param) from None
        return value

    return check


# Where options given before the subcommand wait for it (``blobsvc -s HOST:PORT put f``, as
# git and kubectl take them); ``ctx.meta`` is shared by the group's context and the command's.
_BEFORE = "blobsvc.options_before_the_command"


def _remembered(
    check: Callable[[click.Context, click.Parameter, Any], Any] | None,
) -> Callable[[click.Context, click.Parameter, Any], None]:
    def remember(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if check is not None:
            check(ctx, param, value)
        if value is not None and param.name is not None:
            ctx.meta.setdefault(_BEFORE, {})[param.name] = value

    return remember


def given_before(ctx: click.Context, name: str) -> Any:
    """The value of the group's option ``name`` given before the command, None if not given."""
    return ctx.meta.get(_BEFORE, {}).get(name)


def setting_option(
    name: str, *decls: str, default_text: str | None = None, before_command: bool = False, **kwargs: Any
) -> Callable[[_F], _F]:
    """An option ``--<name>`` (and ``decls``) for a setting; unset means "not given".
    ``default_text`` replaces the setting's default in ``--help`` where the command differs.
    ``before_command``: an option of the group, which the command's own option overrides."""
    flag = "--" + name.replace("_", "-")
    if "type" not in kwargs:
        kwargs.update(callback=_checker(name), metavar=Settings.metavar(name))
    if before_command:
        kwargs.update(callback=_remembered(kwargs.get("callback")), expose_value=False)
    return click.option(flag, *decls, name, default=None, help=setting_help(name, default_text), **kwargs)


def setting_help(name: str, default_text: str | None = None) -> str:
    """Setting ``name``'s help text with its default, as docs/configuration.md gives it.
    Not click's show_default: an option's default must stay None so that "not given" can be
    told apart."""
    default = Settings.default_text(name) if default_text is None else default_text
    return f"{Settings.help(name)}  [default: {default}]"


def _remember_config(ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.find_root().obj = value


def config_option(command: _F) -> _F:
    """``--config`` after the subcommand too, where people put it."""
    option = click.option(
        "--config",
        type=click.Path(dir_okay=False, exists=True),
        expose_value=False,
        callback=_remember_config,
        help=CONFIG_HELP,
    )
    return option(command)


def load_settings(ctx: click.Context, options: dict[str, Any]) -> Settings:
    """The settings with ``options`` from the command line on top, those given before the
    command beneath them; a bad value is a usage error."""
    given = {**ctx.meta.get(_BEFORE, {}), **{name: value for name, value in options.items() if value is not None}}
    try:
        return Settings.load(given, config_file=ctx.find_root().obj)
    except (ValueError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
