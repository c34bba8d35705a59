"""The deployment files, checked by the tools their platforms provide: systemd's own verifier
for the units, the Kubernetes API schemas for the manifests; their command lines by
blobsvc's own parser and their BLOBSVC_* settings by its settings' own; and the image's
recipe (deploy/Containerfile) by running its steps in a fresh venv."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from blobsvc.config import ENV_PREFIX, Settings

from .conftest import ServerThread

ROOT = Path(__file__).parent.parent
DEPLOY = ROOT / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
CONTAINERFILE = DEPLOY / "Containerfile"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]  # the image's tag
SETTINGS = {field.name for field in dataclasses.fields(Settings)}


def accepted_by_blobsvc(command: list[str]) -> None:
    """``command`` (``blobsvc COMMAND …``) parses: every option exists (the same arguments
    with ``--help`` exit 0), and every value given to an option that is a setting is one."""
    assert command[0] == "blobsvc", command
    done = subprocess.run(
        [sys.executable, "-m", "blobsvc", *command[1:], "--help"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    options = {opt: param.name for param in _params(command[1]) for opt in param.opts}
    for option, value in itertools.pairwise(command):
        name = options.get(option)
        if name in SETTINGS and option.startswith("-") and not value.startswith("-"):
            Settings.parse(name, value)


def _params(command: str) -> list[click.Parameter]:
    from blobsvc.cli import main

    return main.commands[command].params


def settings_accepted(env: dict[str, str]) -> None:
    """Every ``BLOBSVC_*`` variable names a setting and holds a value of it."""
    for variable, value in env.items():
        if variable.startswith(ENV_PREFIX):
            name = variable.removeprefix(ENV_PREFIX).lower()
            assert name in SETTINGS, f"{variable} is no setting"
            Settings.parse(name, value)


def documents(manifest: Path) -> dict[tuple[str, str], Any]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(manifest.read_text())}


def containers(manifest: Path) -> list[dict[str, Any]]:
    """Every container (and init container) of the manifest's workloads."""
    found = []
    for (kind, _), doc in documents(manifest).items():
        if kind in {"DaemonSet", "StatefulSet", "Deployment"}:
            pod = doc["spec"]["template"]["spec"]
            found += pod["containers"] + pod.get("initContainers", [])
    return found


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_the_systemd_unit_passes_systemd_analyze_verify(unit: Path) -> None:
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # verify exits 0 on some bad settings, which it only reports: a clean unit says nothing.
    assert (done.returncode, done.stderr.strip()) == (0, "")


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_the_systemd_unit_runs_a_command_and_settings_blobsvc_accepts(unit: Path) -> None:
    lines = unit.read_text().splitlines()
    (line,) = [line for line in lines if line.startswith("ExecStart=")]
    command = shlex.split(line.removeprefix("ExecStart="))
    accepted_by_blobsvc(command[1:] if command[0] == "/usr/bin/env" else command)
    environment = [line.removeprefix("Environment=") for line in lines if line.startswith("Environment=")]
    settings_accepted(dict(word.split("=", 1) for line in environment for word in shlex.split(line)))


def test_there_is_a_unit_for_the_server_and_one_for_the_agent() -> None:
    assert [unit.name for unit in UNITS] == ["blobsvc-agent.service", "blobsvc.service"]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda manifest: manifest.name)
