"""Function code is arbitrary code: on a worker running as root with authentication on, a
hostile function tries what was once seen to work (read the worker's token key, its
environment, its data directory, another instance's directory; publish to the metadata
topic or another tenant's topic), and its outputs say that each was refused."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pulsar
import pytest

from magnetar.broker import EmbeddedBroker
from tests.cluster.conftest import Cluster, Worker, wait_until
from tests.cluster.test_rest_auth import _cli
from tests.conftest import EXAMPLES
from tests.integration.conftest import collect, produce
from tests.unit.test_code_package import shouting_zip

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="instance isolation needs a worker running as root (CI runs as root)",
)

HOSTILE = """
import importlib
import json
import os

from pulsar import Function


def attempt(action):
    try:
        result = action()
    except Exception as error:
        return f"refused: {type(error).__name__}: {error}"
    return f"allowed: {result!r}"[:300]


class Hostile(Function):
    def process(self, input, context):
        probe = json.loads(input)
        return json.dumps({
            "uid": os.getuid(),
            "gid": os.getgid(),
            "groups": os.getgroups(),
            "cwd": os.getcwd(),
            "key_file": attempt(lambda: open(probe["key_file"], "rb").read()),
            "worker_environ": attempt(
                lambda: open(f"/proc/{probe['worker_pid']}/environ", "rb").read()
            ),
            "data_dir": attempt(lambda: os.listdir(probe["data_dir"])),
            "other_instance": attempt(lambda: os.listdir(probe["other_instance"])),
            "instances": attempt(lambda: os.listdir(os.path.dirname(os.getcwd()) + "/..")),
            "own_dir": attempt(lambda: sorted(os.listdir("."))),
            "stdlib": attempt(lambda: importlib.import_module("colorsys").__name__),
            "metadata_topic": attempt(lambda: context.publish(probe["metadata_topic"], "x")),
            "other_tenant": attempt(lambda: context.publish(probe["other_tenant_topic"], "x")),
            "own_tenant": attempt(lambda: context.publish(probe["own_tenant_topic"], "x")),
            "worker_settings": sorted(name for name in os.environ if name.startswith("MAGNETAR")),
        })
