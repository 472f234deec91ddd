"""scripts/gpu_report.py's report.md: NVIDIA's table layouts from the report's steps, the GPU tests' outcomes,
GPU decoding against synthetic data, with every figure's command, the machine, and every step's status."""

from __future__ import annotations

from collections import Counter

from benchmarks.common import ratio_text

REPORT_PRECISIONS = ("TF32", "AMP", "BF16")
AMP_TITLES = {"float16": "AMP (fp16)", "bfloat16": "AMP (bf16)"}  # launch.py's amp_dtype


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _md(text: str) -> str:
    """``text`` fit for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _precision_title(precision: str, device: str) -> str:
    """TF32 / AMP (fp16) / bf16, as NVIDIA's columns name them; FP32 on the CPU, which has no TF32."""
    return {"TF32": "TF32" if device == "cuda" else "FP32", "AMP": "AMP (fp16)", "BF16": "bf16"}[precision]


def _figure(step: dict | None) -> float | None:
    """The headline images/s of a launch.py step that ran, else None."""
    return step["result"]["total_ips"] if step and step["status"] == "ok" else None


def _cell(step: dict | None) -> str:
    """A throughput cell: the figure with its batch and the wall-clock figure, or why there is none."""
    if step is None:
        return "-"
    if step["status"] != "ok":
        return _md(f"{step['status']}: {step.get('error', '')}")
    result = step["result"]
    wall = f"; wall clock {_rate(result['wall_ips'])}" if result.get("wall_ips") else ""
    return f"{_rate(result['total_ips'])} img/s (batch {result['batch_size']}{wall})"