def test_the_kubernetes_manifest_validates_against_the_api_schemas(manifest: Path) -> None:
    validator = Path(sys.executable).parent / "kubernetes-validate"
    done = subprocess.run(
        [str(validator), "--strict", "--quiet", str(manifest)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda manifest: manifest.name)
def test_the_manifest_runs_the_image_of_the_containerfile_with_commands_and_settings_blobsvc_accepts(
    manifest: Path,
) -> None:
    for container in containers(manifest):
        assert container["image"].rpartition("/")[2] == f"blobsvc:{VERSION}", container["image"]
        if container["command"][0] == "blobsvc":
            accepted_by_blobsvc(container["command"])
        settings_accepted({env["name"]: env["value"] for env in container.get("env", []) if "value" in env})


def test_the_daemonset_runs_an_agent_behind_a_node_local_service() -> None:
    found = documents(DEPLOY / "kubernetes" / "blobsvc-agent.yaml")
    (agent,) = found["DaemonSet", "blobsvc-agent"]["spec"]["template"]["spec"]["containers"]
    assert agent["command"][:2] == ["blobsvc", "agent"]
    assert found["Service", "blobsvc-agent"]["spec"]["internalTrafficPolicy"] == "Local"


def test_the_servers_elect_a_leader_in_zookeeper_with_the_store_on_s3_behind_the_agents_service() -> None:
    found = documents(DEPLOY / "kubernetes" / "blobsvc-server.yaml")
    servers = found["StatefulSet", "blobsvc"]["spec"]
    (server,) = servers["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in server["env"]}
    assert servers["replicas"] >= 2 and server["command"][:2] == ["blobsvc", "serve"]
    assert env["BLOBSVC_RECOVERY_MODE"] == "zookeeper" and env["BLOBSVC_HA_DIR"].startswith("s3://")
    (agent,) = containers(DEPLOY / "kubernetes" / "blobsvc-agent.yaml")[:1]
    (agents_server,) = [item["value"] for item in agent["env"] if item["name"] == "BLOBSVC_SERVER"]
    service = found["Service", "blobsvc"]
    assert agents_server == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:6130"
    # The secret the server reads is the Secret's, mounted where BLOBSVC_SECRET_FILE says.
    (mount,) = [m for m in server["volumeMounts"] if env["BLOBSVC_SECRET_FILE"].startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in servers["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    secret = found["Secret", volume["secret"]["secretName"]]
    assert env["BLOBSVC_SECRET_FILE"].rpartition("/")[2] in secret["stringData"]


def test_the_leader_probe_tells_a_server_that_leads_from_one_that_does_not(settings: Settings) -> None:
    """The readiness probe, run against a real server's /metrics: a standalone server does not
    lead, so not ready; the same probe asking for its role instead answers ready."""
    found = documents(DEPLOY / "kubernetes" / "blobsvc-server.yaml")
    (server,) = found["StatefulSet", "blobsvc"]["spec"]["template"]["spec"]["containers"]
    probe = server["readinessProbe"]["exec"]["command"]
    assert probe[:2] == ["python3", "-c"]
    running = ServerThread(dataclasses.replace(settings, metrics_port="0")).start()
    try:
        assert running.server.metrics is not None and running.server.metrics.address is not None
        code = probe[2].replace("127.0.0.1:9130", "{}:{}".format(*running.server.metrics.address))
        assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 1
        standalone = code.replace('role="leader"', 'role="standalone"')
        assert standalone != code
        assert subprocess.run([sys.executable, "-c", standalone], timeout=30).returncode == 0
    finally:
        running.stop()


def containerfile() -> list[tuple[str, str]]:
    """deploy/Containerfile's instructions, ``(KEYWORD, arguments)``, continuations joined."""
    text = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split()[0].upper(), line.partition(" ")[2].strip()) for line in lines if line and line[0] != "#"]


def test_the_image_runs_blobsvc_as_a_user_not_root() -> None:
    steps = containerfile()
    (user,) = [value for keyword, value in steps if keyword == "USER"]
    assert user.partition(":")[0] not in {"0", "root"}
    (entrypoint,) = [json.loads(value) for keyword, value in steps if keyword == "ENTRYPOINT"]
    (cmd,) = [json.loads(value) for keyword, value in steps if keyword == "CMD"]
    accepted_by_blobsvc([*entrypoint, *cmd])
    settings_accepted(
        dict(word.split("=", 1) for keyword, value in steps if keyword == "ENV" for word in value.split())
    )


@pytest.mark.slow
def test_the_containerfile_steps_install_a_server_and_an_agent_that_start(tmp_path: Path) -> None:
    """The image's COPY and RUN steps as a script, with the image's paths moved under
    ``tmp_path`` and this machine's pip cache (the image has none); only the step that adds
    the image's user is left out, as it would add one to this machine."""
    places = {"/opt/blobsvc": tmp_path / "venv", "/tmp/blobsvc-src": tmp_path / "src"}

    def here(text: str) -> str:
        for there, path in places.items():
            text = text.replace(there, str(path))
        return text

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    left_out = []
    for keyword, value in containerfile():
        if keyword == "ENV":
            for name, setting in (word.split("=", 1) for word in value.split()):
                if name != "PIP_NO_CACHE_DIR":
                    env[name] = here(setting).replace("$PATH", env["PATH"])
        elif keyword == "COPY":
            *sources, target = value.split()
            for source in sources:
                destination = Path(here(target)) / source if target.endswith("/") else Path(here(target))
                destination.parent.mkdir(parents=True, exist_ok=True)
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, destination, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / source, destination)
        elif keyword == "RUN" and value.startswith("groupadd"):
            left_out.append(value)
        elif keyword == "RUN":
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", here(value)], env=env, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, done.stdout + done.stderr
    assert len(left_out) == 1
    blobsvc = str(tmp_path / "venv" / "bin" / "blobsvc")
    server = subprocess.Popen(
        [blobsvc, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(tmp_path / "data"),
         "--metrics-port", "0", "--recovery-mode", "standalone"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    agent = None
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("listening on "), line + (server.stderr.read() if server.stderr else "")
        agent = subprocess.Popen(
            [blobsvc, "agent", "-s", line.split()[-1], "--port", "0", "--cache-dir", str(tmp_path / "cache")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert agent.stdout is not None
        assert agent.stdout.readline().startswith("agent listening on ")
        # What recovery mode zookeeper on S3 needs is in the venv too.
        imports = [str(tmp_path / "venv" / "bin" / "python"), "-c", "import kazoo, fsspec, s3fs, prometheus_client"]
        assert subprocess.run(imports, timeout=60).returncode == 0
    finally:
        for process in (agent, server):
            if process is not None:
                process.terminate()
                process.wait(15)
