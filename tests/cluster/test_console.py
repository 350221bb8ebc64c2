"""The web console in a real browser (headless chromium), against a 3-worker cluster: what a
person sees there after deploying, producing, killing a worker and being refused."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pulsar
import pytest
from playwright.sync_api import expect

from tests.cluster.conftest import Cluster, ConsolePages, Worker, wait_until, worker_env
from tests.conftest import EXAMPLES, Broker

# the cluster answers within seconds, but instances start and move in tens of seconds here
expect.set_options(timeout=60_000)


@pytest.fixture(scope="module")
def workers(
    cluster_broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, list[Worker]]]:
    """Three workers for the module; the last test kills one."""
    cluster = Cluster(
        cluster_broker.service_url, tmp_path_factory.mktemp("console"), worker_env(cluster_broker)
    )
    try:
        yield cluster, cluster.start(3)
    finally:
        cluster.stop_all()


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_a_function_deployed_from_the_console_runs_and_its_counters_move(
    console: ConsolePages, workers: tuple[Cluster, list[Worker]], cluster_client: pulsar.Client
) -> None:
    _, (first, *_) = workers
    name, source, sink = _unique("shout"), _unique("in"), _unique("out")
    page = console.open(first)
    form = page.locator("#deploy-form")
    form.locator("[name=name]").fill(name)
    form.locator("[name=inputs]").fill(source)
    form.locator("[name=output]").fill(sink)
    form.locator("[name=parallelism]").fill("2")
    form.locator("[name=code]").set_input_files(EXAMPLES / "exclamation.py")
    form.locator("button").click()
    expect(page.locator("#deploy-message")).to_have_text(f"Deployed public/default/{name}: open it")

    row = page.locator(f'tr[data-function="public/default/{name}"]')
    expect(row.locator(".status")).to_have_text("2/2 running")
    row.get_by_role("link", name=name).click()
    expect(page.locator("#function-title")).to_have_text(f"public/default/{name}")
    expect(page.locator("#instances tbody tr")).to_have_count(2)

    producer = cluster_client.create_producer(source)
    for index in range(5):
        producer.send(f"hello {index}".encode())
    producer.close()
    expect(page.locator('[data-total="received"]')).to_have_text("5")
    expect(page.locator('[data-total="processed"]')).to_have_text("5")
    expect(page.locator('[data-total="exceptions"]')).to_have_text("0")
    # the instances' own counters add up to the same
    processed = page.locator("#instances tbody tr td:nth-child(6)").all_inner_texts()
    assert sum(int(n) for n in processed) == 5

    page.locator("#trigger-form [name=value]").fill("hi")
    page.locator("#trigger-form button").click()
    expect(page.locator("#trigger-output")).to_have_text("hi!")
    expect(page.locator('[data-total="processed"]')).to_have_text("6")


def test_a_refused_request_shows_pulsars_reason(
    console: ConsolePages, workers: tuple[Cluster, list[Worker]]
) -> None:
    cluster, (first, second, _) = workers
    name = _unique("taken")
    assert cluster.create(second, name, inputs=[_unique("in")]).status_code == 204
    page = console.open(first)
    form = page.locator("#deploy-form")
    form.locator("[name=name]").fill(name)
    form.locator("[name=inputs]").fill(_unique("in"))
    form.locator("[name=code]").set_input_files(EXAMPLES / "exclamation.js")
    form.locator("button").click()
    expect(page.locator("#deploy-message")).to_have_text(f"Refused: Function {name} already exists")

    page.goto(f"{first.url}/console/#/functions/public/default/{name}")
    page.locator("#state-form [name=key]").fill("nothing-here")
    page.locator("#state-form button").click()
    expect(page.locator("#state-output")).to_have_text("key 'nothing-here' doesn't exist.")
    page.locator("#function-page [data-action=start]").click()
    expect(page.locator("#function-message")).to_have_text("start refused: Operation not permitted")


def test_a_killed_worker_leaves_the_cluster_view_and_its_instances_move(
    console: ConsolePages, workers: tuple[Cluster, list[Worker]]
) -> None:
    """Last in the module: it kills a worker of the module's cluster."""
    cluster, (first, *others) = workers
    name = _unique("spread")
    assert cluster.create(first, name, inputs=[_unique("in")], parallelism=3).status_code == 204
    keys = {f"public/default/{name}:{i}" for i in range(3)}

    def placed() -> dict[str, list[str]]:
        return {w: [k for k in ks if k in keys] for w, ks in cluster.assignments(first).items()}

    wait_until(lambda: sum(map(len, placed().values())) == 3, 60, "3 instances placed")
    page = console.open(first)
    for worker in (first, *others):
        expect(page.locator(f'tr[data-worker="{worker.worker_id}"]')).to_have_count(1)
    expect(page.locator("#cluster-summary")).to_contain_text("3 workers")
    victim = next(w for w in others if placed().get(w.worker_id))
    moved = placed()[victim.worker_id]

    victim.kill(with_instances=True)
    expect(page.locator(f'tr[data-worker="{victim.worker_id}"]')).to_have_count(0)
    expect(page.locator("#cluster-summary")).to_contain_text("2 workers")
    for key in moved:
        chip = page.locator(f'#workers [data-instance="{key}"]')
        expect(chip).to_have_count(1)
        owner = chip.locator("xpath=ancestor::tr[1]").get_attribute("data-worker")
        assert owner in {w.worker_id for w in (first, *others) if w is not victim}
    row = page.locator(f'tr[data-function="public/default/{name}"]')
    expect(row.locator(".status")).to_have_text("3/3 running")
