"""deploy/kubernetes/: every manifest is loaded strictly into the official
``kubernetes`` client's models, and the pieces fit one another and
cartonstore itself (the config loader, the CLI parser, the CSI plugin's
name and volume checks, containerd's and CRI-O's mirror files).

The client's own deserializer drops fields it does not know, so the loader
here walks each document against the models' ``openapi_types`` and
``attribute_map`` and builds them with the client's required-field checks.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import tomli
import yaml

from cartonstore.cli.args import arrange_argv
from cartonstore.cli.commands import build_parser
from cartonstore.config.load import load_config
from cartonstore.csi.servicer import PLUGIN_NAME
from cartonstore.csi.volumes import check_publish

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
NODE_FILES = DEPLOY / "node" / "etc"
HOSTS_TOML = NODE_FILES / "containerd" / "certs.d" / "registry.example" / "hosts.toml"
CRIO_CONF = NODE_FILES / "containers" / "registries.conf.d" / "cartonstore-mirror.conf"
# containerd's hosts.toml (docs/hosts.md): the top level and each [host."URL"].
HOSTS_TOML_KEYS = {"server", "capabilities", "ca", "client", "skip_verify", "header", "override_path", "host"}
HOST_KEYS = HOSTS_TOML_KEYS - {"server", "host"}
CAPABILITIES = {"pull", "resolve", "push"}


class ManifestError(ValueError):
    pass


def _model_class(name: str) -> type:
    return getattr(kubernetes.client.models, name)


def _check_type(value: Any, type_name: str, where: str) -> Any:
    """``value`` as the client's type ``type_name``; ManifestError naming
    ``where`` when it is not one."""
    if type_name == "object":
        return value
    container = re.fullmatch(r"List\[(.+)\]|Dict\[str, (.+)\]", type_name)
    if container and container[1]:
        if not isinstance(value, list):
            raise ManifestError(f"{where}: expected a list, got {type(value).__name__}")
        return [_check_type(v, container[1], f"{where}[{i}]") for i, v in enumerate(value)]
    if container:
        if not isinstance(value, dict):
            raise ManifestError(f"{where}: expected a mapping, got {type(value).__name__}")
        return {k: _check_type(v, container[2], f"{where}.{k}") for k, v in value.items()}
    scalars: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float),
                                            "datetime": (str,), "date": (str,), "bytes": (str,)}
    if type_name in scalars:
        if not isinstance(value, scalars[type_name]) or (type_name != "bool" and isinstance(value, bool)):
            raise ManifestError(f"{where}: expected {type_name}, got {type(value).__name__} {value!r:.60}")
        return value
    return strict_load(value, _model_class(type_name), where)


def strict_load(doc: Any, cls: type, where: str = "") -> Any:
    """``doc`` built into the client's model ``cls``: ManifestError for an
    unknown field, a wrong type or a missing required field."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where or cls.__name__}: expected a mapping for {cls.__name__}, "
                            f"got {type(doc).__name__}")
    by_key = {key: attr for attr, key in cls.attribute_map.items()}
    kwargs = {}
    for key, value in doc.items():
        path = f"{where}.{key}" if where else key
        if key not in by_key:
            raise ManifestError(f"{path}: unknown field of {cls.__name__}")
        attr = by_key[key]
        kwargs[attr] = _check_type(value, cls.openapi_types[attr], path)
    try:
        return cls(**kwargs)
    except ValueError as e:  # the client's check of required fields (pydantic's ValidationError)
        raise ManifestError(f"{where or cls.__name__}: {e}") from None


def load_manifest(doc: dict[str, Any]) -> Any:
    group_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    version = group_version.rpartition("/")[2]
    return strict_load(doc, _model_class(version.capitalize() + kind), f"{kind}")


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d is not None]


def all_documents() -> list[dict[str, Any]]:
    return [d for name in sorted(p.name for p in DEPLOY.glob("*.yaml")) if name != "kustomization.yaml"
            for d in documents(name)]


def find(kind: str, docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    [doc] = [d for d in (all_documents() if docs is None else docs) if d["kind"] == kind]
    return doc


def containers() -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in find("DaemonSet")["spec"]["template"]["spec"]["containers"]}


def mount_path(container: dict[str, Any], volume: str) -> str:
    [path] = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume]
    return str(path)


