"""Shared fixtures for the deployment file tests: paths and parsed files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"


def require_tool(name: str) -> str:
    """Path of a system tool the Makefile's system-deps target installs."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (`make system-deps` installs it)")
    return path


@pytest.fixture(scope="session")
def compose_file() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.fixture(scope="session")
def alert_rules() -> dict:
    return yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())


@pytest.fixture(scope="session")
def dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "dashboards" / "specgate.json").read_text())


@pytest.fixture(scope="session")
def k8s_documents() -> list[tuple[str, dict]]:
    """(file name, document) for every manifest in deploy/k8s."""
    documents = []
    for path in sorted(K8S.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                documents.append((path.name, document))
    return documents
