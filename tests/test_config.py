"""Settings: precedence, parsing, and that every setting is documented in docs/configuration.md."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from blobsvc import Settings
from blobsvc.config import parse_port_range, parse_size

CONFIGURATION = Path(__file__).parent.parent / "docs" / "configuration.md"


def test_defaults_need_nothing() -> None:
    settings = Settings.load(environ={})
    assert settings.port == "6130" and settings.host == "127.0.0.1"
    assert settings.data_dir.name == "blobsvc"


def test_command_line_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('max-blob-size = "1GiB"\nidle_timeout = 7\nretries = 9\n')
    environ = {"BLOBSVC_IDLE_TIMEOUT": "8", "BLOBSVC_RETRIES": "5"}
    settings = Settings.load({"retries": 1, "host": None}, environ=environ, config_file=config)
    assert settings.max_blob_size == 1 << 30  # file
    assert settings.idle_timeout == 8.0  # environment over file
    assert settings.retries == 1  # command line over environment
    assert settings.host == "127.0.0.1"  # None means "not given"


def test_the_config_file_can_be_named_by_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('server = "example:1"\n')
    assert Settings.load(environ={"BLOBSVC_CONFIG": str(config)}).server_address == ("example", 1)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"max_blob_size": "lots"}, "max_blob_size"),
        ({"port": "70000"}, "port"),
        ({"idle_timeout": "-1"}, "idle_timeout"),
        ({"io_timeout": "nan"}, "io_timeout"),
        ({"max_connections": "0"}, "max_connections"),
        ({"verify_on_start": "perhaps"}, "verify_on_start"),
        ({"metrics_port": "70000"}, "metrics_port"),
        ({"metrics_port": "https"}, "metrics_port"),
        ({"log_format": "xml"}, "log_format"),
        ({"log_level": "loud"}, "log_level"),
    ],
)
def test_bad_values_name_the_setting(overrides: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Settings.load(overrides, environ={})


def test_unknown_keys_in_the_file_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("max_blob_sise = 1\n")
    with pytest.raises(ValueError, match="max_blob_sise"):
        Settings.load(environ={}, config_file=config)


@pytest.mark.parametrize(
    ("text", "size"), [("1048576", 1 << 20), ("512KiB", 512 << 10), ("64M", 64 << 20), ("8 GB", 8 << 30)]
)
def test_sizes_take_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_port_ranges() -> None:
    assert parse_port_range("0") == range(0, 1)
    assert parse_port_range("50100-50200") == range(50100, 50201)
    with pytest.raises(ValueError):
        parse_port_range("9-1")


def test_every_setting_is_in_the_configuration_table() -> None:
    text = CONFIGURATION.read_text()
    for field in dataclasses.fields(Settings):
        assert f"`{field.name}`" in text, field.name
        assert f"BLOBSVC_{field.name.upper()}" in text, field.name


def test_metrics_port_is_a_port_http_or_off() -> None:
    assert Settings.load({"metrics_port": "9130"}, environ={}).metrics_port == "9130"
    assert Settings.load({"metrics_port": "HTTP"}, environ={}).metrics_port == "http"
    assert Settings.load(environ={"BLOBSVC_METRICS_PORT": "off"}).metrics_port is None
    assert Settings.load(environ={}).metrics_port is None
