"""Conformance runner: PyTorch's OpInfo database (op_db) and module_db on the
neuron device against CPU. Writes docs/conformance.md.

    python tests/conformance/run_opinfo.py --full            # everything (all dtypes, all samples)
    python tests/conformance/run_opinfo.py                   # the representative subset
    python tests/conformance/run_opinfo.py --ops 'add,nn.functional.conv*' --dtypes float32,bfloat16

Cases run in worker subprocesses; a worker that dies (a crash in the core)
is restarted after the case it was running, which is recorded as a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_OUTPUT = REPO / "docs" / "conformance.md"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true",
                   help="every dtype each op supports on CPU and every sample (default: the subset)")
    p.add_argument("--ops", default=None,
                   help="comma-separated fnmatch patterns over op names (name.variant)")
    p.add_argument("--modules", default=None,
                   help="comma-separated fnmatch patterns over module names (e.g. nn.Linear)")
    p.add_argument("--no-ops", action="store_true", help="skip op_db")
    p.add_argument("--no-modules", action="store_true", help="skip module_db")
    p.add_argument("--dtypes", default=None, help="comma-separated dtypes, e.g. float32,int64")
    p.add_argument("--max-samples", type=int, default=None,
                   help="samples per (op, dtype); default: all with --full, else the subset cap")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per sample")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the CPU generator before each sample (default 0, harness.SAMPLE_SEED)")
    p.add_argument("--output", default=str(DEFAULT_OUTPUT), help="markdown report ('-' for none)")
    p.add_argument("--json", default=None, help="also write the raw per-case results here (JSON lines)")
    # internal
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--results", default=None, help=argparse.SUPPRESS)
    p.add_argument("--first-sample", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _harness():
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import harness

    return harness


def _patterns(spec):
    return [s.strip() for s in spec.split(",") if s.strip()] if spec else None


# --------------------------------------------------------------------------- worker


def enumerate_cases(args):
    """Deterministic list of (kind, item, dtype) for these arguments."""
    h = _harness()

    dtypes = h.parse_dtypes(args.dtypes) if args.dtypes else None
    subset = not args.full
    cases = []
    if not args.no_ops:
        for op in h.select(h.load_op_db(), _patterns(args.ops), h.op_full_name):
            supported = op.supported_dtypes("cpu")
            if not supported:  # e.g. CUDA-only entries: one case that records the skip
                cases.append(("op", op, None))
            for dtype in h.case_dtypes(supported, dtypes, subset):
                cases.append(("op", op, dtype))
    if not args.no_modules:
        for info in h.select(h.load_module_db(), _patterns(args.modules), h.module_name):
            for dtype in h.case_dtypes(info.supported_dtypes("cpu"), dtypes, subset):
                cases.append(("module", info, dtype))
    return cases


def max_samples(args):
    h = _harness()

    if args.max_samples is not None:
        return args.max_samples
    return None if args.full else h.SUBSET_MAX_SAMPLES


def _run_cases(args, h, cases, start, first, path):
    """Runs cases[start:] (the first from sample `first`), streaming results to `path`."""
    cap = max_samples(args)
    with open(path, "a", buffering=1) as out:
        def emit(record):
            out.write(json.dumps(record) + "\n")

        class Hooks(h.Hooks):
            def begin(self, index):
                emit({"b": position, "i": index})

            def end(self, index, status, message):
                emit({"r": position, "i": index, "s": status, "m": message})

        for position in range(start, len(cases)):
            kind, item, dtype = cases[position]
            name = h.op_full_name(item) if kind == "op" else h.module_name(item)
            emit({"case": position, "kind": kind, "name": name, "dtype": h.dtype_name(dtype)})
            run = h.run_op if kind == "op" else h.run_module
            result = run(item, dtype, max_samples=cap, timeout=args.timeout, first_sample=first,
                         hooks=Hooks())
            emit({"end": position, "fallback": result.fallback, "seconds": round(result.seconds, 3)})
            first = 0
            if position % 25 == 0:
                h.tidy()
        emit({"done": len(cases)})


def _crash_detail(path) -> str:
    """The most telling line a dead child left on stderr (a C++ exception's what())."""
    try:
        lines = [line.strip() for line in open(path, errors="replace") if line.strip()]
    except OSError:
        return ""
    for line in lines:
        if line.startswith("what():"):
            return line[len("what():"):].strip()[:200]
    lines = [line for line in lines if not line.startswith(("frame #", "<omitting"))]
    return lines[-1][:200] if lines else ""


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent exits."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker(args) -> int:
    """Loads op_db/module_db once, then runs the cases in forked children (the
    device is first used in the child), so a crash in the core costs one fork:
    the crashed sample is recorded as a failure and a new child resumes after it.
    A child silent for 4 x timeout is killed as hung."""
    import torch

    h = _harness()
    h.neuron_ops.set_fallback_mode("silent")
    torch.set_num_threads(args.threads)
    h.SAMPLE_SEED = args.seed
    shard, nshards = (int(x) for x in args.shard.split("/"))
    cases = enumerate_cases(args)[shard::nshards]
    log = ShardLog(args.results)
    start, first = args.start, args.first_sample
    hang_limit = max(60.0, 4 * args.timeout)
    while True:
        pid = os.fork()
        if pid == 0:  # child
            _die_with_parent()
            code = 0
            err = os.open(args.results + ".stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(err, 2)
            try:
                _run_cases(args, h, cases, start, first, args.results)
            except BaseException:  # noqa: BLE001
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        size, quiet_since, status = -1, time.time(), None
        while status is None:
            done_pid, raw = os.waitpid(pid, os.WNOHANG)
            if done_pid:
                status = os.waitstatus_to_exitcode(raw)
                break
            now_size = os.path.getsize(args.results) if os.path.exists(args.results) else 0
            if now_size != size:
                size, quiet_since = now_size, time.time()
            elif time.time() - quiet_since > hang_limit:
                os.kill(pid, 9)
            time.sleep(0.2)
        log.poll()
        if log.done:
            return 0
        resume = log.record_crash(status, hung=(status == -9), detail=_crash_detail(args.results + ".stderr"))
        if resume is None or resume == (start, first):
            print(f"[conformance] worker cannot make progress after exit status {status}", file=sys.stderr)
            return 1
        start, first = resume
        case = log.cases.get(log.last_crash_position, {})
        print(f"[conformance] child died (exit status {status}) in {case.get('name')} {case.get('dtype')};"
              " resuming after that sample", file=sys.stderr)


# --------------------------------------------------------------------------- supervisor


# Known causes of failures, recognized from the failure message (first match wins).
# The report counts the failing samples of each; a fixed cause drops to zero.
CAUSES = (
    ("core: c10::Allocator raw_allocate/raw_deallocate assertion, usually a process abort (the CPU "
     "allocator wrapper the device installs has no raw_deleter; oneDNN conv/gelu/RNN kernels use "
     "raw_allocate)",
     re.compile(r"INTERNAL ASSERT FAILED at \S*c10/core/Allocator\.h")),
    ("core: float32 op with a Python-scalar operand returns float64 (fp64 emulation treats the "
     "wrapped-number scalar as a float64 tensor and widens the result)",
     re.compile(r"dtype torch\.float64 != torch\.float32|dtype torch\.complex128 != torch\.complex64")),
    ("core: no kernel for the fused RNN cells (_thnn_fused_lstm_cell / _thnn_fused_gru_cell) "
     "that at::lstm_cell / gru_cell pick for PrivateUse1",
     re.compile(r"_thnn_fused_(lstm|gru)_cell")),
    ("core: fp64 emulation loses in-place updates of float64 running statistics (native_batch_norm "
     "mutates running_mean/running_var without an alias annotation in its schema)",
     re.compile(r"^\[fp64-emu\] output\['buffers'\]")),
    ("fp64 emulation: passes with TORCH_NEURONX_FP64=native (fp32 precision, or an emulation bug)",
     re.compile(r"^\[fp64-emu\]")),
    ("numerical difference beyond the default tolerance (a different algorithm or accumulation "
     "order on the device)", re.compile(r"not close")),
    ("the neuron run raises", re.compile(r"^\w+(Error|Exception)\b")),
)


def classify(message: str) -> str:
    for cause, pattern in CAUSES:
        if pattern.search(message):
            return cause
    return "other"


class ShardLog:
    """Aggregates one worker's result stream into per-case records."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.cases = {}  # position -> record
        self.open_case = None  # position of a case begun and not ended
        self.open_sample = None  # (position, index) begun and not reported
        self.done = False
        self.last_crash_position = None

    def _case(self, position):
        return self.cases.setdefault(position, {
            "kind": "?", "name": "?", "dtype": "?", "passed": 0, "failed": 0, "failed_fp32": 0, "skipped": 0, "causes": {},
            "failures": [], "skips": {}, "fallback": [], "seconds": 0.0})

    def add_sample(self, position, index, status, message):
        rec = self._case(position)
        if status == "pass":
            rec["passed"] += 1
        elif status == "fail":
            rec["failed"] += 1
            if str(message).startswith("[fp64-emu]"):
                rec["failed_fp32"] += 1
            cause = classify(str(message))
            rec["causes"][cause] = rec["causes"].get(cause, 0) + 1
            if len(rec["failures"]) < 5:
                rec["failures"].append([index, message])
        else:
            rec["skipped"] += 1
            rec["skips"][message] = rec["skips"].get(message, 0) + 1

    def poll(self):
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            f.seek(self.offset)
            while True:
                line = f.readline()
                if not line.endswith("\n"):
                    break
                self.offset = f.tell()
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "case" in rec:
                    case = self._case(rec["case"])
                    case.update(kind=rec["kind"], name=rec["name"], dtype=rec["dtype"])
                    self.open_case, self.open_sample = rec["case"], None
                elif "b" in rec:
                    self.open_sample = (rec["b"], rec["i"])
                elif "r" in rec:
                    self.add_sample(rec["r"], rec["i"], rec["s"], rec["m"])
                    self.open_sample = None
                elif "end" in rec:
                    case = self._case(rec["end"])
                    case["fallback"] = sorted(set(case["fallback"]) | set(rec["fallback"]))
                    case["seconds"] += rec["seconds"]
                    self.open_case = None
                elif "done" in rec:
                    self.done = True

    def record_crash(self, status, hung=False, detail=""):
        """Records the sample (or case) a dead child was running as failed, in
        the log itself; returns where to resume: (case position, first sample)."""
        why = "hung: killed after no progress" if hung else f"process died (exit status {status})"
        if detail:
            why += f": {detail}"
        if self.open_sample is not None:
            position, index = self.open_sample
            resume = (position, index + 1) if isinstance(index, int) else (position + 1, 0)
        elif self.open_case is not None:  # died between samples (sample generation)
            position, index = self.open_case, "?"
            resume = (position + 1, 0)
        else:
            ended = [k for k, v in self.cases.items() if v["kind"] != "?"]
            return (max(ended) + 1, 0) if ended else None
        with open(self.path, "a") as f:  # terminate a torn line, then the failure
            f.write("\n" + json.dumps({"r": position, "i": index, "s": "fail",
                                       "m": f"{why} while running this sample"}) + "\n")
        self.last_crash_position = position
        self.poll()
        self.open_case = self.open_sample = None
        return resume

    def records(self):
        return [self.cases[k] for k in sorted(self.cases)]


def _worker_argv(argv, shard, start, results):
    keep, skip_next = [], False
    internal = {"--output", "--json", "--jobs", "--shard", "--start", "--results", "--first-sample"}
    for arg in argv:
        if skip_next:
            skip_next = False
            continue
        key = arg.split("=", 1)[0]
        if key in internal:
            skip_next = "=" not in arg
            continue
        keep.append(arg)
    return [sys.executable, str(Path(__file__).resolve()), *keep, "--worker", f"--shard={shard}",
            f"--start={start}", f"--results={results}"]


def supervise(args, argv) -> list[dict]:
    """Starts --jobs workers (each runs every jobs-th case) and collects their logs."""
    tmp = tempfile.mkdtemp(prefix="neuron-conformance-")
    env = dict(os.environ, TORCH_NEURONX_FALLBACK="silent", OMP_NUM_THREADS="1")
    nshards = max(1, args.jobs)
    logs = [ShardLog(os.path.join(tmp, f"shard{i}.jsonl")) for i in range(nshards)]
    procs = [subprocess.Popen(_worker_argv(argv, f"{i}/{nshards}", 0, logs[i].path), env=env, cwd=REPO,
                              preexec_fn=_die_with_parent) for i in range(nshards)]
    last_report = time.time()
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(0.5)
            if time.time() - last_report > 60:
                last_report = time.time()
                for log in logs:
                    log.poll()
                print(f"[conformance] {sum(len(log.cases) for log in logs)} cases started", file=sys.stderr)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = []
    for i, log in enumerate(logs):
        log.poll()
        if procs[i].returncode != 0 or not log.done:
            print(f"[conformance] worker {i} stopped early (exit status {procs[i].returncode})",
                  file=sys.stderr)
            results.append({"kind": "op", "name": f"(worker {i})", "dtype": "-", "passed": 0, "failed": 1,
                            "skipped": 0, "failures": [["-", "worker stopped before finishing its cases"]],
                            "skips": {}, "fallback": [], "seconds": 0.0})
        results.extend(log.records())
    shutil.rmtree(tmp, ignore_errors=True)
    return results


# --------------------------------------------------------------------------- report


def _pct(a, b):
    return f"{100.0 * a / b:.2f}%" if b else "n/a"


def _md(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


COUNTS = ("passed", "failed", "failed_fp32", "skipped")


def summarize(results):
    totals = dict.fromkeys(COUNTS, 0)
    by_kind = defaultdict(lambda: dict.fromkeys(COUNTS, 0))
    by_dtype = defaultdict(lambda: dict.fromkeys(COUNTS, 0))
    for r in results:
        r.setdefault("failed_fp32", 0)
        for key in totals:
            totals[key] += r[key]
            by_kind[r["kind"]][key] += r[key]
            by_dtype[r["dtype"]][key] += r[key]
    return totals, by_kind, by_dtype


def pass_rate(totals) -> float:
    run = totals["passed"] + totals["failed"]
    return totals["passed"] / run if run else 1.0


def write_report(results, path, command, seconds, args):
    import torch

    totals, by_kind, by_dtype = summarize(results)
    lines = ["# Conformance: PyTorch OpInfo (`op_db`) and `module_db` on `neuron` vs CPU", "",
             "Generated by `tests/conformance/run_opinfo.py`; do not edit by hand.", "",
             f"- Command: `{command}`",
             f"- torch {torch.__version__}; {len(results)} cases "
             f"({sum(1 for r in results if r['kind'] == 'op')} op x dtype, "
             f"{sum(1 for r in results if r['kind'] == 'module')} module x dtype); "
             f"wall time {seconds / 60:.1f} min with {args.jobs} worker(s)",
             f"- Scope: {'full (every CPU-supported dtype, every sample)' if args.full else 'subset'}"
             + (f"; ops `{args.ops}`" if args.ops else "") + (f"; modules `{args.modules}`" if args.modules else "")
             + (f"; dtypes `{args.dtypes}`" if args.dtypes else "")
             + (f"; at most {max_samples(args)} samples per case" if max_samples(args) else ""), ""]
    run = totals["passed"] + totals["failed"]
    lines += ["## Totals", "",
              "Pass % is passed / (passed + failed); skipped samples are listed with their reasons below. "
              "`fp64 emu` counts the failures (included in fail) that pass when the device computes "
              "float64 natively (see the fp32 rule below).", "",
              "| | samples | pass | fail | of which fp64 emu | skip | pass % |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for kind, label in (("op", "op_db"), ("module", "module_db")):
        if kind in by_kind:
            k = by_kind[kind]
            lines.append(f"| {label} | {k['passed'] + k['failed'] + k['skipped']} | {k['passed']} | "
                         f"{k['failed']} | {k['failed_fp32']} | {k['skipped']} | "
                         f"{_pct(k['passed'], k['passed'] + k['failed'])} |")
    lines.append(f"| **all** | {run + totals['skipped']} | {totals['passed']} | {totals['failed']} | "
                 f"{totals['failed_fp32']} | {totals['skipped']} | **{_pct(totals['passed'], run)}** |")
    lines += ["", "### By dtype", "", "| dtype | pass | fail | of which fp64 emu | skip | pass % |",
              "|---|---:|---:|---:|---:|---:|"]
    for dtype in sorted(by_dtype):
        d = by_dtype[dtype]
        lines.append(f"| {dtype} | {d['passed']} | {d['failed']} | {d['failed_fp32']} | {d['skipped']} | "
                     f"{_pct(d['passed'], d['passed'] + d['failed'])} |")

    lines += ["", "## Comparison rules", "",
              "- Samples come from `op.sample_inputs(\"cpu\", dtype, requires_grad=False)` (seed 0); each is "
              "copied to `neuron` keeping sizes, strides and storage offset, and the op's function variant "
              "runs on both devices. `device=`/generator arguments naming the CPU are redirected to neuron. "
              "The foreach ops' OpInfos (PyTorch keeps them apart from op_db: `foreach_*_op_db`) are counted "
              "with op_db, each also as its in-place variant (`_foreach_add_`, what torch.optim calls), "
              "which returns the list it updated.",
              "- Outputs are compared with `torch.testing.assert_close(equal_nan=True)` at the default "
              "tolerances of the output dtype; dtypes must match exactly and every output tensor of the "
              "neuron run must be on the neuron device.",
              "- **fp32 rule**: the device computes float64/complex128 in float32/complex64 (as on Trainium; "
              "`TORCH_NEURONX_FP64=native` turns that off). float64/complex128 outputs are compared against "
              "the CPU float64/complex128 result with the float32/complex64 default tolerances "
              "(rtol 1.3e-6, atol 1e-5). A failing sample with a float64/complex128 input or output is rerun "
              "with the device computing float64 natively (`TORCH_NEURONX_FP64=native`); if it then passes, "
              "it is still counted as a failure but marked `[fp64-emu]`: caused by the fp32 rule's precision "
              "or by a bug in the fp64 emulation.",
              "- Random ops (" + ", ".join(f"`{n}`" for n in sorted(_harness().RANDOM_OPS)) + ") and random modules "
              "in training mode only check structure, shape, dtype and device.",
              "- module_db: the module is built on CPU (seed 0; lazy modules are materialized by one CPU "
              "forward), deep-copied and moved to neuron; forward in training mode (and eval mode when they "
              "differ), then `sum(outputs).backward()`; outputs, input grads, parameter grads and buffers "
              "are compared.",
              "- A sample is skipped when the CPU reference itself raises or times out, or when it needs a "
              "sparse/quantized/nested tensor (not supported on the device).", ""]

    causes = Counter()
    cause_cases = defaultdict(set)
    for r in results:
        for cause, n in r.get("causes", {}).items():
            causes[cause] += n
            cause_cases[cause].add(r["name"])
    lines += ["## Failure causes", "",
              "Every failing sample, classified by its message (patterns in `CAUSES`, run_opinfo.py).", "",
              "| cause | samples | ops / modules |", "|---|---:|---|"]
    for cause, n in causes.most_common():
        names = sorted(cause_cases[cause])
        shown = ", ".join(names[:10]) + (f", ... ({len(names)} in all)" if len(names) > 10 else "")
        lines.append(f"| {_md(cause)} | {n} | {_md(shown)} |")
    lines.append("")

    failing = [r for r in results if r["failed"]]
    fp32_only = [r for r in failing if r["failed_fp32"] == r["failed"]]
    lines += ["## Failures", "",
              f"{len(failing)} cases (op or module x dtype) have at least one failing sample"
              f" ({len(fp32_only)} of them only with `[fp64-emu]` failures). "
              "The error is the first failing sample's.", "",
              "| op / module | dtype | failed | fp64 emu | passed | first error |", "|---|---|---:|---:|---:|---|"]
    for r in sorted(failing, key=lambda r: (r["kind"] != "op", r["name"], r["dtype"])):
        first = r["failures"][0] if r["failures"] else ["", ""]
        lines.append(f"| {_md(r['name'])} | {r['dtype']} | {r['failed']} | {r['failed_fp32']} | {r['passed']} | "
                     f"sample {first[0]}: {_md(first[1])[:260]} |")

    reasons = Counter()
    reason_cases = defaultdict(set)
    for r in results:
        for reason, n in r["skips"].items():
            reasons[reason] += n
            reason_cases[reason].add(r["name"])
    lines += ["", "## Skips", "", "| reason | samples | ops / modules |", "|---|---:|---|"]
    for reason, n in reasons.most_common():
        names = sorted(reason_cases[reason])
        shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
        lines.append(f"| {_md(reason)} | {n} | {_md(shown)} |")

    fallback = defaultdict(set)
    for r in results:
        for aten in r["fallback"]:
            fallback[aten].add(r["name"])
    lines += ["", "## CPU fallback", "",
              f"{len(fallback)} ATen ops ran through the copy-to-CPU fallback (not in the native op set) "
              "during the neuron runs, with the op_db/module_db entries that reached them:", "",
              "| ATen op | reached from |", "|---|---|"]
    for aten in sorted(fallback):
        names = sorted(fallback[aten])
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        lines.append(f"| `{aten}` | {_md(shown)} |")

    slow = sorted(results, key=lambda r: -r["seconds"])[:10]
    lines += ["", "## Slowest cases", "", "| case | dtype | seconds |", "|---|---|---:|"]
    for r in slow:
        lines.append(f"| {_md(r['name'])} | {r['dtype']} | {r['seconds']:.1f} |")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    start = time.time()
    results = supervise(args, argv)
    seconds = time.time() - start
    results.sort(key=lambda r: (r["kind"] != "op", r["name"], r["dtype"]))
    if args.json:
        with open(args.json, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    totals, _, _ = summarize(results)
    command = "python tests/conformance/run_opinfo.py " + " ".join(shlex.quote(a) for a in argv)
    if args.output != "-":
        write_report(results, args.output, command.strip(), seconds, args)
    print(f"[conformance] passed {totals['passed']} failed {totals['failed']} skipped {totals['skipped']} "
          f"pass rate {100 * pass_rate(totals):.2f}% in {seconds / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
