"""The agent's deployment files, checked by the tools their platforms provide: systemd's own
verifier for the unit, the Kubernetes API schemas for the DaemonSet; and their command lines
by blobsvc's own parser."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).parent.parent / "deploy"
UNIT = DEPLOY / "systemd" / "blobsvc-agent.service"
MANIFEST = DEPLOY / "kubernetes" / "blobsvc-agent.yaml"


def accepted_by_blobsvc(command: list[str]) -> None:
    """``command`` (``blobsvc agent …``) parses: the same arguments with ``--help`` exit 0."""
    assert command[:2] == ["blobsvc", "agent"], command
    done = subprocess.run(
        [sys.executable, "-m", "blobsvc", *command[1:], "--help"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_passes_systemd_analyze_verify() -> None:
    done = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, timeout=60)
    # verify exits 0 on some bad settings, which it only reports: a clean unit says nothing.
    assert (done.returncode, done.stderr.strip()) == (0, "")


def test_the_systemd_unit_runs_an_agent_command_blobsvc_accepts() -> None:
    (line,) = [line for line in UNIT.read_text().splitlines() if line.startswith("ExecStart=")]
    command = shlex.split(line.removeprefix("ExecStart="))
    accepted_by_blobsvc(command[1:] if command[0] == "/usr/bin/env" else command)


def test_the_kubernetes_manifest_validates_against_the_api_schemas() -> None:
    validator = Path(sys.executable).parent / "kubernetes-validate"
    done = subprocess.run(
        [str(validator), "--strict", "--quiet", str(MANIFEST)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_daemonset_runs_an_agent_command_blobsvc_accepts_behind_a_node_local_service() -> None:
    documents = {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}
    (agent,) = documents["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    accepted_by_blobsvc(agent["command"])
    assert documents["Service"]["spec"]["internalTrafficPolicy"] == "Local"
