"""The Functions v3 REST API answers as Apache Pulsar's does, case by case: the status code
and the exact reason of FunctionsImpl / ComponentImpl (and of FunctionApiV3ResourceTest's
expectations), success without a body (Pulsar's methods return void: 204).

Every case is asked of a worker that is not the leader, so refusals the leader decides come
back through the forwarding with Pulsar's code intact; a few are asked of the leader too."""

from __future__ import annotations

import io
import json
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import EXAMPLES
from tests.worker.conftest import InProcessCluster

FUNCTIONS = "/admin/v3/functions/public/default"
CLASS = "exclamation.ExclamationFunction"


def form(config: dict[str, Any] | None, code: bool = True, **fields: str) -> dict[str, Any]:
    """A multipart register/update body: ``functionConfig`` and the example's code."""
    data = dict(fields) | ({"functionConfig": json.dumps(config)} if config is not None else {})
    files = {"data": ("exclamation.py", (EXAMPLES / "exclamation.py").read_bytes())}
    return {"data": data, "files": files if code else None}


@dataclass
class Api:
    cluster: InProcessCluster
    topic: str

    def call(self, method: str, path: str, via: str = "follower", **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.cluster.url(via) + path, timeout=30, **kwargs)

    def wait_running(self, name: str, count: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while self.call("GET", f"{FUNCTIONS}/{name}/status").json()["numRunning"] != count:
            assert time.monotonic() < deadline, f"{name}: {count} instances not running"
            time.sleep(0.1)

    def register(self, name: str, **config: Any) -> None:
        body = {"className": CLASS, **config}
        answer = self.call("POST", f"{FUNCTIONS}/{name}", **form(body))
        assert (answer.status_code, answer.text) == (204, ""), answer.text


@pytest.fixture(scope="module")
def api(rest_cluster: InProcessCluster) -> Iterator[Api]:
    """The cluster, with ``f`` (2 instances, one input, an output), ``two`` (two inputs)
    and ``sink`` (no output) registered."""
    made = Api(rest_cluster, f"codes-{uuid.uuid4().hex[:6]}")
    made.register("f", inputs=[made.topic], output=f"{made.topic}-out", parallelism=2)
    made.register("two", inputs=[f"{made.topic}-a", f"{made.topic}-b"])
    made.register("sink", inputs=[f"{made.topic}-s"])
    yield made


def _update(config: dict[str, Any] | None) -> dict[str, Any]:
    return form(config, code=False)


# (method, path, request, status, reason); {topic} is the module's input topic
CASES: dict[str, tuple[str, str, dict[str, Any], int, str]] = {
    "register an existing function": (
        "POST",
        f"{FUNCTIONS}/f",
        form({"inputs": ["x"], "className": CLASS}),
        400,
        "Function f already exists",
    ),
    "register in an unknown tenant": (
        "POST",
        "/admin/v3/functions/nobody/default/g",
        form({"inputs": ["x"], "className": CLASS}),
        400,
        "Tenant does not exist",
    ),
    "register in an unknown namespace": (
        "POST",
        "/admin/v3/functions/public/nowhere/g",
        form({"inputs": ["x"], "className": CLASS}),
        400,
        "Namespace does not exist",
    ),
    "register without functionConfig": (
        "POST",
        f"{FUNCTIONS}/g",
        form(None),
        400,
        "Function config is not provided",
    ),
    "register without code": (
        "POST",
        f"{FUNCTIONS}/g",
        form({"inputs": ["x"], "className": CLASS}, code=False),
        400,
        "Function Package is not provided",
    ),
    "register from an unsupported url": (
        "POST",
        f"{FUNCTIONS}/g",
        form({"inputs": ["x"], "className": CLASS}, code=False, url="ftp://host/f.py"),
        400,
        "Function Package url is not valid.supported url (http/https/file)",
    ),
    "update a missing function": (
        "PUT",
        f"{FUNCTIONS}/nope",
        _update({"parallelism": 2}),
        400,
        "Function nope doesn't exist",
    ),
    "update without functionConfig": (
        "PUT",
        f"{FUNCTIONS}/f",
        _update(None),
        400,
        "Function config is not provided",
    ),
    "update that changes nothing": (
        "PUT",
        f"{FUNCTIONS}/f",
        _update({"parallelism": 2, "inputs": ["{topic}"], "className": CLASS}),
        400,
        "Update contains no change",
    ),
    "update that adds an input": (
        "PUT",
        f"{FUNCTIONS}/f",
        _update({"inputs": ["another-topic"]}),
        400,
        "Input Topics cannot be altered",
    ),
    "update of the processing guarantees": (
        "PUT",
        f"{FUNCTIONS}/f",
        _update({"processingGuarantees": "ATMOST_ONCE"}),
        400,
        "Processing Guarantees cannot be altered",
    ),
    "update of the subscription name": (
        "PUT",
        f"{FUNCTIONS}/f",
        _update({"subName": "other"}),
        400,
        "Subscription Name cannot be altered",
    ),
    "update of the ordering": (
        "PUT",
        f"{FUNCTIONS}/f",
        _update({"retainOrdering": True}),
        400,
        "Retain Ordering cannot be altered",
    ),
    "update of auto-ack": (
        "PUT",
        f"{FUNCTIONS}/f",
        _update({"autoAck": False}),
        400,
        "AutoAck cannot be altered",
    ),
    "update of the output SerDe": (
        "PUT",
        f"{FUNCTIONS}/f",
        _update({"outputSerdeClassName": "json_serde.JsonSerDe"}),
        400,
        "Output Serde mismatch",
    ),
    "delete a missing function": (
        "DELETE",
        f"{FUNCTIONS}/nope",
        {},
        404,
        "Function nope doesn't exist",
    ),
    "get a missing function": ("GET", f"{FUNCTIONS}/nope", {}, 404, "Function nope doesn't exist"),
    "status of a missing function": (
        "GET",
        f"{FUNCTIONS}/nope/status",
        {},
        404,
        "Function nope doesn't exist",
    ),
    "stats of a missing function": (
        "GET",
        f"{FUNCTIONS}/nope/stats",
        {},
        404,
        "Function nope doesn't exist",
    ),
    "instance status of a missing function": (
        "GET",
        f"{FUNCTIONS}/nope/0/status",
        {},
        404,
        "Function nope doesn't exist",
    ),
    "instance status out of range": (
        "GET",
        f"{FUNCTIONS}/f/2/status",
        {},
        400,
        "Function f doesn't have instance with id 2",
    ),
    "instance stats out of range": (
        "GET",
        f"{FUNCTIONS}/f/5/stats",
        {},
        400,
        "Function f doesn't have instance with id 5",
    ),
    "instance status of a negative id": (
        "GET",
        f"{FUNCTIONS}/f/-1/status",
        {},
        400,
        "Function f doesn't have instance with id -1",
    ),
    "instance stats of a negative id": (
        "GET",
        f"{FUNCTIONS}/f/-3/stats",
        {},
        400,
        "Function f doesn't have instance with id -3",
    ),
    "start a negative id: every instance, which run": (
        "POST",
        f"{FUNCTIONS}/f/-1/start",
        {},
        400,
        "Operation not permitted",
    ),
    "restart a negative id": (
        "POST",
        f"{FUNCTIONS}/f/-1/restart",
        {},
        400,
        "public/default/f/-1 doesn't exist",
    ),
    "start a function that runs": (
        "POST",
        f"{FUNCTIONS}/f/start",
        {},
        400,
        "Operation not permitted",
    ),
    "start an instance out of range": (
        "POST",
        f"{FUNCTIONS}/f/9/start",
        {},
        400,
        "Operation not permitted",
    ),
    "stop an instance out of range": (
        "POST",
        f"{FUNCTIONS}/f/2/stop",
        {},
        400,
        "Operation not permitted",
    ),
    "start a missing function": (
        "POST",
        f"{FUNCTIONS}/nope/start",
        {},
        404,
        "Function nope doesn't exist",
    ),
    "stop a missing function": (
        "POST",
        f"{FUNCTIONS}/nope/0/stop",
        {},
        404,
        "Function nope doesn't exist",
    ),
    "restart a missing function": (
        "POST",
        f"{FUNCTIONS}/nope/restart",
        {},
        404,
        "Function nope doesn't exist",
    ),
    "restart an instance out of range": (
        "POST",
        f"{FUNCTIONS}/f/7/restart",
        {},
        400,
        "public/default/f/7 doesn't exist",
    ),
    "trigger without data": (
        "POST",
        f"{FUNCTIONS}/nope/trigger",
        {"data": {"topic": "x"}},
        400,
        "Trigger Data is not provided",
    ),
    "trigger a missing function": (
        "POST",
        f"{FUNCTIONS}/nope/trigger",
        {"data": {"data": "x"}},
        404,
        "Function nope doesn't exist",
    ),
    "trigger on a topic that is no input": (
        "POST",
        f"{FUNCTIONS}/f/trigger",
        {"data": {"data": "x", "topic": "elsewhere"}},
        400,
        "Function in trigger function has unidentified topic",
    ),
    "trigger a function of two inputs without a topic": (
        "POST",
        f"{FUNCTIONS}/two/trigger",
        {"data": {"data": "x"}},
        400,
        "Function in trigger function has more than 1 input topics",
    ),
    "query a missing key": (
        "GET",
        f"{FUNCTIONS}/f/state/absent",
        {},
        404,
        "key 'absent' doesn't exist.",
    ),
    "put a state whose key is not the path's": (
        "POST",
        f"{FUNCTIONS}/f/state/k",
        {"data": {"state": json.dumps({"key": "other", "stringValue": "v"})}},
        400,
        "Path key doesn't match key in json",
    ),
    "put a state without a value": (
        "POST",
        f"{FUNCTIONS}/f/state/k",
        {"data": {"state": json.dumps({"key": "k"})}},
        400,
        "Setting Counter values not supported in put state",
    ),
    "query the state of a missing function": (
        "GET",
        f"{FUNCTIONS}/nope/state/k",
        {},
        404,
        "Function nope doesn't exist",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refusals_answer_pulsars_code_and_reason(api: Api, case: str) -> None:
    method, path, request, status, reason = CASES[case]
    if "data" in request and isinstance(request["data"].get("functionConfig"), str):
        config = request["data"]["functionConfig"].replace("{topic}", api.topic)
        request = {**request, "data": {**request["data"], "functionConfig": config}}
    answer = api.call(method, path, **request)
    assert (answer.status_code, answer.json()) == (status, {"reason": reason})


@pytest.mark.parametrize(
    ("method", "path", "request_", "status", "reason"),
    [
        (
            "POST",
            f"{FUNCTIONS}/f",
            form({"inputs": ["x"], "className": CLASS}),
            400,
            "Function f already exists",
        ),
        (
            "PUT",
            f"{FUNCTIONS}/nope",
            _update({"parallelism": 2}),
            400,
            "Function nope doesn't exist",
        ),
        ("POST", f"{FUNCTIONS}/f/start", {}, 400, "Operation not permitted"),
    ],
)
def test_the_leader_answers_the_same(
    api: Api, method: str, path: str, request_: dict[str, Any], status: int, reason: str
) -> None:
    answer = api.call(method, path, via="leader", **request_)
    assert (answer.status_code, answer.json()) == (status, {"reason": reason})


def test_what_succeeds_answers_204_without_a_body(api: Api) -> None:
    answer = api.call(
        "POST", f"{FUNCTIONS}/lifecycle", **form({"inputs": ["lc-in"], "className": CLASS})
    )
    assert (answer.status_code, answer.content) == (204, b"")
    got = api.call("GET", f"{FUNCTIONS}/lifecycle")
    assert got.status_code == 200 and got.json()["inputs"] == ["lc-in"]
    updated = api.call("PUT", f"{FUNCTIONS}/lifecycle", **_update({"parallelism": 2}))
    assert (updated.status_code, updated.content) == (204, b"")
    assert api.call("GET", f"{FUNCTIONS}/lifecycle").json()["parallelism"] == 2

    steps = [
        ("1/stop", 204),
        ("1/stop", 400),  # stopped already: Operation not permitted
        ("1/restart", 204),  # a stopped instance stays stopped, as in Pulsar
        ("1/start", 204),
        ("-1/stop", 204),  # a negative instance id is every instance, as in Pulsar
        ("stop", 400),
        ("-1/start", 204),
        ("stop", 204),
        ("stop", 400),
        ("start", 204),
    ]
    for path, status in steps:
        answer = api.call("POST", f"{FUNCTIONS}/lifecycle/{path}")
        assert answer.status_code == status, (path, answer.text)
        if status == 204:
            assert answer.content == b"", path
        else:
            assert answer.json() == {"reason": "Operation not permitted"}, path
    api.wait_running("lifecycle", 2)  # restarting needs the instances scheduled
    restarted = api.call("POST", f"{FUNCTIONS}/lifecycle/restart")
    assert (restarted.status_code, restarted.content) == (204, b"")

    names = api.call("GET", FUNCTIONS).json()
    assert {"f", "lifecycle", "sink", "two"} <= set(names) and names == sorted(names)
    deleted = api.call("DELETE", f"{FUNCTIONS}/lifecycle")
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert api.call("GET", f"{FUNCTIONS}/lifecycle").status_code == 404


def test_a_trigger_without_output_topic_answers_204(api: Api) -> None:
    answer = api.call("POST", f"{FUNCTIONS}/sink/trigger", data={"data": "hello"})
    assert (answer.status_code, answer.content) == (204, b"")


def test_a_trigger_without_output_in_time_is_408_request_timed_out(api: Api) -> None:
    api.register("quiet", inputs=["quiet-in"], output="quiet-out")
    assert api.call("POST", f"{FUNCTIONS}/quiet/stop").status_code == 204
    api.wait_running("quiet", 0)  # a stop is carried out after it is answered, as in Pulsar
    answer = api.call("POST", f"{FUNCTIONS}/quiet/trigger", data={"data": "x"})
    assert (answer.status_code, answer.json()) == (408, {"reason": "Request Timed Out"})


def test_listing_an_unknown_namespace_is_an_empty_list(api: Api) -> None:
    answer = api.call("GET", "/admin/v3/functions/nobody/nowhere")
    assert (answer.status_code, answer.json()) == (200, [])


def test_the_path_names_the_function_whatever_the_config_says(api: Api) -> None:
    body = {"inputs": ["named-in"], "className": CLASS, "name": "other", "tenant": "elsewhere"}
    assert api.call("POST", f"{FUNCTIONS}/named", **form(body)).status_code == 204
    got = api.call("GET", f"{FUNCTIONS}/named").json()
    assert (got["tenant"], got["namespace"], got["name"]) == ("public", "default", "named")
    assert api.call("GET", f"{FUNCTIONS}/other").status_code == 404


def _zip(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "filename", "code", "class_name", "cause"),
    [
        ("noproc", "noproc.py", b"def handle(x):\n    return x\n", "noproc", "noproc"),
        (
            "zipped",
            "pkg.zip",
            _zip({"other.py": "def process(x):\n    return x\n"}),
            "missing.Thing",
            "missing",
        ),
    ],
)
def test_code_pulsar_does_not_check_is_accepted_and_its_fault_shows_in_status(
    api: Api, name: str, filename: str, code: bytes, class_name: str, cause: str
) -> None:
    """Pulsar registers Python code without loading it (204); the instance that cannot load
    it says why in ``functions status`` instead of crash-looping silently."""
    config = {"inputs": [f"{name}-in"], "className": class_name}
    answer = api.call(
        "POST",
        f"{FUNCTIONS}/{name}",
        data={"functionConfig": json.dumps(config)},
        files={"data": (filename, code)},
    )
    assert (answer.status_code, answer.content) == (204, b"")

    def error() -> str:
        status = api.call("GET", f"{FUNCTIONS}/{name}/0/status").json()
        return "" if status["running"] else str(status["error"])

    deadline = time.monotonic() + 20
    while not error() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cause in error(), error()


def test_no_function_names_a_topic_of_the_system_namespace(api: Api) -> None:
    # authentication is off here: the wall holds for everyone
    system = api.cluster.settings["system_namespace"]
    wall = (
        f"a topic of the system namespace {system}: no function may consume from or produce "
        "to the functions worker's own topics"
    )
    metadata = f"persistent://{system}/metadata"
    register = api.call(
        "POST", f"{FUNCTIONS}/spy", **form({"inputs": [metadata], "className": CLASS})
    )
    assert (register.status_code, register.json()) == (
        400,
        {"reason": f"inputs names {metadata}, {wall}"},
    )
    pattern = api.call(
        "POST",
        f"{FUNCTIONS}/spy",
        **form({"topicsPattern": f"persistent://{system}/.*", "className": CLASS}),
    )
    assert pattern.status_code == 400 and wall in pattern.json()["reason"]
    update = api.call("PUT", f"{FUNCTIONS}/f", **_update({"output": f"{system}/assignments"}))
    assert (update.status_code, update.json()) == (
        400,
        {"reason": f"output names persistent://{system}/assignments, {wall}"},
    )
    assert api.call("GET", f"{FUNCTIONS}/spy").status_code == 404


def test_get_answers_the_function_config_pulsars_worker_answers(api: Api) -> None:
    """Pulsar's defaults as its worker fills them in (FunctionConfigUtils.convertFromDetails),
    the inputs as inputSpecs; then what was sent that Pulsar's answer leaves out. Sent back
    as an update, it changes nothing (as in Pulsar)."""
    sent = {"className": CLASS, "inputs": ["get-in"], "output": "get-out"}
    created = api.call("POST", f"{FUNCTIONS}/shown", **form(sent))
    assert created.status_code == 204, created.text
    got = api.call("GET", f"{FUNCTIONS}/shown").json()
    assert got == {
        "tenant": "public",
        "namespace": "default",
        "name": "shown",
        "className": CLASS,
        "inputSpecs": {
            "get-in": {
                "regexPattern": False,
                "schemaProperties": {},
                "consumerProperties": {},
                "poolMessages": False,
            }
        },
        "output": "get-out",
        "producerConfig": {"useThreadLocalProducers": False, "batchBuilder": ""},
        "processingGuarantees": "ATLEAST_ONCE",
        "retainOrdering": False,
        "retainKeyOrdering": False,
        "forwardSourceMessageProperty": True,
        "userConfig": {},
        "runtime": "PYTHON",
        "autoAck": True,
        "parallelism": 1,
        "resources": {"cpu": 1.0, "ram": 1073741824, "disk": 10737418240},
        "cleanupSubscription": True,
        "subscriptionPosition": "Latest",
        # as sent, beyond Pulsar's answer
        "py": "exclamation.py",
        "inputs": ["get-in"],
    }
    again = api.call("PUT", f"{FUNCTIONS}/shown", **_update(got))
    assert (again.status_code, again.json()) == (400, {"reason": "Update contains no change"})
    scaled = api.call("PUT", f"{FUNCTIONS}/shown", **_update({**got, "parallelism": 2}))
    assert scaled.status_code == 204, scaled.text
    assert api.call("GET", f"{FUNCTIONS}/shown").json()["parallelism"] == 2
    assert api.call("DELETE", f"{FUNCTIONS}/shown").status_code == 204


def test_get_folds_every_way_of_naming_inputs_into_input_specs(api: Api) -> None:
    sent = {
        "className": CLASS,
        "topicsPattern": "persistent://public/default/pat-.*",
        "customSerdeInputs": {"serde-in": "serde.IdentitySerDe"},
        "inputSpecs": {"spec-in": {"receiverQueueSize": 7}},
        "resources": {"cpu": 0.5},
        "processingGuarantees": "EFFECTIVELY_ONCE",
        "cleanupSubscription": False,
    }
    created = api.call("POST", f"{FUNCTIONS}/folded", **form(sent))
    assert created.status_code == 204, created.text
    got = api.call("GET", f"{FUNCTIONS}/folded").json()
    empty = {"schemaProperties": {}, "consumerProperties": {}, "poolMessages": False}
    assert got["inputSpecs"] == {
        "persistent://public/default/pat-.*": {"regexPattern": True, **empty},
        "serde-in": {"serdeClassName": "serde.IdentitySerDe", "regexPattern": False, **empty},
        "spec-in": {"regexPattern": False, "receiverQueueSize": 7, **empty},
    }
    assert got["resources"] == {"cpu": 0.5, "ram": 1073741824, "disk": 10737418240}
    assert (got["processingGuarantees"], got["cleanupSubscription"]) == ("EFFECTIVELY_ONCE", False)
    assert api.call("DELETE", f"{FUNCTIONS}/folded").status_code == 204
