"""Render the Kubernetes manifests that carry a copy of another file.

    python3 deploy/k8s/render.py          rewrite them
    python3 deploy/k8s/render.py --check  exit 1 if a committed copy is stale

- prometheusrule.yaml wraps deploy/prometheus/alerts.yml (the rules the
  Compose stack's Prometheus loads) in a PrometheusRule for the operator.
- gateway-config.yaml wraps policies/examples/compose.yaml (its backend URLs
  are Service names, valid in both Compose and Kubernetes) in a ConfigMap, with
  the flag overrides file the gateway watches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
POLICY = ROOT / "policies" / "examples" / "compose.yaml"

LABELS = {"app.kubernetes.io/name": "specgate-gateway", "app.kubernetes.io/part-of": "specgate"}

# Manual speculation overrides, one entry per pool: auto | force_on | force_off.
# Edit the ConfigMap (kubectl edit configmap specgate-gateway-config); every
# gateway replica picks the change up from its mounted file.
FLAGS = """\
# pool: {mode: auto | force_on | force_off}
speculative: {mode: auto}
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the embedded files stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(header: str, document: dict) -> str:
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1000)
    return header + body


def render_prometheus_rule(alerts_text: str) -> str:
    groups = yaml.safe_load(alerts_text)["groups"]
    return _dump(
        "# Generated from deploy/prometheus/alerts.yml by deploy/k8s/render.py: do not edit.\n",
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": "specgate", "labels": dict(LABELS)},
            "spec": {"groups": groups},
        },
    )


def render_gateway_config(policy_text: str, flags_text: str = FLAGS) -> str:
    return _dump(
        "# Generated from policies/examples/compose.yaml by deploy/k8s/render.py: edit the\n"
        "# policy there. flags.yaml holds the initial speculation modes, read once at\n"
        "# start-up; with a state store, change them with PUT /admin/flags/{pool}.\n",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "specgate-gateway-config", "labels": dict(LABELS)},
            "data": {"policy.yaml": policy_text, "flags.yaml": flags_text},
        },
    )


def rendered() -> dict[Path, str]:
    return {
        K8S / "prometheusrule.yaml": render_prometheus_rule(ALERTS.read_text()),
        K8S / "gateway-config.yaml": render_gateway_config(POLICY.read_text()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale files, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path, text in rendered().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        for path in stale:
            print(f"{path} is stale: run python3 deploy/k8s/render.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
