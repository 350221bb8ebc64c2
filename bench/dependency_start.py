"""Dependencies: what a package's dependencies add to an instance's start. A function in a
zip with requirements.txt and the wheel it needs, loaded in a fresh process: the first start
(unpacking and installing) and later starts (the installed environment found), against the
same function as a plain .py file, in the same run (issue 17's target: a cached environment
adds < 1 s).

    python bench/dependency_start.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.wheels import make_wheel  # noqa: E402 -- after the path

_LOAD = (
    "import sys; from magnetar.instance.loader import load_function; "
    "f = load_function(sys.argv[1], 'shout', work_dir=__import__('pathlib').Path(sys.argv[2])); "
    "assert f.process('a') == 'a!!'"
)
_SOURCE = "from loudness import LOUD\n\n\ndef process(input):\n    return input + LOUD\n"


def _start(package: Path, work: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", _LOAD, str(package), str(work)], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--output", default=str(ROOT / "bench" / "results" / "dependency_start.json")
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        directory = Path(temp)
        wheel = make_wheel(directory, "loudness", {"loudness/__init__.py": "LOUD = '!!'\n"})
        package = directory / "shout.zip"
        with zipfile.ZipFile(package, "w") as archive:
            archive.writestr("shout/src/shout.py", _SOURCE)
            archive.writestr("shout/requirements.txt", "loudness\n")
            archive.write(wheel, f"shout/deps/{wheel.name}")
        plain = directory / "plain" / "shout.py"
        plain.parent.mkdir()
        plain.write_text(_SOURCE.replace("from loudness import LOUD", "LOUD = '!!'"))
        first = _start(package, directory / "work")
        cached, baseline = [], []
        for _ in range(args.repeat):
            baseline.append(_start(plain, directory / "work"))
            cached.append(_start(package, directory / "work"))
    results = {
        "repeat": args.repeat,
        "first_start_s": first,
        "plain_py_starts_s": baseline,
        "cached_starts_s": cached,
        "plain_py_median_s": statistics.median(baseline),
        "cached_median_s": statistics.median(cached),
        "cached_added_s": statistics.median(cached) - statistics.median(baseline),
    }
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    print(f"{'start':<28} {'seconds':>8}")
    print(f"{'plain .py (median)':<28} {results['plain_py_median_s']:>8.2f}")
    print(f"{'zip, first (installs)':<28} {first:>8.2f}")
    print(f"{'zip, cached (median)':<28} {results['cached_median_s']:>8.2f}")
    print(f"{'added by the cached env':<28} {results['cached_added_s']:>8.2f}")
    print(f"\nwritten to {output}")


if __name__ == "__main__":
    main()
