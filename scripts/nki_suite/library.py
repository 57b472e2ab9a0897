"""Runs AWS's nki-library integration tests in the library's own simulation mode
(`pytest test/integration --test-mode simulation`) with this project's NKI simulator standing in for
AWS's `nki_cpu_simulator` (issue #27). The yardstick is the library's own tests and goldens, unchanged.

AWS's snapshot is a source of facts, not part of this project: the script exports it from the fetch
mirror (github:aws-neuron/nki-library) into a work folder with `git archive` and runs it there,
one pytest process per test file (a test file = a kernel), with:

- library_shim/ on PYTHONPATH: the `nki_cpu_simulator` stand-in (its `nki` modules are
  torch_neuronx.nki's), a `neuron_dtypes` stand-in (AWS's host dtype package, not public) and the
  pytest plugin `library_plugin` (stubs for host/S3/metrics modules and two AWS-internal modules
  the snapshot lacks, the orchestrator repair, a per-case time limit); see their docstrings;
- the pure-Python test dependencies the conftest imports, installed by hand outside the project
  (`--deps`, default /tmp/nki-suite-deps; see README.md for the pinned versions);
- OMP_NUM_THREADS=1, `nice`, a time limit per file.

The subset (the whole suite is ~4,300 cases; far too many for this machine), chosen by the plugin in
the process that runs each file (collection seeded with NEURON_PYTHONHASHSEED=0, as the library
seeds its xdist workers): the file's cases the library marks `fast` (its curated vectors) that can
run in simulation (not skipped by its conftest's large-shape rule, not marked `trace_only` /
`compile_only` / `compile_and_infer`, which need AWS's compiler), or, where none is fast, all that
can; the first --per-file (default 4) in collection order. A file with no trn2 case (the conftest's
default target) runs on trn3. A file that fails to import is run whole, to record why. A file
where no case can run is reported, not run.

    python scripts/nki_suite/library.py --label before [--files PATTERN ...] [--per-file N]
    python scripts/nki_suite/library.py --label before --report-only

Results: /tmp/nki-suite-results/library/<label>/: <file>.xml (junit) and .log per file,
summary.tsv (file, platform, selected, passed, failed, skipped, errors, first failure reason),
collect.tsv (cases per file: collected, fast, selected). CI never runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE / "library_shim"
PROJECT = HERE.parent.parent
DEFAULT_MIRROR = "/work/.mirror/aws-neuron+nki-library/repo"
DEFAULT_COMMIT = "d2ad3a5"
SIMULATOR = None


def export(mirror: str, commit: str, work: Path) -> None:
    if (work / "test").exists():
        return
    work.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "--git-dir", mirror, "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)


def _env(work: Path, deps: str) -> dict:
    path = [str(SHIM), deps, str(work), str(work / "src"), str(PROJECT), os.environ.get("PYTHONPATH", "")]
    if SIMULATOR is not None:  # --project: that checkout's torch_neuronx, ahead of this one
        path.insert(4, str(SIMULATOR))
    # NEURON_PYTHONHASHSEED: the library's conftest seeds `random` and NumPy with it before
    # collection (as it does for xdist workers), so sweeps drawn with random.sample give the same
    # case ids in the collection and in every run.
    # TORCH_NEURONX_NKI_QUANTIZE_MX_SCALE=ocp: the snapshot (April 2026) was written for NKI 0.4.0's
    # quantize_mx, whose block scale its goldens compute; NKI 0.5.0 doubled it.
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p), OMP_NUM_THREADS="1",
                OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", NEURON_PYTHONHASHSEED="0",
                TORCH_NEURONX_NKI_QUANTIZE_MX_SCALE="ocp")


def _pytest(python: str) -> list[str]:
    return ["nice", "-n", "10", python, "-m", "pytest", "-p", "library_plugin", "-p", "no:cacheprovider",
            "-o", "addopts=", "--test-mode", "simulation"]


def kernel_files(work: Path) -> list[str]:
    """Test files that hold tests: a test function taking the library's `test_manager` fixture
    (helpers named test_*.py are left out)."""
    files = sorted(p for p in (work / "test" / "integration").rglob("test_*.py")
                   if "def test_" in (text := p.read_text()) and "test_manager" in text)
    return [str(p.relative_to(work)) for p in files]


def collect(work: Path, out: Path, python: str, deps: str, files: list[str], platform: str) -> list[dict]:
    target = out / f"collect-{platform}.json"
    target.unlink(missing_ok=True)
    env = dict(_env(work, deps), NKI_SUITE_COLLECT_JSON=str(target))
    with open(out / f"collect-{platform}.log", "w") as log:
        subprocess.run([*_pytest(python), "--collect-only", "-q", "--continue-on-collection-errors",
                        "--platform-target", platform, *files], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    rows = json.loads(target.read_text()) if target.exists() else []
    for row in rows:
        row["file"] = str(Path(row["file"]).relative_to(work))
    return rows


def expected(rows: list[dict], per_file: int) -> int:
    """How many of a file's collected cases the plugin's subset rule (library_plugin.select) keeps:
    its fast cases that can run in simulation, or all that can where none is fast; at most per_file."""
    pool = [r for r in rows if r["fast"] and r["runnable"]] or [r for r in rows if r["runnable"]]
    return min(len(pool), per_file) if per_file else len(pool)


def _xml_name(file: str) -> str:
    return file.replace("/", "__").removesuffix(".py")


def run_file(work, out, python, deps, file, platform, per_file, file_timeout) -> float:
    """One pytest process for the file; the plugin selects its subset in that process (so the cases
    run are the ones selected, sweeps drawn at import time included) and logs each result as it
    comes (<file>.jsonl), which the report reads when the file's time limit stops the process."""
    start = time.perf_counter()
    xml, jsonl = out / f"{_xml_name(file)}.xml", out / f"{_xml_name(file)}.jsonl"
    xml.unlink(missing_ok=True)
    jsonl.unlink(missing_ok=True)
    env = dict(_env(work, deps), NKI_SUITE_PER_FILE=str(per_file), NKI_SUITE_RESULTS_JSONL=str(jsonl))
    cmd = [*_pytest(python), "--platform-target", platform, "-q", "--no-header", "-rN", "-o", "junit_family=xunit1",
           f"--junitxml={xml}", "--force-local-cleanup", f"--output-directory={out / 'artifacts'}", file]
    with open(out / f"{_xml_name(file)}.log", "w") as log:
        try:
            subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=file_timeout,
                           start_new_session=True)
        except subprocess.TimeoutExpired:
            log.write(f"\nnki_suite: file ran past {file_timeout} s\n")
    return time.perf_counter() - start


