"""Function code packages on the real broker: upload on one worker, fetch on another."""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import threading
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.broker import EmbeddedBroker
from magnetar.positions import Position, position
from magnetar.worker.exceptions import PackageError
from magnetar.worker.packages import PackageRef, PackageStore
from tests.conftest import EXAMPLES

KIB = 1024

StoreFactory = Callable[..., PackageStore]


@pytest.fixture
def make_store(client: pulsar.Client, topic: str, tmp_path: Path) -> StoreFactory:
    """A PackageStore on the test's topic with a cache of its own: one per simulated worker."""
    count = 0

    def make(**options: Any) -> PackageStore:
        nonlocal count
        count += 1
        options.setdefault("client", client)
        return PackageStore(topic=topic, cache_dir=tmp_path / f"worker-{count}", **options)

    return make


class RedeliveringClient:
    """The client seam, with readers that deliver every message twice, as pulsar-lite may."""

    def __init__(self, client: pulsar.Client) -> None:
        self._client = client

    def create_reader(self, *args: Any, **kwargs: Any) -> Any:
        return RedeliveringReader(self._client.create_reader(*args, **kwargs))


class RedeliveringReader:
    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self._again: Any = None

    def read_next(self, timeout_millis: int) -> Any:
        if self._again is not None:
            message, self._again = self._again, None
            return message
        self._again = self._reader.read_next(timeout_millis)
        return self._again

    def close(self) -> None:
        self._reader.close()


def read_topic(client: pulsar.Client, topic: str, expected: int) -> list[pulsar.Message]:
    """The messages of ``topic``, once each, in order: ``expected`` of them plus any more that
    come at once. A reader that stalls (pulsar-lite's do, now and then) is replaced."""
    messages: dict[Position, pulsar.Message] = {}
    start = pulsar.MessageId.earliest
    deadline = time.monotonic() + 10
    while len(messages) < expected and time.monotonic() < deadline:
        reader = client.create_reader(topic, start, start_message_id_inclusive=True)
        try:
            while True:
                try:
                    message = reader.read_next(1000 if len(messages) < expected else 200)
                except pulsar.Timeout:
                    break
                messages[position(message.message_id())] = message
                start = message.message_id()
        finally:
            reader.close()
    return [messages[key] for key in sorted(messages)]


def send(client: pulsar.Client, topic: str, data: bytes, properties: dict[str, str]) -> str:
    """Publish one message by hand; returns its id as a PackageRef carries it."""
    producer = client.create_producer(topic, batching_enabled=False)
    try:
        message_id = producer.send(data, properties=properties)
    finally:
        producer.close()
    return base64.b64encode(message_id.serialize()).decode("ascii")


def test_a_worker_that_never_saw_the_upload_fetches_the_code(make_store: StoreFactory) -> None:
    code = (EXAMPLES / "exclamation.py").read_bytes()
    ref = make_store().upload(code, "exclamation.py")

    path = make_store().fetch(PackageRef.from_json(ref.to_json()))

    assert path.name == "exclamation.py"
    assert path.read_bytes() == code
    assert ref.sha256 == hashlib.sha256(code).hexdigest()
    assert ref.size == len(code)


def test_chunks_are_consecutive_messages_with_their_properties(
    make_store: StoreFactory, client: pulsar.Client, topic: str
) -> None:
    data = os.urandom(1_000_000)
    ref = make_store(chunk_bytes=64 * KIB).upload(data, "big.py")

    messages = read_topic(client, topic, 16)
    assert len(messages) == 16  # 1,000,000 bytes in 64 KiB chunks
    assert [m.properties()["chunk"] for m in messages] == [str(i) for i in range(16)]
    assert {m.properties()["chunks"] for m in messages} == {"16"}
    assert {m.properties()["sha256"] for m in messages} == {ref.sha256}
    assert {m.properties()["size"] for m in messages} == {"1000000"}
    assert {m.properties()["filename"] for m in messages} == {"big.py"}
    assert b"".join(m.data() for m in messages) == data
    assert make_store().fetch(ref).read_bytes() == data


