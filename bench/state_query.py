"""REST state query latency on a caught-up table: GET .../state/{key} against GET /version
(the baseline: the same HTTP round trip without state), p50/p99, in the same run.

    python bench/state_query.py [--queries 2000] [--keys 1000]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from magnetar.broker import EmbeddedBroker, find_free_port
from magnetar.worker.config import WorkerConfig
from magnetar.worker.service import WorkerService

ROOT = Path(__file__).resolve().parent.parent


def latencies(http: httpx.Client, paths: list[str]) -> list[float]:
    result = []
    for path in paths:
        started = time.perf_counter()
        http.get(path).raise_for_status()
        result.append((time.perf_counter() - started) * 1000)
    return result


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[int(len(ordered) * 0.99) - 1],
        "max_ms": ordered[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "state_query.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="magnetar-bench-query-"))
    try:
        with EmbeddedBroker(work / "broker") as broker:
            port = find_free_port()
            config = WorkerConfig(
                worker_id="bench",
                broker_url=broker.service_url,
                http_port=port,
                data_dir=work / "w",
            )
            service = WorkerService(config).start()
            try:
                http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
                while http.get("/admin/v2/worker/cluster/leader/ready").status_code != 200:
                    time.sleep(0.1)
                code = (ROOT / "examples" / "word_count.py").read_bytes()
                http.post(
                    "/admin/v3/functions/public/default/wc",
                    data={"functionConfig": json.dumps({"inputs": ["bench-words"]})},
                    files={"data": ("word_count.py", code)},
                ).raise_for_status()
                base = "/admin/v3/functions/public/default/wc/state/"
                for key in range(args.keys):
                    state = json.dumps({"key": f"k{key}", "numberValue": key})
                    http.post(f"{base}k{key}", files={"state": (None, state)}).raise_for_status()
                paths = [f"{base}k{random.randrange(args.keys)}" for _ in range(args.queries)]
                latencies(http, paths[:100])  # warm up
                rounds: dict[str, list[float]] = {"version": [], "state": []}
                for _ in range(2):
                    rounds["version"] += latencies(http, ["/version"] * (args.queries // 2))
                    rounds["state"] += latencies(http, paths[: args.queries // 2])
                http.close()
            finally:
                service.stop()
        result = {
            "queries": args.queries,
            "keys": args.keys,
            "version": summary(rounds["version"]),
            "state": summary(rounds["state"]),
        }
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=2))
        s, v = result["state"], result["version"]
        print(
            f"state query p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms (target p99 < 20 ms); "
            f"GET /version p50 {v['p50_ms']:.2f} ms, p99 {v['p99_ms']:.2f} ms\nwritten to {output}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