def _from_jsonl(path: Path) -> tuple[Counter, str, int]:
    """Outcomes from the plugin's per-case log of a process that did not finish: the case running
    when it stopped counts as an error."""
    counts, reason, started, done = Counter(), "", [], set()
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["event"] == "start":
            started.append(row["nodeid"])
            continue
        done.add(row["nodeid"])
        outcome = {"passed": "passed", "skipped": "skipped"}.get(row["outcome"], "failure" if row["event"] == "call"
                                                                  else "error")
        counts[outcome] += 1
        if outcome in ("failure", "error") and not reason:
            reason = row["message"]
    hung = [n for n in started if n not in done]
    if hung:
        counts["error"] += len(hung)
        reason = reason or f"{hung[0].split('::')[-1]}: stopped by the file's time limit (a case ignored its own)"
    return counts, reason, len(started)


def _outcome(case) -> tuple[str, str]:
    for tag in ("failure", "error"):
        node = case.find(tag)
        if node is not None:
            text = (node.get("message") or "").strip() or (node.text or "").strip()
            if text in ("collection failure", "") or text.startswith("failed on setup"):
                # a file that did not import: the last `E ` line of the traceback says why
                raised = [line[1:].strip() for line in (node.text or "").splitlines() if line.startswith("E ")]
                text = raised[-1] if raised else text
            lines = [line for line in text.splitlines() if line.strip()]
            return tag, re.sub(r"\s+", " ", lines[0])[:300] if lines else ""
    if case.find("skipped") is not None:
        return "skipped", ""
    return "passed", ""