def volumes() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in find("DaemonSet")["spec"]["template"]["spec"]["volumes"]}


def flag(args: list[str], name: str) -> str:
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {args}")


def parsed_command(container: dict[str, Any], subcommand: str) -> Any:
    """The container's command as cartonstore's own CLI parser reads it."""
    command = container["command"]
    assert command[:2] == ["cartonstore", subcommand]
    parser = build_parser(only=subcommand)
    args = parser.parse_args(arrange_argv(parser, command[1:]))
    assert args.command == subcommand
    return args


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("config") / "cartonstore.toml"
    path.write_text(find("ConfigMap")["data"]["cartonstore.toml"])
    return load_config(path, env={})


@pytest.mark.parametrize("name", sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_each_manifest_loads_strictly_into_the_clients_models(name: str) -> None:
    docs = documents(name)
    assert docs
    for doc in docs:
        model = load_manifest(doc)
        assert model.kind == doc["kind"]


def test_kustomization_lists_the_node_manifests_that_exist() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert set(kustomization) == {"apiVersion", "kind", "resources"}
    assert all((DEPLOY / r).is_file() for r in kustomization["resources"])
    assert "example-pods.yaml" not in kustomization["resources"]


def _add_unknown_field(containers: list[dict[str, Any]]) -> None:
    containers[0]["mountPropagation"] = "Bidirectional"   # a VolumeMount's field, not a Container's


def _give_a_wrong_type(containers: list[dict[str, Any]]) -> None:
    containers[1]["securityContext"]["privileged"] = "true"


def _give_a_string_for_a_list(containers: list[dict[str, Any]]) -> None:
    containers[0]["command"] = "cartonstore serve"


def _drop_a_required_field(containers: list[dict[str, Any]]) -> None:
    del containers[2]["name"]


@pytest.mark.parametrize(("spoil", "error"), [
    (_add_unknown_field, r"containers\[0\]\.mountPropagation: unknown field of V1Container"),
    (_give_a_wrong_type, r"containers\[1\]\.securityContext\.privileged: expected bool, got str"),
    (_give_a_string_for_a_list, r"containers\[0\]\.command: expected a list"),
    (_drop_a_required_field, r"(?s)containers\[2\]: .*\bname\b.*(required|must not be `None`)"),
])
def test_the_strict_loader_refuses_a_spoiled_daemonset(spoil: Any, error: str) -> None:
    daemonset = yaml.safe_load(yaml.safe_dump(find("DaemonSet")))
    load_manifest(daemonset)
    spoil(daemonset["spec"]["template"]["spec"]["containers"])
    with pytest.raises(ManifestError, match=error):
        load_manifest(daemonset)


def test_the_csi_driver_the_registrar_and_the_plugin_agree_on_the_name() -> None:
    driver = find("CSIDriver")
    assert driver["metadata"]["name"] == PLUGIN_NAME == "csi.cartonstore.dev"
    assert driver["spec"] == {"attachRequired": False, "podInfoOnMount": True, "volumeLifecycleModes": ["Ephemeral"]}
    registrar = containers()["node-driver-registrar"]
    assert registrar["image"].startswith("registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.")
    registration = flag(registrar["args"], "--kubelet-registration-path")
    assert registration == f"/var/lib/kubelet/plugins/{PLUGIN_NAME}/csi.sock"
    # The plugin's socket on the host is the registration path, in every container that names it.
    plugin_dir = volumes()["plugin-dir"]["hostPath"]["path"]
    assert plugin_dir == os.path.dirname(registration)
    csi_address = flag(registrar["args"], "--csi-address")
    endpoint = flag(containers()["csi-plugin"]["command"], "--endpoint")
    assert endpoint == "unix://" + csi_address
    for container in (registrar, containers()["csi-plugin"]):
        assert mount_path(container, "plugin-dir") == os.path.dirname(csi_address)
    assert mount_path(registrar, "registration-dir") == "/registration"
    assert volumes()["registration-dir"]["hostPath"]["path"] == "/var/lib/kubelet/plugins_registry"


def test_every_volume_mount_names_a_volume_of_its_pod() -> None:
    for doc in all_documents():
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "DaemonSet" else doc.get("spec", {})
        if "containers" not in spec:
            continue
        names = {v["name"] for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in names, (doc["metadata"]["name"], container["name"], mount["name"])


def test_only_the_plugin_is_privileged_and_only_it_propagates_mounts() -> None:
    for name, container in containers().items():
        context = container["securityContext"]
        propagating = [m for m in container["volumeMounts"] if m.get("mountPropagation") == "Bidirectional"]
        if name == "csi-plugin":
            assert context["privileged"] is True
            assert [m["mountPath"] for m in propagating] == ["/var/lib/kubelet/pods"]
        else:
            assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"] and not propagating
    assert volumes()["pods-dir"]["hostPath"]["path"] == "/var/lib/kubelet/pods"


def test_the_config_map_loads_with_cartonstores_loader_and_the_daemon_parses_its_command(config: Any) -> None:
    daemon = containers()["daemon"]
    args = parsed_command(daemon, "serve")
    config_dir = mount_path(daemon, "config")
    assert str(args.config) == f"{config_dir}/cartonstore.toml"
    assert volumes()["config"]["configMap"]["name"] == find("ConfigMap")["metadata"]["name"]
    assert str(config.store.root) == volumes()["store"]["hostPath"]["path"] == "/var/lib/cartonstore"
    assert mount_path(daemon, "store") == str(config.store.root)
    assert config.mirror.listen == "127.0.0.1:5050"
    assert config.gc.max_size is not None


def test_the_daemon_and_the_plugin_agree_on_the_socket(config: Any) -> None:
    plugin = containers()["csi-plugin"]
    args = parsed_command(plugin, "csi")
    assert args.endpoint == "unix:///csi/csi.sock"
    socket = Path(args.socket)
    assert str(socket) == str(config.server.socket) == "/run/cartonstore/cartonstore.sock"
    for container in (containers()["daemon"], plugin):
        assert mount_path(container, "socket-dir") == str(socket.parent)
    assert volumes()["socket-dir"]["hostPath"]["path"] == str(socket.parent)
    # The plugin binds the directory the daemon's lease names: the store at the daemon's path.
    assert mount_path(plugin, "store") == mount_path(containers()["daemon"], "store")


def test_the_example_pods_mount_models_the_plugin_accepts() -> None:
    pods = documents("example-pods.yaml")
    schemes = []
    for pod in pods:
        [volume] = pod["spec"]["volumes"]
        csi = volume["csi"]
        assert csi["driver"] == PLUGIN_NAME and csi["readOnly"] is True
        publish = check_publish("csi-0123456789abcdef", "/var/lib/kubelet/pods/x/volumes/v/mount",
                                csi["volumeAttributes"], is_block=False)
        schemes.append(publish.model.partition("://")[0])
        for container in pod["spec"]["containers"]:
            assert all(m["readOnly"] is True for m in container["volumeMounts"])
    assert sorted(schemes) == ["hf", "oci"]


def test_containerds_hosts_toml_names_the_mirror(config: Any) -> None:
    hosts = tomli.loads(HOSTS_TOML.read_text())
    assert set(hosts) <= HOSTS_TOML_KEYS
    registry = HOSTS_TOML.parent.name
    assert hosts["server"] == f"https://{registry}"
    [(url, host)] = hosts["host"].items()
    assert url == f"http://{config.mirror.listen}"
    assert set(host) <= HOST_KEYS
    assert set(host["capabilities"]) <= CAPABILITIES - {"push"}  # the mirror is read-only
    assert isinstance(host.get("skip_verify", False), bool)
    assert isinstance(host.get("header", {}), dict)


def test_cri_o_mirror_names_the_mirror_and_the_daemons_upstream(config: Any) -> None:
    conf = tomli.loads(CRIO_CONF.read_text())
    [registry] = conf["registry"]
    [mirror] = registry["mirror"]
    assert mirror == {"location": config.mirror.listen, "insecure": True}
    assert registry["location"] == config.mirror.upstream == HOSTS_TOML.parent.name


def test_the_readme_and_the_docs_name_files_that_exist() -> None:
    text = (DEPLOY / "README.md").read_text() + Path(DEPLOY.parents[1] / "docs" / "operations.md").read_text()
    named = set(re.findall(r"(?<![\w/])deploy/[\w./-]+\w", text))
    assert named
    for path in named:
        assert (DEPLOY.parents[1] / path).exists(), path
