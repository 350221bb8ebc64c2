"""What ``curl()`` costs a JavaScript function, without a broker: chunks of messages through a
JavaScript executor (as an instance runs them) whose function makes 0, 1 or 2 requests a
message to a local HTTP endpoint, against the same requests made from Python alone.

Each request stops the message and the V8 call; Python sends the request and calls V8 again,
which runs the message from its start. So a request costs its HTTP exchange plus one more V8
call and one more run of the message: the JSON holds the time per message of each variant,
the HTTP exchange alone, and what a request adds beyond its exchange.

    python bench/js_curl.py [--messages 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from magnetar.instance.config import FunctionConfig
from magnetar.instance.javascript import open_executor
from magnetar.instance.javascript._curl import UrlClient
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.secrets import ClearTextSecretsProvider
from magnetar.instance.state import UnconfiguredStateStore
from magnetar.instance.url_bindings import UrlBinding
from magnetar.instance.url_hosts import UrlHostRule

LOCAL_SERVER = UrlHostRule(("127.0.0.1",))
"""The worker setting that lets bindings reach the bench's server on 127.0.0.1."""
CHUNK = 500
SCRIPTS = {
    0: "function process(input) { return input + '!'; }",
    1: "function process(input) { return curl('GET', api, {path: input}).body.n; }",
    2: """function process(input) {
      const first = curl('GET', api, {path: input});
      return curl('POST', api, {path: input, body: {n: first.body.n}}).body.n;
    }""",
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        data = b'{"n": 1}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer  # noqa: N815


class _Message:
    def __init__(self, value: bytes, position: int) -> None:
        self.value, self.position = value, position

    def topic_name(self) -> str:
        return "persistent://public/default/in"

    def data(self) -> bytes:
        return self.value

    def message_id(self) -> str:
        return f"(1,{self.position},-1,-1)"

    def partition_key(self) -> str:
        return ""

    def event_timestamp(self) -> int:
        return 0

    def properties(self) -> dict[str, str]:
        return {}


def per_message_s(requests: int, base: str, messages: int, workdir: Path) -> float:
    script = workdir / f"curl{requests}.js"
    script.write_text(SCRIPTS[requests])
    config = FunctionConfig(
        name="bench",
        inputs=["in"],
        js=str(script),
        url_bindings=[{"alias": "api", "url": f"{base}/api"}],
    )
    executor = open_executor(
        config,
        0,
        UnconfiguredStateStore(config.fqfn),
        InstanceMetrics(0),
        logging.getLogger("bench"),
        ClearTextSecretsProvider(),
        False,
        LOCAL_SERVER,
    )
    batch = [_Message(f"m{i}".encode(), i) for i in range(CHUNK)]
    started = time.perf_counter()
    done = 0
    while done < messages:
        for outcome in executor.process(batch):
            assert outcome.error is None, outcome.error
        done += CHUNK
    elapsed = time.perf_counter() - started
    executor.close()
    return elapsed / done


def http_alone_s(base: str, count: int) -> float:
    """One exchange made by Python the way ``curl`` makes it (a connection per request)."""
    client = UrlClient(
        [UrlBinding(alias="api", url=f"{base}/api")],
        {},
        ClearTextSecretsProvider(),
        LOCAL_SERVER,
    )
    spec = {"method": "GET", "binding": "api", "path": "m1", "params": {}, "headers": {}}
    started = time.perf_counter()
    for _ in range(count):
        assert client.answer(spec)["status"] == 200
    return (time.perf_counter() - started) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    runs: dict[str, list[float]] = {"requests_0": [], "requests_1": [], "requests_2": []}
    exchanges: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as workdir:
            for _ in range(args.repeat):
                for requests in SCRIPTS:
                    runs[f"requests_{requests}"].append(
                        per_message_s(requests, base, args.messages, Path(workdir))
                    )
                exchanges.append(http_alone_s(base, args.messages))
    finally:
        httpd.shutdown()
        httpd.server_close()
    medians_ms = {name: statistics.median(times) * 1000 for name, times in runs.items()}
    exchange_ms = statistics.median(exchanges) * 1000
    beyond = [
        (medians_ms["requests_1"] - medians_ms["requests_0"]) - exchange_ms,
        (medians_ms["requests_2"] - medians_ms["requests_0"]) / 2 - exchange_ms,
    ]
    print(
        json.dumps(
            {
                "messages": args.messages,
                "repeat": args.repeat,
                "per_message_ms": {n: round(v, 4) for n, v in medians_ms.items()},
                "http_exchange_ms": round(exchange_ms, 4),
                "added_per_request_beyond_exchange_ms": [round(v, 4) for v in beyond],
                "runs_ms": {n: [round(t * 1000, 4) for t in v] for n, v in runs.items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