def _speedup(step: dict | None, base: dict | None) -> str:
    ours, theirs = _figure(step), _figure(base)
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def _launch_table(report: dict) -> list[str]:
    launched = {(s["arch"], s["precision"]): s for s in report["steps"]
                if s.get("kind") == "launch" and s["section"] != "decode" and not s.get("memory_format")}
    if not launched:
        return []
    base = _precision_title("TF32", report["device"])
    warmups = {s["result"].get("warmup") for s in launched.values() if s["status"] == "ok"}
    warmup = f"the first {warmups.pop()}" if len(warmups) == 1 else "the first"
    lines = ["The command users type, `launch.py --mode benchmark_training_short` (synthetic data; the platform "
             "preset's batch, loader and gradient accumulation), one process: `train.total_ips` of its summary, "
             f"images over the wall time of the measured iterations, {warmup} left out (cuDNN's autotuning, the "
             "allocator's growth; `--benchmark-warmup`); `train.wall_ips`, every iteration, beside it as \"wall "
             f"clock\". Speed-up: over the {base} column.", "",
             f"| Arch | GPUs | Throughput {base} | Throughput AMP (fp16) | speed-up ({base} to AMP) | "
             f"Throughput bf16 | speed-up ({base} to bf16) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for arch in dict.fromkeys(arch for arch, _ in launched):
        full, amp, bf16 = (launched.get((arch, precision)) for precision in REPORT_PRECISIONS)
        lines.append(f"| {arch} | 1 | {_cell(full)} | {_cell(amp)} | {_speedup(amp, full)} | {_cell(bf16)} | "
                     f"{_speedup(bf16, full)} |")
    return lines + [""]


def _layout_table(report: dict) -> list[str]:
    """An architecture's launch.py run at its preset's memory format beside the same command with another
    (``--memory-format auto`` picks one per device and precision: docs/performance.md says which, and why)."""
    others = [s for s in report["steps"] if s.get("kind") == "launch" and s.get("memory_format")]
    lines = []
    for other in others:
        preset = next((s for s in report["steps"] if s.get("kind") == "launch" and s["section"] == other["section"]
                       and (s["arch"], s["precision"]) == (other["arch"], other["precision"])
                       and not s.get("memory_format")), None)
        layout = (preset["result"].get("memory_format") if _figure(preset) else None) or "the preset's"
        if not lines:
            lines = ["The same launch.py command in another memory format (`--memory-format`):", "",
                     "| Arch | precision | memory format | Throughput | over the preset's |", "|---|---|---|---:|---:|"]
        title = _precision_title(other["precision"], report["device"])
        lines.append(f"| {other['arch']} | {title} | {layout} (preset) | {_cell(preset)} | |")
        lines.append(f"| {other['arch']} | {title} | {other['memory_format']} | {_cell(other)} | "
                     f"{_speedup(other, preset)} |")
    return lines + [""] if lines else []


def _against_plain_table(report: dict) -> list[str]:
    measured = {(s["arch"], s["precision"]): s for s in report["steps"] if s.get("kind") == "throughput"}
    compiled = {(s["arch"], s["precision"]): s for s in report["steps"] if s.get("kind") == "compile"}
    rows = [key for key, step in measured.items() if step["status"] == "ok"]
    rows += [key for key, step in compiled.items() if step["status"] == "ok" and key not in rows]
    if not rows:
        return []
    lines = ["`benchmarks/train_throughput.py`: the package's training step (`Engine.train_step`, as main.py runs "
             "it) on a synthetic batch held on the device, 1000 classes, at the largest batch tried that fits, "
             "against the loop a user writes (`torch.optim.SGD`, `nn.CrossEntropyLoss`, autocast and a "
             "`GradScaler` where the precision asks for them, NCHW), in the same process, in alternating rounds "
             "after untimed warm-up iterations; median images/s of the rounds; a ratio inside the rounds' spread "
             "gets no verdict:", "",
             "| Arch | precision | batch | plain loop img/s | ours eager channels-last | `--compile` | "
             "compile warm-up s |", "|---|---|---:|---:|---:|---:|---:|"]
    for arch, precision in rows:
        step, compile_step = measured.get((arch, precision)), compiled.get((arch, precision))
        results = [s["result"] for s in (step, compile_step) if s and s["status"] == "ok"]
        cells = []
        for path, source in (("channels_last", step), ("compile", compile_step)):
            stats = source["result"]["paths"].get(path) if source and source["status"] == "ok" else None
            cells.append("-" if stats is None else
                         f"{_rate(stats['median'])} ({ratio_text(stats['ratio'], stats['ratio_spread'])})")
        warmup = compile_step["result"]["warmup_seconds"].get("compile") if compile_step and \
            compile_step["status"] == "ok" else None
        lines.append(f"| {arch} | {_precision_title(precision, report['device'])} | "
                     f"{results[0]['config']['batch_size']} | {_rate(results[0]['plain']['median'])} | {cells[0]} | "
                     f"{cells[1]} | {'-' if warmup is None else f'{warmup:.0f}'} |")
    return lines + [""]


def training_markdown(report: dict) -> list[str]:
    """NVIDIA's training table (Arch | GPUs | Throughput TF32 | Throughput AMP | speed-up, bf16 beside) from
    launch.py's benchmark, then train_throughput.py's runs against the plain loop and ``--compile``, and the
    command of every figure."""
    trained = [s for s in report["steps"] if s["section"] in ("amp", "train")]
    if not trained:
        return []
    lines = ["## Training throughput", ""] + _launch_table(report) + _layout_table(report) + _against_plain_table(report)
    if report.get("compile_missing"):
        lines += [f"`--compile` was not measured: {report['compile_missing']}.", ""]
    lines += ["Commands (in the repository):", ""]
    lines += [f"* {step['name']}: `{step['command']}`" for step in trained]
    return lines + [""]


def _infer_title(name: str, device: str) -> str:
    fp32 = "TF32" if device == "cuda" else "FP32"
    return {"torchvision": f"torchvision eager {fp32}, NCHW (the baseline)", "channels_last": f"{fp32}, channels-last",
            "fp16": "AMP (fp16 autocast), channels-last", "bf16": "bf16 autocast, channels-last"}.get(name, name)


def inference_markdown(report: dict) -> list[str]:
    """NVIDIA's inference tables (Batch | Throughput | Latency p50 | p90 | p99), one per path."""
    lines = []
    for step in (s for s in report["steps"] if s["section"] == "infer"):
        lines += [f"## Inference: {step['arch']}", "", f"`{step['command']}`", ""]
        if step["status"] != "ok":
            lines += [f"{step['status']}: {step.get('error', '')}", ""]
            continue
        result = step["result"]
        lines.append(f"{result['config']['image_size']} px, random weights; each batch is on the device before it "
                     "is timed, on its own, after untimed warm-up batches; throughput is the batch size over the "
                     "mean latency; vs torchvision: over the baseline's throughput at the same batch.")
        for name, entry in result["paths"].items():
            lines += ["", f"#### {result['config']['arch']}, {_infer_title(name, report['device'])}", ""]
            if "skipped" in entry:
                lines.append(f"skipped: {entry['skipped']}")
                continue
            lines += ["| Batch | Throughput img/s | Latency p50 | Latency p90 | Latency p99 | vs torchvision |",
                      "|---:|---:|---:|---:|---:|---:|"]
            for batch in result["config"]["batch_sizes"]:
                point = entry[str(batch)]
                lines.append(f"| {batch} | {_rate(point['images_per_s'])} | {point['p50_ms']:.2f} ms | "
                             f"{point['p90_ms']:.2f} ms | {point['p99_ms']:.2f} ms | {point['speedup']:.2f}x |")
        lines.append("")
    return lines


def tests_markdown(report: dict) -> list[str]:
    """The tests' status and count of outcomes, why tests were skipped, and each failure with its message and
    the end of its traceback."""
    lines = []
    for step in (s for s in report["steps"] if s["section"] == "tests"):
        error = f" ({step['error']})" if step.get("error") else ""
        lines += ["## GPU tests", "", f"`{step['command']}`: **{step['status']}**{error}, {step['seconds']:.0f} s", ""]
        result = step.get("result")
        if result:
            counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(result["counts"].items()))
            lines += [f"Outcomes: {counts or 'no test ran'}.", ""]
            for outcome in ("skipped", "xfailed"):
                reasons = Counter(t.get("reason") or "no reason given" for t in result["tests"]
                                  if t["outcome"] == outcome)
                lines += [f"* {outcome} ({n}): {_md(reason)}" for reason, n in reasons.most_common()]
            for test in result["tests"]:
                if test["outcome"] in ("failed", "error"):
                    lines += ["", f"**{test['outcome']}**: `{test['test']}`: {_md(test.get('message', ''))}", "",
                              "```", test.get("traceback", ""), "```"]
        lines.append("")
    return lines


def _loader_lines(step: dict) -> list[str]:
    result = step["result"]
    lines = ["| backend | images/s | CPU ms per image | speed-up over it |", "|---|---:|---:|---|"]
    cpu_ms = f"{result['cpu_ms']:.2f}" if "cpu_ms" in result else "-"
    lines.append(f"| {result.get('backend', '-')} | {_rate(result['images_per_s'])} | {cpu_ms} | |")
    for name, base in result["beside"].items():
        verdict = base["verdict"] or f"{base['speedup']:.2f}x ({base['spread']})"
        lines.append(f"| {name} | {_rate(base['images_per_s'])} | {base['cpu_ms']:.2f} | {_md(verdict)} |")
    if result.get("cpu_decoded") is not None:
        lines += ["", f"{result.get('backend', 'The backend')} decoded {result['cpu_decoded']:,} JPEGs on the CPU, "
                  "over all epochs (those the device's decoder refused)."]
    return lines


def _probe_lines(result: dict) -> list[str]:
    """The decoder probe's table: each library's grey levels on each probe JPEG, and the verdict."""
    lines = [f"Each probe JPEG decoded on {result['device']} against {result['cpu_decoder']} on the CPU; a decoder "
             f"is taken within {result['bound_levels']:g} grey levels on average.", "",
             "| library | probe | mean grey levels | largest |", "|---|---|---:|---:|"]
    for library, found in result["libraries"].items():
        if "error" in found:
            lines.append(f"| {library} | - | {_md(found['error'])} | |")
            continue
        for entry in found["probes"]:
            if entry["mean_levels"] is None:
                lines.append(f"| {library} {found['version']} | {entry['probe']} | shape {entry['shape']} "
                             f"(expected {entry['expected']}) | |")
            else:
                lines.append(f"| {library} {found['version']} | {entry['probe']} | {entry['mean_levels']:.3f} | "
                             f"{entry['max_levels']} |")
    verdict = f"taken: {result['taken']}" if result["taken"] else f"refused: {_md(result['problem'] or '')}"
    return lines + ["", f"**{verdict}**"]


def probe_markdown(report: dict) -> list[str]:
    """The decoder probe first: what the device's JPEG decoder makes of pytorch-gpu's probe JPEGs, and whether the
    backend takes it (a refusal costs the decode section's steps that need it, each saying why)."""
    lines = []
    for step in (s for s in report["steps"] if s["kind"] == "probe"):
        lines += ["## The device's JPEG decoder", "", f"`{step['command']}`: **{step['status']}**"
                  + (f" ({_md(step['error'])})" if step.get("error") else ""), ""]
        if step.get("result"):
            lines += [*_probe_lines(step["result"]), ""]
    return lines


def decode_ratio(report: dict) -> float | None:
    """resnet50's AMP training throughput from JPEGs over the same command's on synthetic data, both having run."""
    runs = {s["data"]: s for s in report["steps"] if s["section"] == "decode" and s.get("kind") == "launch"}
    jpeg, synthetic = _figure(runs.get("JPEG")), _figure(runs.get("synthetic"))
    return jpeg / synthetic if jpeg and synthetic else None


def decode_markdown(report: dict) -> list[str]:
    """The JPEG set, the loader alone (pytorch-gpu beside pytorch) and training from JPEGs against synthetic
    data, with JPEG over synthetic; what stood in for pytorch-gpu where the device has none."""
    steps = [s for s in report["steps"] if s["section"] == "decode" and s["kind"] != "probe"]
    if not steps:
        return []
    lines = ["## GPU decoding", ""]
    for step in steps:
        lines += [f"{step['name']}: `{step['command']}`" + ("" if step["status"] == "ok" else
                                                           f": **{step['status']}** {step.get('error') or ''}"), ""]
        if step.get("note"):
            lines += [f"Note: {step['note']}.", ""]
        if step["status"] != "ok":
            continue
        result = step["result"]
        if step["kind"] == "data":
            kib = result["mean_bytes"] / 1024
            lines += [f"{result['images']} JPEGs of {result['width']}x{result['height']} at quality "
                      f"{result['quality']} (pink noise the size of photographs' files: {kib:.0f} KiB on average), "
                      f"written in {result['seconds']:.0f} s.", ""]
        elif step["kind"] == "loader":
            lines += ["The loader alone, epochs alternating: median images/s over the epochs after the first.", "",
                      *_loader_lines(step), ""]
    runs = [s for s in steps if s.get("kind") == "launch"]
    if runs:
        dtypes = {s["result"].get("amp_dtype") for s in runs if s["status"] == "ok"}  # bf16 on the CPU
        precision = AMP_TITLES.get(dtypes.pop(), "AMP") if len(dtypes) == 1 else "AMP"
        lines += [f"{runs[0]['arch']} training at {precision}, the same launch.py command on the JPEGs and on "
                  "synthetic data: `train.total_ips`, warm-up left out.", "",
                  "| data | backend | Throughput | JPEGs decoded on the CPU |", "|---|---|---:|---:|"]
        for step in runs:
            backend = (step["result"].get("data_backend") or "-") if step["status"] == "ok" else "-"
            decoded = step["result"].get("cpu_decoded") if step["status"] == "ok" else None
            lines.append(f"| {step['data']} | {backend} | {_cell(step)} | {'-' if decoded is None else f'{decoded:,}'} |")
        ratio = decode_ratio(report)
        lines += ["", f"**JPEG / synthetic: {ratio:.2f}** (the goal: 0.90 or more)." if ratio is not None else
                  "JPEG / synthetic: not measured (one of the two runs has no figure).", ""]
    return lines


def markdown(report: dict) -> str:
    """report.md: the machine and the command, whether the run finished, then the training, tests, inference
    and GPU decoding sections, and every step's status."""
    smoke = " (smoke run: tiny sizes, the figures say nothing about speed)" if report["smoke"] else ""
    forecast = (f" (foretold: {report['expected_s']:.0f} s, by the estimates from {report['estimated_on']})"
                if report.get("expected_s") else "")
    lines = [f"# GPU report{smoke}", "",
             f"* Machine: {report['machine']['description']}",
             f"* Command: `{report['command']}`",
             f"* Started {report['started']}; {report['seconds']:.0f} s of the {report['budget_s']:.0f} s budget"
             f"{forecast}."]
    if report.get("work"):
        lines.append(f"* The steps worked in `{report['work']}`, removed at the end: logs.tar.gz holds its files "
                     "(but the JPEG set) under `gpu_report/`.")
    if not report.get("finished", True):
        lines.append("* **The run had not finished** when this was written: the steps marked pending had not run.")
    lines.append("")
    lines += probe_markdown(report) + training_markdown(report) + tests_markdown(report) + inference_markdown(report)
    lines += decode_markdown(report)
    lines += ["## Steps", "", "| section | step | status | seconds | estimate | error |",
              "|---|---|---|---:|---:|---|"]
    for step in report["steps"]:
        error = _md(step.get("error") or "")
        estimate = f"{step['estimate_s']:.0f}" if step.get("estimate_s") else "-"
        lines.append(f"| {step['section']} | {step['name']} | {step['status']} | {step['seconds']:.0f} | {estimate} | "
                     f"{error} |")
    return "\n".join(lines) + "\n"