def test_a_real_zip_package_round_trips(make_store: StoreFactory, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.write(EXAMPLES / "exclamation.py", "exclamation.py")
        archive.writestr("data/blob.bin", os.urandom(3_000_000))
    package = buffer.getvalue()

    ref = make_store().upload(package, "fn.zip")  # default 1 MiB chunks: 3 of them
    path = make_store().fetch(ref)

    assert path.suffix == ".zip"
    assert path.read_bytes() == package
    with zipfile.ZipFile(path) as archive:
        assert archive.read("exclamation.py") == (EXAMPLES / "exclamation.py").read_bytes()


def test_packages_uploaded_at_once_interleave_and_both_fetch(make_store: StoreFactory) -> None:
    first, second = os.urandom(512 * KIB), os.urandom(640 * KIB)
    uploaders = [make_store(chunk_bytes=8 * KIB), make_store(chunk_bytes=8 * KIB)]
    with ThreadPoolExecutor(2) as pool:
        refs = list(pool.map(PackageStore.upload, uploaders, [first, second], ["a.py", "b.zip"]))

    worker = make_store()
    assert worker.fetch(refs[0]).read_bytes() == first
    assert worker.fetch(refs[1]).read_bytes() == second
    assert worker.fetch(refs[1]).name == "b.zip"


def test_the_same_content_uploaded_at_once_with_other_chunk_sizes_is_not_mixed(
    make_store: StoreFactory,
) -> None:
    data = os.urandom(512 * KIB)
    uploaders = [make_store(chunk_bytes=8 * KIB), make_store(chunk_bytes=24 * KIB)]
    with ThreadPoolExecutor(2) as pool:
        refs = list(pool.map(PackageStore.upload, uploaders, [data, data], ["fn.py", "fn.py"]))

    assert refs[0].sha256 == refs[1].sha256
    assert refs[0].message_id != refs[1].message_id
    for ref in refs:
        assert make_store().fetch(ref).read_bytes() == data


def test_the_same_content_uploaded_twice_has_the_same_sha256(
    make_store: StoreFactory, client: pulsar.Client, topic: str
) -> None:
    data = os.urandom(100 * KIB)
    store = make_store(chunk_bytes=64 * KIB)
    ref = store.upload(data, "fn.py")

    again = store.upload(data, "fn.py")
    renamed = store.upload(data, "renamed.py")
    elsewhere = make_store(chunk_bytes=64 * KIB).upload(data, "fn.py")

    assert again == ref  # known locally and on the topic: not written again
    assert (renamed.sha256, renamed.message_id, renamed.filename) == (
        ref.sha256,
        ref.message_id,
        "renamed.py",
    )
    assert elsewhere.sha256 == ref.sha256  # another worker's upload: new messages, same digest
    assert len(read_topic(client, topic, 4)) == 4
    assert make_store().fetch(renamed).read_bytes() == data


def test_a_reupload_after_the_broker_lost_the_package_writes_it_again(
    tmp_path: Path, topic: str
) -> None:
    data = os.urandom(10 * KIB)
    cache = tmp_path / "worker"
    with EmbeddedBroker(tmp_path / "broker-1") as broker:
        client = pulsar.Client(
            broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )
        PackageStore(client, topic, cache).upload(data, "fn.py")
        client.close()
    with EmbeddedBroker(tmp_path / "broker-2") as broker:
        client = pulsar.Client(
            broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )
        try:
            ref = PackageStore(client, topic, cache, fetch_timeout=0.5).upload(data, "fn.py")
            fetched = PackageStore(client, topic, tmp_path / "other").fetch(ref)
            assert fetched.read_bytes() == data
        finally:
            client.close()


@pytest.mark.parametrize("damage", ["overwritten", "truncated", "deleted"])
def test_a_damaged_cache_file_is_downloaded_again(make_store: StoreFactory, damage: str) -> None:
    data = os.urandom(200 * KIB)
    ref = make_store(chunk_bytes=64 * KIB).upload(data, "fn.py")
    worker = make_store()
    path = worker.fetch(ref)

    if damage == "overwritten":
        path.write_bytes(os.urandom(len(data)))
    elif damage == "truncated":
        path.write_bytes(data[:1000])
    else:
        path.unlink()

    assert worker.fetch(ref) == path
    assert path.read_bytes() == data


def test_a_corrupt_package_on_the_topic_is_rejected_and_not_cached(
    make_store: StoreFactory, client: pulsar.Client, topic: str
) -> None:
    claimed = b"def process(input):\n    return input\n"
    sha256 = hashlib.sha256(claimed).hexdigest()
    properties = {
        "sha256": sha256,
        "chunk": "0",
        "chunks": "1",
        "size": str(len(claimed)),
        "filename": "fn.py",
    }
    message_id = send(client, topic, b"x" * len(claimed), properties)
    ref = PackageRef(sha256=sha256, size=len(claimed), filename="fn.py", message_id=message_id)
    worker = make_store()

    with pytest.raises(PackageError, match=f"package {sha256} .*corrupt"):
        worker.fetch(ref)
    assert not list(worker.cache_dir.rglob("*.py*"))


def test_a_reference_to_an_unrelated_message_fails_fast_and_clearly(
    make_store: StoreFactory, client: pulsar.Client, topic: str
) -> None:
    message_id = send(client, topic, b"hello", {"kind": "not a package"})
    ref = PackageRef(sha256="ab" * 32, size=5, filename="fn.py", message_id=message_id)

    started = time.monotonic()
    with pytest.raises(PackageError) as raised:
        make_store().fetch(ref)

    assert time.monotonic() - started < 3
    assert "ab" * 32 in str(raised.value)
    assert topic in str(raised.value)
    assert "not its first chunk" in str(raised.value)


def test_a_reference_past_the_end_of_the_topic_times_out_clearly(
    make_store: StoreFactory, client: pulsar.Client, topic: str
) -> None:
    send(client, topic, b"hello", {})
    nowhere = pulsar.MessageId(-1, 0, 1000, -1).serialize()
    ref = PackageRef(
        sha256="cd" * 32, size=5, filename="fn.zip", message_id=base64.b64encode(nowhere).decode()
    )

    started = time.monotonic()
    with pytest.raises(PackageError, match=f"package {'cd' * 32} \\(fn.zip\\) was not found on"):
        make_store(fetch_timeout=1.0).fetch(ref)
    assert time.monotonic() - started < 3


def test_concurrent_fetches_of_one_package_download_it_once(
    make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    data = os.urandom(1_000_000)
    ref = make_store(chunk_bytes=64 * KIB).upload(data, "fn.py")
    worker = make_store()
    barrier = threading.Barrier(8)

    def fetch(_: int) -> Path:
        barrier.wait()
        return worker.fetch(ref)

    with (
        caplog.at_level(logging.INFO, logger="magnetar.worker.packages"),
        ThreadPoolExecutor(8) as pool,
    ):
        paths = set(pool.map(fetch, range(8)))

    assert [r.message for r in caplog.records if r.message.startswith("downloaded")] == [
        f"downloaded package {ref.sha256} (fn.py, 1000000 bytes)"
    ]
    assert len(paths) == 1
    assert paths.pop().read_bytes() == data


def test_redelivered_chunks_are_taken_once(make_store: StoreFactory, client: pulsar.Client) -> None:
    data = os.urandom(300 * KIB)
    ref = make_store(chunk_bytes=64 * KIB).upload(data, "fn.py")

    path = make_store(client=RedeliveringClient(client)).fetch(ref)

    assert path.read_bytes() == data


def test_a_reference_survives_json() -> None:
    ref = PackageRef(sha256="0f" * 32, size=3, filename="fn.zip", message_id="CAAQAw==")
    assert PackageRef.from_json(ref.to_json()) == ref


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"sha256": "0f" * 32, "size": 3, "filename": "../evil.py", "messageId": "x"}, "file name"),
        ({"sha256": "nothex", "size": 3, "filename": "fn.py", "messageId": "x"}, "sha256"),
        ({"sha256": "0f" * 32, "size": -1, "filename": "fn.py", "messageId": "x"}, "size"),
        ({"sha256": "0f" * 32, "size": 3, "filename": "fn.py"}, "messageId"),
    ],
)
def test_a_malformed_reference_is_rejected(data: dict[str, Any], match: str) -> None:
    with pytest.raises(PackageError, match=match):
        PackageRef.from_json(data)


def test_an_empty_or_badly_named_upload_is_rejected(make_store: StoreFactory) -> None:
    store = make_store()
    with pytest.raises(PackageError, match="empty"):
        store.upload(b"", "fn.py")
    with pytest.raises(PackageError, match="file name"):
        store.upload(b"x = 1\n", "dir/fn.py")
    with pytest.raises(PackageError, match="chunk_bytes"):
        make_store(chunk_bytes=6 * 1024 * KIB)