# Test files AWS's own snapshot (d2ad3a5) cannot run in its simulation mode, whatever simulator
# stands behind it: reported, and counted apart from the kernels that target simulation. Each
# reason was checked by reading the snapshot (see README.md).
SNAPSHOT_CANNOT_RUN = {
    "test/integration/nkilib/core/mlp/test_mlp_cte.py":
        "snapshot: nkilib/core/mlp/mlp.py does not parse (a docstring pasted twice, IndentationError)",
    "test/integration/nkilib/core/mlp/test_mlp_tkg.py":
        "snapshot: nkilib/core/mlp/mlp.py does not parse (a docstring pasted twice, IndentationError)",
    "test/integration/nkilib/experimental/transformer/test_transformer_tkg.py":
        "snapshot: imports nkilib/core/mlp/mlp.py, which does not parse",
    "test/integration/nkilib/core/qkv/test_qkv_tkg.py":
        "snapshot: the test uses Platforms without importing it (NameError at collection)",
    "test/integration/nkilib/experimental/subkernels/test_topk_reduce.py":
        "snapshot: imports nkilib.experimental.subkernels.topk_reduce; the module is in experimental/collectives",
    "test/integration/nkilib/core/attention/test_gen_mask_tkg.py":
        "snapshot: the output descriptor reads 'mask_out_hbm' without its '.must_alias_input' suffix (KeyError)",
    "test/integration/nkilib/experimental/collectives/test_collectives.py":
        "multi-rank (2-8 ranks): the library's simulation path (test/utils/simulation_setup.py) runs one rank "
        "and cannot take its per-rank inputs (PerRankLazyInputGenerator has no .items())",
    "test/integration/nkilib/experimental/collectives/test_sb2sb_allgather.py":
        "multi-rank: per-rank inputs, which the library's simulation path cannot take (as test_collectives)",
}


