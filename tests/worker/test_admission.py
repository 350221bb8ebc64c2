"""Admission decides, without a cluster, what is valid and what is too much: each refusal
carries the reason a user sees (Pulsar's where Pulsar has one, else one naming the limit)."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import pytest

from magnetar.instance.archive import ArchiveLimits
from magnetar.instance.exceptions import InvalidFunctionConfigError
from magnetar.worker.admission import Admission, AdmissionLimits
from magnetar.worker.exceptions import AdmissionError
from magnetar.worker.metadata import FunctionRecord

LIMITS = AdmissionLimits(max_parallelism=4, max_instances_per_worker=3, max_name_length=12)
PACKAGE = {"sha256": "a" * 64, "size": 10, "filename": "fn.py", "messageId": "CAEQAg=="}


def config(name: str = "fn", **fields: Any) -> dict[str, Any]:
    return {
        "tenant": "acme",
        "namespace": "ns",
        "name": name,
        "inputs": ["in"],
        "py": "fn.py",
    } | fields


def record(name: str, version: int = 1, **fields: Any) -> FunctionRecord:
    return FunctionRecord(f"acme/ns/{name}", config(name, **fields), PACKAGE, version=version)


def refusal(call: Any, *args: Any) -> str:
    with pytest.raises(AdmissionError) as refused:
        call(*args)
    assert refused.value.status_code == 400
    return refused.value.reason


@pytest.mark.parametrize(
    ("names", "reason"),
    [
        (
            ("acme", "ns", "a b"),
            "Function name 'a b' is invalid: a name holds only letters, digits and the "
            "characters - = : . _ (Pulsar's naming rule)",
        ),
        (("acme", "ns", "nul\x00"), "Function name 'nul\\x00' is invalid"),
        (("acme", "ns", "caf\u00e9"), "Function name 'caf\u00e9' is invalid"),
        (("ac/me", "ns", "fn"), "Tenant name 'ac/me' is invalid"),
        (("acme", "n s", "fn"), "Namespace name 'n s' is invalid"),
        (
            ("acme", "ns", "f" * 13),
            "Function name is 13 characters long, more than the limit of 12 (max_name_length)",
        ),
        (("acme", "", "fn"), "Namespace name is not provided"),
    ],
)
def test_names_follow_pulsars_rule_and_the_length_bound(
    names: tuple[str, str, str], reason: str
) -> None:
    assert refusal(Admission(LIMITS).check_names, *names).startswith(reason)


def test_names_pulsar_allows_pass() -> None:
    Admission(LIMITS).check_names("acme-1", "ns.a=b:c", "f" * 12)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"parallelism": 0}, "Function parallelism must be a positive number"),
        ({"parallelism": -2}, "Function parallelism must be a positive number"),
        (
            {"parallelism": 5},
            "Function parallelism 5 is more than the limit of 4 instances per function "
            "(max_parallelism)",
        ),
        (
            {"parallelism": 99999999999999999999999},
            "Function parallelism 99999999999999999999999 is more than the limit of 4",
        ),
        ({"timeoutMs": 0}, "Function timeout must be a positive number"),
        (
            {"timeoutMs": 86_400_001},
            "Function timeout 86400001 ms is more than the limit of 86400000 ms (a day)",
        ),
        ({"resources": {"cpu": -1}}, "The cpu allocation for the function must be positive"),
        ({"resources": {"ram": 0}}, "The ram allocation for the function must be positive"),
        (
            {"resources": {"disk": "big"}},
            "resources.disk must be a whole number of bytes, not 'big'",
        ),
        ({"resources": {"cpu": float("inf")}}, "resources.cpu inf is out of range"),
        ({"resources": {"ram": 2**63}}, f"resources.ram {2**63} is out of range"),
        (
            {"maxMessageRetries": 2**31},
            f"maxMessageRetries {2**31} is out of range: at most {2**31 - 1}",
        ),
        ({"maxPendingAsyncRequests": 2**40}, f"maxPendingAsyncRequests {2**40} is out of range"),
        (
            {"windowConfig": {"windowLengthCount": 2**31}},
            f"windowConfig.windowLengthCount {2**31} is out of range",
        ),
        ({"inputSpecs": {"in": {"receiverQueueSize": 2**31}}}, "inputSpecs[in].receiverQueueSize"),
    ],
)
def test_numbers_out_of_range_are_refused(fields: dict[str, Any], reason: str) -> None:
    assert refusal(Admission(LIMITS).check_config, config(**fields)).startswith(reason)


def test_a_config_of_the_wrong_types_is_refused_with_what_was_wrong() -> None:
    with pytest.raises(
        InvalidFunctionConfigError, match="parallelism: Input should be a valid integer"
    ):
        Admission(LIMITS).check_config(config(parallelism="zzz", inputs=5))


def test_a_valid_config_passes_parsed() -> None:
    parsed = Admission(LIMITS).check_config(
        config(parallelism=4, timeoutMs=1000, resources={"cpu": 0.5, "ram": 1 << 28})
    )
    assert (parsed.parallelism, parsed.timeout_ms) == (4, 1000)


def test_the_cluster_holds_instances_per_live_worker() -> None:
    admission = Admission(LIMITS)
    functions = {r.fqfn: r for r in (record("a", parallelism=3), record("b", parallelism=2))}

    reason = refusal(admission.check_capacity, "acme/ns/c", 2, None, functions, 2)
    assert reason == (
        "Function c would take the cluster to 7 instances, more than the limit of 6: "
        "3 per worker (max_instances_per_worker) x 2 live workers"
    )
    admission.check_capacity("acme/ns/c", 1, None, functions, 2)
    admission.check_capacity("acme/ns/c", 4, None, functions, 3)
    # an update growing "a" is counted without its old instances; one shrinking it passes
    assert "to 6 instances, more than the limit of 3" in refusal(
        admission.check_capacity, "acme/ns/a", 4, functions["acme/ns/a"], functions, 1
    )
    admission.check_capacity(
        "acme/ns/a",
        1,
        functions["acme/ns/a"],
        {**functions, "acme/ns/x": record("x", parallelism=4)},
        1,
    )


def test_one_tenant_cannot_take_the_capacity_the_others_register_into() -> None:
    admission = Admission(AdmissionLimits(max_instances_per_worker=3, max_instances_per_tenant=5))
    functions = {r.fqfn: r for r in (record("a", parallelism=3), record("b", parallelism=2))}

    # the cluster (4 workers: 12) has room, the tenant (5) has none
    assert refusal(admission.check_capacity, "acme/ns/c", 1, None, functions, 4) == (
        "Function c would take tenant acme to 6 instances, more than the limit of 5 per tenant "
        "(max_instances_per_tenant)"
    )
    assert "take tenant acme to 6 instances" in refusal(
        admission.check_capacity, "acme/other/c", 1, None, functions, 4
    )  # every namespace of the tenant counts
    admission.check_capacity("rival/ns/c", 4, None, functions, 4)  # another tenant's room
    # growing within the tenant's room passes; shrinking always does
    admission.check_capacity("acme/ns/b", 2, functions["acme/ns/b"], functions, 4)
    assert "take tenant acme to 7 instances" in refusal(
        admission.check_capacity, "acme/ns/b", 4, functions["acme/ns/b"], functions, 4
    )
    over = {**functions, "acme/ns/x": record("x", parallelism=4)}  # from before a lower limit
    admission.check_capacity("acme/ns/a", 1, functions["acme/ns/a"], over, 4)


def test_records_admission_refuses_hold_no_instances() -> None:
    admission = Admission(LIMITS)
    bad = FunctionRecord("acme/ns/badcfg", {"parallelism": "zzz", "inputs": 5}, PACKAGE, version=3)
    too_many = record("big", parallelism=10_000)
    functions = {r.fqfn: r for r in (bad, too_many, record("a", parallelism=2))}

    with pytest.raises(AdmissionError, match=r"invalid function config: .*parallelism"):
        admission.scheduled_parallelism(bad)
    with pytest.raises(AdmissionError, match="max_parallelism"):
        admission.scheduled_parallelism(too_many)
    assert admission.scheduled_parallelism(functions["acme/ns/a"]) == 2
    admission.check_capacity("acme/ns/c", 4, None, functions, 2)  # 2 + 4 <= 6


@pytest.mark.parametrize(
    ("fqfn", "fields", "package", "reason"),
    [
        (
            "acme/ns/fn",
            {"name": "other"},
            PACKAGE,
            "the config names function acme/ns/other, not acme/ns/fn",
        ),
        ("acme/fn", {}, PACKAGE, "'acme/fn' is not a function name as tenant/namespace/name"),
        ("acme/ns/fn", {}, None, "Function Package is not provided"),
        ("acme/ns/fn", {}, {"sha256": "x"}, "invalid package reference"),
        ("acme/ns/fn", None, PACKAGE, "Function config is not provided"),
    ],
)
def test_a_change_as_the_leader_writes_it(
    fqfn: str, fields: dict[str, Any] | None, package: Any, reason: str
) -> None:
    body = None if fields is None else config(**fields)
    assert refusal(Admission(LIMITS).check_change, fqfn, body, package, None, {}, 1).startswith(
        reason
    )


def test_a_package_is_checked_by_its_directory() -> None:
    admission = Admission(AdmissionLimits(archive=ArchiveLimits(max_unpacked_bytes=1 << 20)))
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("zeros", bytes(2 << 20))

    assert refusal(admission.check_package, bomb.getvalue(), "fn.zip") == (
        f"the function package unpacks to more than {1 << 20} bytes, the limit "
        "(max_package_unpacked_bytes)"
    )
    assert refusal(admission.check_package, b"not a zip", "fn.whl").startswith(
        "the function package is not a valid zip archive"
    )
    admission.check_package(b"anything", "fn.py")
