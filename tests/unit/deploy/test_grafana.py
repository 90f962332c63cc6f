"""Grafana provisioning and the specgate dashboard."""

from __future__ import annotations

import itertools

import yaml

from tests.unit.deploy.conftest import DEPLOY
from tests.unit.deploy.promql_names import metric_names

PROVISIONING = DEPLOY / "grafana" / "provisioning"


def test_panels_use_the_provisioned_datasource(dashboard):
    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    uids = {ds["uid"] for ds in sources["datasources"] if ds["type"] == "prometheus"}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] in uids, panel["title"]
        assert all(t["datasource"]["uid"] in uids for t in panel["targets"])


def test_dashboard_provider_points_at_the_mounted_dashboards(compose_file):
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "specgate.yml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose_file["services"]["grafana"]["volumes"])
    [provider] = providers["providers"]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"


def test_panel_ids_unique_and_panels_do_not_overlap(dashboard):
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for a, b in itertools.combinations(panels, 2):
        ga, gb = a["gridPos"], b["gridPos"]
        overlap_x = ga["x"] < gb["x"] + gb["w"] and gb["x"] < ga["x"] + ga["w"]
        overlap_y = ga["y"] < gb["y"] + gb["h"] and gb["y"] < ga["y"] + ga["h"]
        assert not (overlap_x and overlap_y), (a["title"], b["title"])
        assert ga["x"] + ga["w"] <= 24


def test_dashboard_shows_what_operators_need(dashboard):
    read = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            read |= metric_names(target["expr"])
    for quantity in ("inter_token_latency", "time_to_first_token", "e2e_request_latency"):
        for q in ("p50", "p95"):
            assert f"pool:vllm_{quantity}_seconds:{q}_rate5m" in read
    assert {
        "pool:vllm_spec_decode_acceptance:ratio_rate5m",
        "pool:vllm_spec_decode_mean_accepted_length:rate5m",
        "pool_position:vllm_spec_decode_position_acceptance:ratio_rate5m",
        "specgate_requests_total",
        "specgate_speculative_enabled",
        "specgate_flag_flips_total",
        "specgate_in_flight",
    } <= read
    requests = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])
                if "specgate_requests_total" in t["expr"]]
    assert any("by (pool, rule)" in expr for expr in requests)