def report(out: Path) -> None:
    plan = json.loads((out / "plan.json").read_text())
    rows = []
    for file, entry in plan.items():
        xml, jsonl = out / f"{_xml_name(file)}.xml", out / f"{_xml_name(file)}.jsonl"
        counts, reason, selected = Counter(), "", 0
        if xml.exists():
            for case in ET.parse(xml).getroot().iter("testcase"):
                outcome, message = _outcome(case)
                counts[outcome] += 1
                node = case.find("error")
                selected += not (node is not None and node.get("message") == "collection failure")
                if outcome in ("failure", "error") and not reason:
                    reason = message
        elif jsonl.exists():
            counts, reason, selected = _from_jsonl(jsonl)
        elif entry.get("collected") and not entry.get("expected"):
            reason = ("no case selected: every case is skipped in simulation (large shapes) or marked to run "
                      "outside it (trace_only / compile_only)")
        else:
            counts["error"] += 1
            reason = "no result (the process died before its first case)"
        rows.append((file, entry["platform"], selected, counts["passed"], counts["failure"],
                     counts["skipped"], counts["error"], reason))
    with open(out / "summary.tsv", "w") as f:
        f.write("file\tplatform\tselected\tpassed\tfailed\tskipped\terrors\tfirst failure reason\n")
        for row in rows:
            f.write("\t".join(str(x) for x in row) + "\n")
    print(f"{'file':72} {'plat':4} {'sel':>4} {'pass':>4} {'fail':>4} {'skip':>4} {'err':>4}  first failure")
    kernels = Counter()
    for file, platform, selected, passed, failed, skipped, errors, reason in rows:
        name = file.removeprefix("test/integration/nkilib/")
        print(f"{name:72} {platform:4} {selected:4d} {passed:4d} {failed:4d} {skipped:4d} {errors:4d}  {reason[:90]}")
        if failed or errors:
            kernels["failed"] += 1
            kernels["snapshot cannot run"] += file in SNAPSHOT_CANNOT_RUN
        elif passed:
            kernels["passed"] += 1
        else:
            kernels["no case ran"] += 1
    cases = Counter()
    for row in rows:
        cases["passed"] += row[3]
        cases["failed"] += row[4] + row[6]
        cases["skipped"] += row[5]
    total = kernels["passed"] + kernels["failed"]
    print(f"kernels (test files): {kernels['passed']} of {total} pass every selected case"
          + (f" ({100 * kernels['passed'] / total:.0f}%)" if total else "")
          + f"; {kernels['no case ran']} where no case ran (every selected case skipped, or none selected)")
    targeted = total - kernels["snapshot cannot run"]
    if kernels["snapshot cannot run"]:
        print(f"kernels that target simulation: {kernels['passed']} of {targeted}"
              + (f" ({100 * kernels['passed'] / targeted:.0f}%)" if targeted else "")
              + f"; {kernels['snapshot cannot run']} failing files the snapshot itself cannot run in simulation "
              "(SNAPSHOT_CANNOT_RUN)")
        for file in SNAPSHOT_CANNOT_RUN:
            print(f"  {file.removeprefix('test/integration/nkilib/')}: {SNAPSHOT_CANNOT_RUN[file]}")
    ran = cases["passed"] + cases["failed"]
    print(f"cases: {cases['passed']} passed of {ran} run" + (f" ({100 * cases['passed'] / ran:.0f}%)" if ran else "")
          + f", {cases['skipped']} skipped")
    print(f"summary: {out / 'summary.tsv'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--mirror", default=DEFAULT_MIRROR)
    parser.add_argument("--commit", default=DEFAULT_COMMIT)
    parser.add_argument("--work", default="/tmp/nki-library", help="where the snapshot is exported")
    parser.add_argument("--results", default="/tmp/nki-suite-results/library")
    parser.add_argument("--deps", default="/tmp/nki-suite-deps", help="the test dependencies (pip --target)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with torch_neuronx's deps")
    parser.add_argument("--files", nargs="*", default=None, help="regexes: only test files matching one")
    parser.add_argument("--per-file", type=int, default=4, help="first N selected cases per file (0: all)")
    parser.add_argument("--file-timeout", type=int, default=900)
    parser.add_argument("--project", default=None,
                        help="a checkout whose torch_neuronx to measure (default: the one holding this script)")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    global SIMULATOR
    SIMULATOR = args.project
    work, out = Path(args.work), Path(args.results) / args.label
    out.mkdir(parents=True, exist_ok=True)
    export(args.mirror, args.commit, work)
    if not args.report_only:
        files = kernel_files(work)
        if args.files:
            files = [f for f in files if any(re.search(p, f) for p in args.files)]
        by_file = {f: [] for f in files}
        for row in collect(work, out, args.python, args.deps, files, "trn2"):
            by_file.setdefault(row["file"], []).append(row)
        plan = {f: {"platform": "trn2", "rows": rows} for f, rows in by_file.items()}
        collection_errors = set(re.findall(r"^ERROR (\S+\.py)", (out / "collect-trn2.log").read_text(), re.M))
        retry = [f for f, rows in by_file.items() if not rows and f not in collection_errors]
        if retry:
            trn3 = {}
            for row in collect(work, out, args.python, args.deps, retry, "trn3"):
                trn3.setdefault(row["file"], []).append(row)
            for f in retry:
                if trn3.get(f):
                    plan[f] = {"platform": "trn3", "rows": trn3[f]}
        with open(out / "collect.tsv", "w") as f:
            f.write("file\tplatform\tcollected\tfast\tselected\n")
            for file, entry in plan.items():
                entry["expected"] = expected(entry["rows"], args.per_file)
                f.write(f"{file}\t{entry['platform']}\t{len(entry['rows'])}\t{sum(r['fast'] for r in entry['rows'])}"
                        f"\t{entry['expected']}\n")
        (out / "plan.json").write_text(json.dumps({f: {"platform": e["platform"], "expected": e["expected"],
                                                       "collected": len(e["rows"])}
                                                   for f, e in plan.items()}, indent=1))
        for file, entry in plan.items():
            if entry["rows"] and not entry["expected"]:
                print(f"{file}: no case selected (the library skips every case in simulation)", flush=True)
                continue
            seconds = run_file(work, out, args.python, args.deps, file, entry["platform"], args.per_file,
                               args.file_timeout)
            print(f"{file}: {seconds:.0f} s", flush=True)
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
