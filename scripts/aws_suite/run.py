"""Runs AWS's TorchNeuron test suite against this package and counts its tests of
public behaviour (issue #25; docs/fidelity.md, "How it is measured").

AWS's snapshot is a source of facts, not part of this project: this script
exports its tests from a local mirror (bring it with the search tool's `fetch` of
github:parmoham-aws/test-repo-parmoham) into a work folder and runs them there, a
pytest process per folder, with plugin.py (stubs for AWS-only modules, a time
limit per test) and OMP_NUM_THREADS=1. CI never runs it.

    python scripts/aws_suite/run.py --label dec4 [--folders operations nki ...] [-k EXPR]
    python scripts/aws_suite/run.py --label dec4 --report-only

Prints, per folder, the public tests that passed / ran, and writes
<results>/<label>/failures.tsv: every public failure with the first line of its error.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scope  # noqa: E402

DEFAULT_MIRROR = "/work/.mirror/parmoham-aws+test-repo-parmoham/repo"
FOLDERS = ["allocator", "autocast", "storage", "unit", "integration", "streams", "views", "memory",
           "cpu_fallback", "device", "profiler", "nki", "operations", "neuron_dynamo_backend", "python_ops",
           "vertical", "huggingface"]


def _pythonpath(work: Path) -> str:
    """The plugin, the snapshot's root (its tests import `tests.utils`), then the
    caller's PYTHONPATH (a worktree of this package to measure instead of the
    installed one)."""
    return os.pathsep.join(p for p in (str(HERE), str(work), os.environ.get("PYTHONPATH", "")) if p)


def export(mirror: str, commit: str, work: Path) -> None:
    if (work / "tests").exists():
        return
    work.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "--git-dir", mirror, "archive", commit, "conftest.py", "tests"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)


# How AWS's conftest runs on Trainium: one visible NeuronCore per session
# (NEURON_RT_NUM_CORES=1), and the tests marked multi_device apart, by the
# launcher that runs its distributed tests, with the cores they ask for (on
# trn2.48xlarge, the conftest's default instance type; 8 cores, which those tests set
# in setup_method, before the real runtime initializes: here the count is read at import).
SESSIONS = [("", ["-m", "not multi_device"], {"NEURON_RT_NUM_CORES": "1"}),
            ("-multi", ["-m", "multi_device"], {"TORCH_NEURONX_INSTANCE": "trn2.48xlarge", "NEURON_RT_NUM_CORES": "8"})]


# Folders whose tests each get a process of their own: a model test holds host
# memory for its CPU reference too, and one that outgrows the host must not take
# the folder's other results with it.
ISOLATED = {"huggingface"}


def _pytest(python, work, targets, xml, log, env, args):
    subprocess.run([python, "-m", "pytest", *targets, "-p", "plugin", "-p", "no:cacheprovider",
                    "-o", "addopts=", "-o", "junit_family=xunit1", f"--junitxml={xml}", "-q", "--no-header",
                    "-rN", "--continue-on-collection-errors", *args], cwd=work, env=env,
                   stdout=open(log, "a"), stderr=subprocess.STDOUT)


def _run_isolated(work, folder, out, python, extra, env) -> None:
    """One pytest process per test; their junit files merged into <folder>.xml, a
    test whose process died (killed for memory) recorded as an error."""
    ids = subprocess.run([python, "-m", "pytest", f"tests/{folder}", "-p", "plugin", "--collect-only", "-q",
                          "-o", "addopts=", *extra], cwd=work, env=env, capture_output=True, text=True).stdout
    ids = [line for line in ids.splitlines() if "::" in line]
    suite = ET.Element("testsuite")
    for index, node_id in enumerate(ids):
        part = out / f"{folder}.{index}.xml"
        part.unlink(missing_ok=True)
        _pytest(python, work, [node_id], part, out / f"{folder}.log", env, extra)
        if part.exists():
            suite.extend(ET.parse(part).getroot().iter("testcase"))
            part.unlink()
            continue
        file, _, rest = node_id.partition("::")
        cls, _, name = rest.rpartition("::")
        module = file[:-3].replace("/", ".")
        case = ET.SubElement(suite, "testcase", file=file, name=name,
                             classname=f"{module}.{cls}" if cls else module)
        ET.SubElement(case, "error", message="the test's process died (killed: out of host memory?)")
    ET.ElementTree(ET.Element("testsuites")).getroot().append(suite)
    ET.ElementTree(suite).write(out / f"{folder}.xml")


def run_folder(work: Path, folder: str, out: Path, python: str, extra: list[str]) -> float:
    start = time.perf_counter()
    if folder in ISOLATED:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=_pythonpath(work), NEURON_RT_NUM_CORES="1")
        (out / f"{folder}.log").unlink(missing_ok=True)
        _run_isolated(work, folder, out, python, extra, env)
        return time.perf_counter() - start
    for suffix, selection, session_env in SESSIONS:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=_pythonpath(work), **session_env)
        subprocess.run([python, "-m", "pytest", f"tests/{folder}", "-p", "plugin", "-p", "no:cacheprovider",
                        "-o", "addopts=", "-o", "junit_family=xunit1",
                        f"--junitxml={out / (folder + suffix + '.xml')}", "-q", "--no-header", "-rN",
                        "--continue-on-collection-errors", *selection, *extra], cwd=work, env=env,
                       stdout=open(out / f"{folder}{suffix}.log", "w"), stderr=subprocess.STDOUT)
    return time.perf_counter() - start


def _outcome(case) -> tuple[str, str]:
    for tag in ("failure", "error"):
        node = case.find(tag)
        if node is not None:
            message = (node.get("message") or node.text or "").strip().splitlines()
            return tag, message[0][:300] if message else ""
    if case.find("skipped") is not None:
        return "skipped", ""
    return "passed", ""


def report(work: Path, out: Path, folders: list[str]) -> None:
    rows, failures = [], []
    for folder in folders:
        xmls = [out / f"{folder}{suffix}.xml" for suffix, _, _ in SESSIONS]
        if not any(x.exists() for x in xmls):
            continue
        counts = Counter()
        private = Counter()
        cases = [case for x in xmls if x.exists() for case in ET.parse(x).getroot().iter("testcase")]
        for case in cases:
            file, cls, name = case.get("file"), None, case.get("name")
            outcome, message = _outcome(case)
            if not file or message == "collection failure":  # a file that did not collect
                node = case.find("error")
                error = (node.get("message") or "") + (node.text or "") if node is not None else ""
                if "AWS-private (stubbed by the harness)" in error or scope.private_reason(error):
                    private["the module itself uses AWS's internals"] += 1
                    continue
                counts["collection error"] += 1
                failures.append((folder, case.get("classname", "") + "::" + name, "collection", message))
                continue
            classname = case.get("classname", "")
            module = file[:-3].replace("/", ".")
            if classname.startswith(module + "."):
                cls = classname[len(module) + 1:]
            why = scope.classify(work, file, cls, name)
            if why is None and outcome in ("failure", "error") and folder in ISOLATED and (
                    "process died" in message or "NEURON out of host memory" in message):
                why = "too large for this machine's memory (the issue's exclusion)"
            if why is not None:
                private[why] += 1
                continue
            counts[outcome] += 1
            if outcome in ("failure", "error"):
                failures.append((folder, f"{file}::{cls + '::' if cls else ''}{name}", outcome, message))
        ran = counts["passed"] + counts["failure"] + counts["error"]
        rows.append((folder, counts["passed"], ran, counts["skipped"], counts["collection error"],
                     sum(private.values())))
    print(f"{'folder':24} {'passed':>7} {'ran':>6} {'skipped':>8} {'coll.err':>8} {'private':>8}")
    for folder, passed, ran, skipped, errors, private_n in rows:
        print(f"{folder:24} {passed:7d} {ran:6d} {skipped:8d} {errors:8d} {private_n:8d}")
    passed = sum(r[1] for r in rows)
    ran = sum(r[2] for r in rows)
    if ran:
        print(f"{'total':24} {passed:7d} {ran:6d}   ({100 * passed / ran:.1f}% of public tests that ran)")
    with open(out / "failures.tsv", "w") as f:
        for row in failures:
            f.write("\t".join(row) + "\n")
    print(f"public failures: {out / 'failures.tsv'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--mirror", default=DEFAULT_MIRROR)
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--work", default="/tmp/aws-suite", help="where the snapshot's tests are exported")
    parser.add_argument("--results", default="/tmp/aws-suite-results")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with torch_neuronx installed")
    parser.add_argument("--folders", nargs="*", default=FOLDERS)
    parser.add_argument("--report-only", action="store_true")
    args, extra = parser.parse_known_args(argv)
    work, out = Path(args.work), Path(args.results) / args.label
    out.mkdir(parents=True, exist_ok=True)
    export(args.mirror, args.commit, work)
    if not args.report_only:
        for folder in args.folders:
            seconds = run_folder(work, folder, out, args.python, extra)
            print(f"{folder}: {seconds:.0f} s", flush=True)
    report(work, out, args.folders)
    return 0


if __name__ == "__main__":
    sys.exit(main())