"""


@dataclass
class Contained:
    cluster: Cluster
    worker: Worker
    tokens: dict[str, str]
    key: Path
    code: Path

    def call(self, method: str, path: str, role: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        return httpx.request(method, self.worker.url + path, headers=headers, timeout=30, **kwargs)

    def instance_dir(self, fqfn: str) -> str:
        data_dir = self.cluster.root / self.worker.worker_id
        digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
        root = (
            Path(tempfile.gettempdir()) / "magnetar-instances" / f"{self.worker.worker_id}-{digest}"
        )
        return str(root / quote(fqfn, safe="") / "0")

    def create(self, fqfn: str, role: str) -> str:
        """Deploy the hostile function as ``role``; its output topic."""
        tenant, namespace, _ = fqfn.split("/")
        output = f"persistent://{tenant}/{namespace}/out-{uuid.uuid4().hex[:8]}"
        config = {
            "inputs": [f"persistent://{tenant}/{namespace}/in-{uuid.uuid4().hex[:8]}"],
            "output": output,
            "className": "hostile.Hostile",
        }
        created = self.call(
            "POST",
            f"/admin/v3/functions/{fqfn}",
            role,
            data={"functionConfig": json.dumps(config)},
            files={"data": ("hostile.py", self.code.read_bytes())},
        )
        assert created.status_code == 204, created.text
        wait_until(
            lambda: (
                self.call("GET", f"/admin/v3/functions/{fqfn}/status", role).json()["numRunning"]
                == 1
            ),
            30,
            f"{fqfn} running",
        )
        return output


@pytest.fixture(scope="module")
def contained(
    cluster_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Contained]:
    root = tmp_path_factory.mktemp("contained")
    key = root / "secret.key"
    _cli("tokens", "create-secret-key", "--output", str(key))
    cluster_key = key.with_name("cluster.key")
    _cli("tokens", "create-secret-key", "--output", str(cluster_key))
    tokens = {
        role: _cli("tokens", "create", "--secret-key", key.as_uri(), "--subject", role)
        for role in ("admin", "acme-admin")
    }
    code = root / "hostile.py"
    code.write_text(HOSTILE)
    cluster = Cluster(
        cluster_broker.service_url,
        root,
        env={
            "MAGNETAR_AUTHENTICATION_ENABLED": "true",
            "MAGNETAR_TOKEN_SECRET_KEY": key.as_uri(),
            "MAGNETAR_CLUSTER_KEY": cluster_key.as_uri(),
            "MAGNETAR_SUPERUSER_ROLES": "admin",
            "MAGNETAR_TENANT_ADMIN_ROLES": json.dumps({"acme": ["acme-admin"]}),
        },
    )
    try:
        worker = cluster.start_worker("c0")
        made = Contained(cluster, worker, tokens, key, code)
        acme = {"adminRoles": ["acme-admin"], "allowedClusters": ["standalone"]}
        assert made.call("PUT", "/admin/v2/tenants/acme", "admin", json=acme).status_code == 204
        assert made.call("PUT", "/admin/v2/namespaces/acme/prod", "acme-admin").status_code == 204
        yield made
    finally:
        cluster.stop_all()


def _probe(
    contained: Contained, client: pulsar.Client, fqfn: str, output: str, other: str
) -> dict[str, Any]:
    """What the hostile function ``fqfn`` reports when aimed at the worker and at ``other``."""
    tenant, namespace, _ = fqfn.split("/")
    probe = {
        "key_file": str(contained.key),
        "worker_pid": contained.worker.process.pid,
        "data_dir": str(contained.cluster.root / contained.worker.worker_id),
        "other_instance": contained.instance_dir(other),
        "metadata_topic": f"persistent://public/{contained.cluster.namespace}/metadata",
        "other_tenant_topic": "persistent://public/default/not-mine",
        "own_tenant_topic": f"persistent://{tenant}/{namespace}/mine",
    }
    record = contained.call("GET", f"/admin/v3/functions/{fqfn}", "admin").json()
    produce(client, record["inputs"][0], [json.dumps(probe)])
    (message,) = collect(client, output, 1, timeout=30, subscription=f"probe-{uuid.uuid4().hex}")
    report: dict[str, Any] = json.loads(message.data())
    return report


def test_a_hostile_function_is_refused_the_workers_secrets_and_its_neighbours(
    contained: Contained, cluster_client: pulsar.Client
) -> None:
    acme_output = contained.create("acme/prod/hostile", "acme-admin")
    public_output = contained.create("public/default/neighbour", "admin")

    acme = _probe(
        contained, cluster_client, "acme/prod/hostile", acme_output, "public/default/neighbour"
    )
    neighbour = _probe(
        contained, cluster_client, "public/default/neighbour", public_output, "acme/prod/hostile"
    )

    # each instance runs as an unprivileged user of its own, in its own directory
    assert acme["uid"] != 0 and neighbour["uid"] != 0 and acme["uid"] != neighbour["uid"]
    assert (acme["gid"], acme["groups"]) == (acme["uid"], [])
    assert acme["cwd"] == contained.instance_dir("acme/prod/hostile")
    assert acme["own_dir"].startswith("allowed: ") and "package" in acme["own_dir"]
    for report in (acme, neighbour):
        for probe in ("key_file", "worker_environ", "data_dir", "other_instance", "instances"):
            # not its file; or, in its own view of the files, not there at all (the test's
            # files are in /tmp, which is the instance's own)
            refused = ("refused: PermissionError", "refused: FileNotFoundError")
            assert report[probe].startswith(refused), (probe, report[probe])
        assert report["worker_settings"] == []
        assert report["stdlib"] == "allowed: 'colorsys'"  # Python stays reachable
        assert report["metadata_topic"] == (
            "refused: PublishRefusedError: may not publish to "
            f"persistent://public/{contained.cluster.namespace}/metadata: "
            f"public/{contained.cluster.namespace} is the functions worker's system namespace"
        )
        assert report["own_tenant"] == "allowed: None"
    # another tenant's topic: refused to acme's function, allowed to a superuser's
    assert acme["other_tenant"] == (
        "refused: PublishRefusedError: may not publish to persistent://public/default/not-mine: "
        "it belongs to tenant 'public', and a function of tenant 'acme' publishes only to its "
        "tenant's topics"
    )
    assert neighbour["other_tenant"] == "allowed: None"


def test_the_submitters_token_is_kept_but_never_shown(
    contained: Contained, cluster_client: pulsar.Client
) -> None:
    contained.create("acme/prod/quiet", "acme-admin")
    shown = contained.call("GET", "/admin/v3/functions/acme/prod/quiet", "acme-admin")
    assert shown.status_code == 200
    assert contained.tokens["acme-admin"] not in shown.text
    assert "authData" not in shown.json()
    # nor in clear on the metadata topic, which any client of pulsar-lite can read
    metadata = f"persistent://public/{contained.cluster.namespace}/metadata"
    reader = cluster_client.create_reader(metadata, pulsar.MessageId.earliest)
    records = []
    try:
        while reader.has_message_available():
            records.append(reader.read_next(5000).data())
    finally:
        reader.close()
    mine = [r for r in records if b"acme/prod/quiet" in r]
    assert mine and all(b"sealedToken" in r for r in mine)
    assert not any(contained.tokens["acme-admin"].encode() in r for r in records)


def test_a_javascript_function_may_not_publish_to_the_system_namespace(
    contained: Contained, cluster_client: pulsar.Client
) -> None:
    metadata = f"persistent://public/{contained.cluster.namespace}/metadata"
    config = {
        "inputs": [f"persistent://acme/prod/in-{uuid.uuid4().hex[:8]}"],
        "userConfig": {"publish-topic": metadata},
        "runtime": "JAVASCRIPT",
    }
    created = contained.call(
        "POST",
        "/admin/v3/functions/acme/prod/js-publisher",
        "acme-admin",
        data={"functionConfig": json.dumps(config)},
        files={"data": ("publish.js", (EXAMPLES / "publish.js").read_bytes())},
    )
    assert created.status_code == 204, created.text
    status_path = "/admin/v3/functions/acme/prod/js-publisher/status"
    wait_until(
        lambda: contained.call("GET", status_path, "acme-admin").json()["numRunning"] == 1,
        30,
        "js-publisher running",
    )
    produce(cluster_client, config["inputs"][0], ["hello"])

    def user_exceptions() -> list[str]:
        status = contained.call("GET", status_path, "acme-admin").json()
        (instance,) = status["instances"]
        return [e["exceptionString"] for e in instance["status"]["latestUserExceptions"]]

    wait_until(lambda: bool(user_exceptions()), 30, "the refused publish reported")
    assert user_exceptions()[0] == (
        f"PublishRefusedError: may not publish to {metadata}: "
        f"public/{contained.cluster.namespace} is the functions worker's system namespace"
    )


def test_an_isolated_instance_installs_its_packages_dependencies_itself(
    contained: Contained, cluster_client: pulsar.Client, tmp_path: Path
) -> None:
    dependency = f"loudness_{uuid.uuid4().hex[:6]}"
    package = shouting_zip(tmp_path, dependency, f"{dependency}==1.0\n")
    config = {
        "inputs": [f"persistent://acme/prod/in-{uuid.uuid4().hex[:8]}"],
        "output": f"persistent://acme/prod/out-{uuid.uuid4().hex[:8]}",
        "className": "shout",
    }
    created = contained.call(
        "POST",
        "/admin/v3/functions/acme/prod/shout",
        "acme-admin",
        data={"functionConfig": json.dumps(config)},
        files={"data": ("shout.zip", package.read_bytes())},
    )
    assert created.status_code == 204, created.text
    status_path = "/admin/v3/functions/acme/prod/shout/status"
    wait_until(
        lambda: contained.call("GET", status_path, "acme-admin").json()["numRunning"] == 1,
        60,
        "shout running",
    )
    produce(cluster_client, config["inputs"][0], ["hey"])

    (shouted,) = collect(cluster_client, config["output"], 1, timeout=60)
    assert shouted.data() == b"hey!!"
