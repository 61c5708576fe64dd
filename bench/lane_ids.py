"""No test dropped by the lanes: the test ids the two lanes collect, together, hold every id
a reference tree collected (issue 37: the fast lane, plain ``python -m pytest``, and the
rest, ``python -m pytest -m LANE2``; see pyproject's ``addopts`` and the README's test
command).

    python bench/lane_ids.py                  # against the ids of commit 0fb38f6
    python bench/lane_ids.py --before REV     # another commit (git archive, collected there)
    python bench/lane_ids.py --before FILE    # a saved ``pytest --collect-only -q`` output

Prints each lane's count, every id renamed since (``RENAMED``: its successor collected),
and every id missing from both, or found in both; exit 0 when none is missing and none is
in both, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The second lane's marker expression (the README's test command runs it after the first).
LANE2 = "(slow or model or browser) and not fast"


#: Ids of 0fb38f6 renamed since, by the change that gave the test a new meaning, and the id
#: it goes by now: a renamed test is not a dropped one while its successor is collected.
RENAMED = {
    # 99cfe7b (issue 40): the README became short; its machine is checked by fingerprint
    "tests/integration/test_readme.py::test_readme_has_the_machine_and_the_run_example":
        "tests/integration/test_readme.py::test_readme_is_short_and_has_the_machine_and_the_run_example",
    # 127add0 (issue 40): the example script moved from the README to docs/how-to/models.md
    "tests/llm/test_scripted_keys.py::test_the_readme_script_example_is_a_valid_script":
        "tests/llm/test_scripted_keys.py::test_the_docs_script_example_is_a_valid_script",
    # f4c0228: a reply 200 deep is now refused by the 100-level cap every stored value has
    "tests/test_repair_values.py::test_hostile_reply[deep but legal after repair]":
        "tests/test_repair_values.py::test_hostile_reply[deep past the 100-level cap]",
    # ac35dbd (issue 37 item 5): OTEL_* variables set the SDK up only in fsm's own commands
    "tests/test_telemetry.py::test_otel_traces_exporter_console_turns_spans_on":
        "tests/test_telemetry.py::test_an_fsm_command_sets_up_the_sdk_when_the_variables_ask",
}


def collect(root: Path, *args: str) -> set[str]:
    """The test ids ``pytest --collect-only -q`` lists in ``root`` with ``args``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                          "-p", "no:cacheprovider", *args],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode not in (0, 5):
        sys.exit(f"lane_ids: collection failed in {root} {args}:\n{out.stdout[-3000:]}{out.stderr[-2000:]}")
    return ids_of(out.stdout)


def ids_of(text: str) -> set[str]:
    """The ids of a ``--collect-only -q`` output (``path::name[param]`` lines)."""
    return {line.strip() for line in text.splitlines() if "::" in line and not line.startswith(" ")}


def before_ids(before: str) -> set[str]:
    """The reference ids: a saved collect-only output, or a commit collected in a temp copy."""
    if Path(before).is_file():
        return ids_of(Path(before).read_text())
    with tempfile.TemporaryDirectory(prefix="lane-ids-") as tmp:
        archive = subprocess.run(["git", "archive", before], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        archive_path = Path(tmp) / "tree.tar"
        archive_path.write_bytes(archive)
        with tarfile.open(archive_path) as tar:
            tar.extractall(Path(tmp) / "tree", filter="data")
        # the reference tree's own addopts select nothing by then-unknown markers: -m "" all
        return collect(Path(tmp) / "tree", "-m", "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="0fb38f6", help="a commit or a collect-only output file")
    args = parser.parse_args(argv)
    old = before_ids(args.before)
    fast, rest = collect(ROOT), collect(ROOT, "-m", LANE2)
    gone = old - fast - rest
    renamed = sorted(t for t in gone if RENAMED.get(t) in fast | rest)
    missing, both = sorted(gone - set(renamed)), sorted(fast & rest)
    print(f"before: {len(old)}  fast lane: {len(fast)}  second lane: {len(rest)}  "
          f"new: {len((fast | rest) - old)}  renamed: {len(renamed)}  missing: {len(missing)}  "
          f"in both lanes: {len(both)}")
    for test_id in renamed:
        print("renamed:", test_id, "->", RENAMED[test_id])
    for test_id in missing:
        print("missing:", test_id)
    for test_id in both:
        print("in both lanes:", test_id)
    return 1 if missing or both else 0


if __name__ == "__main__":
    sys.exit(main())
