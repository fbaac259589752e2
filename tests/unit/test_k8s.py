"""compose/k8s/: the manifests fit the code and the alert rules name what reach exports.

* The worker Deployment's command is a valid `reach worker` command line (parsed by the
  CLI itself), its agent module loads, its probes ask the paths reach serves on the port
  it serves them on, and its termination grace covers the drain; the Deployment, the PDB
  and the HPA validate against the Kubernetes API schemas (kubernetes-validate, offline;
  skipped where it is not installed), the KEDA ScaledObject (a CRD, no schema there) by
  its structure.
* Every series an alert rule, the ScaledObject or the HPA reads is one reach exports
  (reach/metrics.py's families); `promtool check rules` and `promtool test rules`
  (compose/k8s/reach-alerts.test.yml: each alert fired, or not, on made-up series) pass
  where promtool is installed (Debian's `prometheus` package).
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from prometheus_client import REGISTRY
from reach_cli.app import app as cli_app
from reach_cli.worker_cmd import agent_ids, load_agent
from typer.core import TyperGroup

import reach.metrics  # noqa: F401 - registers reach's series
from reach import health
from reach._worker.runtime import CANCEL_WAIT_S, SETTLE_RETRY_S

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "compose" / "k8s"
RULES = K8S / "reach-alerts.rules.yml"
RULES_TEST = K8S / "reach-alerts.test.yml"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def one(kind: str) -> dict[str, Any]:
    found = [d for f in sorted(K8S.glob("*.yaml")) for d in docs(f.name) if d["kind"] == kind]
    assert len(found) == 1, f"{kind}: {len(found)} found"
    return found[0]


def exported() -> set[str]:
    """The series names reach exports (labelled counters included before their first
    sample: taken from the families' types)."""
    names = set()
    for fam in REGISTRY.collect():
        if fam.name.startswith("reach_"):
            names.update(fam.name + s for s in SUFFIXES.get(fam.type, ("",)))
    return names


def series_in(expr: str) -> set[str]:
    return set(re.findall(r"\breach_[a-z_]+\b", expr))


def worker_command() -> tuple[Any, list[str]]:
    """The Deployment's `reach worker ...` command, parsed by the CLI's own parser (its
    click context: an unknown option or a bad value raises here)."""
    [container] = one("Deployment")["spec"]["template"]["spec"]["containers"]
    cmd = [str(c) for c in container["command"]]
    assert cmd[:2] == ["reach", "worker"], cmd
    group = typer.main.get_command(cli_app)
    assert isinstance(group, TyperGroup)
    worker = group.get_command(None, "worker")  # type: ignore[arg-type]
    assert worker is not None
    return worker.make_context("worker", cmd[2:]), cmd


def test_the_worker_command_line_is_one_reach_worker_accepts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx, _ = worker_command()
    p = ctx.params
    assert p["metrics_port"] is not None and p["drain_s"] > 0
    monkeypatch.chdir(ROOT)  # the image's working directory holds examples/
    agent = load_agent(p["target"])
    assert agent.capabilities
    # one agent per pod, named after it: two pods never share an agent id
    assert "{hostname}" in p["agent_id"]
    [aid] = agent_ids(p["agent_id"], 1)
    assert aid.startswith(p["agent_id"].split("{", 1)[0])


def test_the_probes_ask_what_reach_serves_where_it_serves_it() -> None:
    ctx, _ = worker_command()
    dep = one("Deployment")
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    want = {"livenessProbe": health.HEALTHZ, "readinessProbe": health.READYZ}
    want["startupProbe"] = health.HEALTHZ
    for probe, path in want.items():
        get = c[probe]["httpGet"]
        assert get["path"] == path, probe
        port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        assert port == ctx.params["metrics_port"], probe
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ctx.params["metrics_port"]
    assert annotations["prometheus.io/path"] == "/metrics"
    assert [e["name"] for e in c["env"]] == ["REACH_REDIS_URL"]


def test_the_termination_grace_covers_the_drain() -> None:
    ctx, _ = worker_command()
    pod = one("Deployment")["spec"]["template"]["spec"]
    # the drain grace, then at most CANCEL_WAIT_S for cut handlers and SETTLE_RETRY_S of
    # writes retried (reach/_worker/runtime.py), before the kubelet's SIGKILL
    need = ctx.params["drain_s"] + CANCEL_WAIT_S + SETTLE_RETRY_S
    assert pod["terminationGracePeriodSeconds"] >= need
    # SIGTERM is the drain: a preStop hook signalling the worker would make the kubelet's
    # own SIGTERM a second signal (stop at once)
    [c] = pod["containers"]
    assert "preStop" not in (c.get("lifecycle") or {})


def test_autoscaling_targets_the_deployment_on_inbox_depth() -> None:
    ctx, _ = worker_command()
    dep = one("Deployment")
    name = dep["metadata"]["name"]
    [aid] = agent_ids(ctx.params["agent_id"], 1)

    keda = one("ScaledObject")
    assert keda["apiVersion"] == "keda.sh/v1alpha1"
    assert keda["spec"]["scaleTargetRef"]["name"] == name
    assert keda["spec"]["minReplicaCount"] >= 1  # depth is exported only by running agents
    assert keda["spec"]["maxReplicaCount"] > keda["spec"]["minReplicaCount"]
    [trigger] = keda["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    meta = trigger["metadata"]
    assert meta["serverAddress"].startswith("http")
    assert isinstance(meta["threshold"], str) and float(meta["threshold"]) > 0
    assert series_in(meta["query"]) == {"reach_inbox_depth"} <= exported()
    # the query's agent_id pattern matches this Deployment's agents
    [pattern] = re.findall(r'agent_id=~"([^"]+)"', meta["query"])
    assert re.fullmatch(pattern, aid)

    hpa = one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": name,
    }
    [metric] = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] in exported()

    pdb = one("PodDisruptionBudget")
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_manifests_validate_against_the_kubernetes_schemas() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    version = kv.latest_version()
    built_in = [d for f in sorted(K8S.glob("*.yaml")) for d in docs(f.name)]
    built_in = [d for d in built_in if d["kind"] != "ScaledObject"]  # a CRD: checked above
    assert {d["kind"] for d in built_in} == {
        "Deployment",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
    }
    for d in built_in:
        kv.validate(d, version, strict=True)
    # the validator does refuse a broken probe (it is not a check that cannot fail)
    broken = copy.deepcopy(one("Deployment"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pth"] = "/"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, version, strict=True)


def test_every_alert_reads_series_reach_exports() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    names = exported()
    alerts = [r for g in groups for r in g["rules"]]
    assert {r["alert"] for r in alerts} >= {
        "ReachMassUnavailability",
        "ReachRecoveryFailed",
        "ReachDeadLettersGrowing",
        "ReachInboxNotDraining",
    }
    for r in alerts:
        used = series_in(r["expr"])
        assert used, r["alert"]
        assert used <= names, f"{r['alert']}: {used - names} not exported by reach"
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
@pytest.mark.parametrize(
    "check", [["check", "rules", RULES.name], ["test", "rules", RULES_TEST.name]]
)
def test_promtool_accepts_the_rules_and_their_unit_tests(check: list[str]) -> None:
    assert PROMTOOL is not None
    res = subprocess.run(
        [PROMTOOL, *check], cwd=K8S, capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout
