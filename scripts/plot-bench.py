#!/usr/bin/env python3
"""Plots `folio bench --json` reports as PNG files (issue 19).

  scripts/plot-bench.py [options] [LABEL=]INPUT ...

An INPUT is a directory written by scripts/bench-scaling.sh (c<N>-r<R>.json per concurrency and
repeat, profile-c<N>.json, peak.json, model.txt) or one `folio bench --json` file. Each INPUT is
one series, labelled LABEL (default: the directory's or file's name); inputs with the same LABEL
are one series (their repeats pooled, the best of their peaks). Writes to --out:

  scaling.png   batch scaling: decode output tokens/s against concurrency (median of the
                repeats), and in a second panel the fraction of the machine's peak each point
                reaches: tokens/s x FLOPs per token / peak. FLOPs per token = 2 x the matmul
                parameters (every 2-D weight but the token embedding, which is a lookup, unless
                it is tied as the LM head); attention's context-length FLOPs are left out, small
                next to the weights at these short contexts. The parameters come from --params,
                else a "flops_per_token" field of the report, else the GGUF (--model, or the
                directory's model.txt). The peak is peak_bench's (--peak, or the directory's
                peak.json) at the report's thread count: int8 dot products (VNNI or AVX2) for
                quantized weights, which Folio multiplies as int8, f32 FMA for f32/f16/bf16.
  roofline.png  batch-1 roofline fraction per series (dtype): the "roofline" -> "fraction"
                field of each series' lowest-concurrency report that measured the read
                bandwidth (bench-scaling.sh measures it at concurrency 1 only).
  profile.png   profile breakdown: stacked bars of "profile" -> decode / prefill -> ops,
                ms_per_step and share of the step, one bar per report that has a profile.

A plot whose fields no input has is skipped with a message. Prints the scaling table
(markdown) on stdout. Needs python3 and matplotlib (Debian: python3-matplotlib); no network.
"""

import argparse
import glob
import json
import math
import os
import re
import statistics
import struct
import sys

# ---------------------------------------------------------------------------------------------
# GGUF: just enough of the header to count each tensor's elements and name its type.

# ggml type id -> name, for the types Folio reads.
GGML_TYPE_NAMES = {
    0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 9: "q8_1",
    10: "q2_K", 11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K", 15: "q8_K", 20: "iq4_nl",
    23: "iq4_xs", 30: "bf16",
}
FLOAT_TYPES = {"f32", "f16", "bf16"}

# GGUF metadata value type -> struct format of a scalar (8: string and 9: array are handled apart).
GGUF_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                       10: "<Q", 11: "<q", 12: "<d"}


class GgufReader:
    def __init__(self, stream):
        self.stream = stream

    def read(self, fmt):
        size = struct.calcsize(fmt)
        data = self.stream.read(size)
        if len(data) != size:
            raise ValueError("truncated GGUF header")
        return struct.unpack(fmt, data)[0]

    def string(self):
        length = self.read("<Q")
        data = self.stream.read(length)
        if len(data) != length:
            raise ValueError("truncated GGUF string")
        return data.decode("utf-8", errors="replace")

    def skip_value(self, value_type):
        if value_type == 8:
            self.string()
        elif value_type == 9:
            element_type = self.read("<I")
            count = self.read("<Q")
            if element_type in GGUF_SCALAR_FORMATS:
                self.stream.seek(count * struct.calcsize(GGUF_SCALAR_FORMATS[element_type]), 1)
            else:
                for _ in range(count):
                    self.skip_value(element_type)
        elif value_type in GGUF_SCALAR_FORMATS:
            self.read(GGUF_SCALAR_FORMATS[value_type])
        else:
            raise ValueError(f"unknown GGUF value type {value_type}")


def read_gguf_tensors(path):
    """[(name, element count, dims, type name)] of every tensor of a GGUF file (v2 or v3)."""
    with open(path, "rb") as stream:
        reader = GgufReader(stream)
        if stream.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version = reader.read("<I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 or 3)")
        tensor_count = reader.read("<Q")
        metadata_count = reader.read("<Q")
        for _ in range(metadata_count):
            reader.string()
            reader.skip_value(reader.read("<I"))
        tensors = []
        for _ in range(tensor_count):
            name = reader.string()
            dims = [reader.read("<Q") for _ in range(reader.read("<I"))]
            type_id = reader.read("<I")
            reader.read("<Q")  # offset
            tensors.append((name, math.prod(dims), dims,
                            GGML_TYPE_NAMES.get(type_id, f"type{type_id}")))
        return tensors


def describe_model(path):
    """{"matmul_parameters", "parameters", "dtype"} of a GGUF model: the weights one decoded
    token multiplies (2-D tensors but the token embedding, unless it doubles as the LM head),
    all parameters, and the type holding most matmul parameters."""
    tensors = read_gguf_tensors(path)
    names = {name for name, _, _, _ in tensors}
    tied = "output.weight" not in names
    matmul = 0
    by_type = {}
    for name, count, dims, type_name in tensors:
        if len([d for d in dims if d > 1]) < 2:
            continue
        if name == "token_embd.weight" and not tied:
            continue
        matmul += count
        by_type[type_name] = by_type.get(type_name, 0) + count
    return {
        "matmul_parameters": matmul,
        "parameters": sum(count for _, count, _, _ in tensors),
        "dtype": max(by_type, key=by_type.get) if by_type else None,
    }


# ---------------------------------------------------------------------------------------------
# peak_bench --benchmark_format=json


def read_peak(path, basis):
    """{("fma" | "int8", threads): ops per second}: the best repetition of each benchmark;
    basis "unloaded" divides by its cpu_busy (the share of its cores it got on a loaded
    machine), "measured" takes the wall-clock figure as it is."""
    with open(path) as stream:
        report = json.load(stream)
    peaks = {}
    for entry in report.get("benchmarks", []):
        if entry.get("run_type", "iteration") != "iteration" or entry.get("error_occurred"):
            continue
        match = re.match(r"peak/(f32_fma|int8_dot)/threads:(\d+)", entry["name"])
        if not match:
            continue
        value = entry.get("GFLOP/s", entry.get("GOPS"))
        if value is None:
            continue
        if basis == "unloaded" and entry.get("cpu_busy", 0) > 0:
            value /= min(1.0, entry["cpu_busy"])
        key = ("fma" if match.group(1) == "f32_fma" else "int8", int(match.group(2)))
        peaks[key] = max(peaks.get(key, 0.0), value * 1e9)
    return peaks


def peak_for(peaks, unit, threads):
    """The peak at `threads`; above the largest thread count measured, that count's figure
    scaled by threads (cores add up for register-resident work)."""
    if (unit, threads) in peaks:
        return peaks[(unit, threads)]
    measured = sorted(t for u, t in peaks if u == unit)
    if not measured:
        return None
    below = [t for t in measured if t <= threads] or measured[:1]
    return peaks[(unit, below[-1])] * threads / below[-1]


# ---------------------------------------------------------------------------------------------
# Inputs


class Series:
    def __init__(self, label):
        self.label = label
        self.points = {}  # concurrency -> [report]
        self.profiles = []  # (name, report)
        self.peak_paths = []
        self.model_path = None


def load_json(path):
    with open(path) as stream:
        return json.load(stream)


def load_series(argument, peak_override, model_override):
    label, separator, path = argument.partition("=")
    if not separator or os.path.exists(argument):
        label, path = "", argument
    if not os.path.exists(path):
        sys.exit(f"plot-bench: no such file or directory: {path}")
    series = Series(label or os.path.basename(os.path.normpath(path)).removesuffix(".json"))
    if os.path.isdir(path):
        for report_path in sorted(glob.glob(os.path.join(path, "c*-r*.json"))):
            report = load_json(report_path)
            series.points.setdefault(report["concurrency"], []).append(report)
            if report.get("profile"):
                series.profiles.append((f"c{report['concurrency']}", report))
        for report_path in sorted(glob.glob(os.path.join(path, "profile-c*.json")),
                                  key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0])):
            report = load_json(report_path)
            if report.get("profile"):
                series.profiles.append((f"c{report['concurrency']}", report))
        if os.path.exists(os.path.join(path, "peak.json")):
            series.peak_paths = [os.path.join(path, "peak.json")]
        model_file = os.path.join(path, "model.txt")
        if os.path.exists(model_file):
            with open(model_file) as stream:
                series.model_path = stream.read().strip()
    else:
        report = load_json(path)
        series.points.setdefault(report.get("concurrency", 1), []).append(report)
        if report.get("profile"):
            series.profiles.append((f"c{report.get('concurrency', 1)}", report))
    series.peak_paths = [peak_override] if peak_override else series.peak_paths
    series.model_path = model_override or series.model_path
    return series


# ---------------------------------------------------------------------------------------------
# Plots


def scaling_rows(series, arguments):
    """The scaling table of one series: [(concurrency, tokens/s, TPOT p50, fraction of peak or
    None, threads)], medians over the repeats, and a note saying where the FLOPs and the peak
    came from (or why there is no fraction)."""
    any_report = next(iter(series.points.values()))[0] if series.points else {}
    flops_per_token, flops_source, dtype = None, None, arguments.dtype
    if arguments.params:
        flops_per_token, flops_source = 2.0 * arguments.params, f"--params {arguments.params:g}"
    elif "flops_per_token" in any_report:
        flops_per_token, flops_source = float(any_report["flops_per_token"]), "the report"
    elif series.model_path and os.path.exists(series.model_path):
        model = describe_model(series.model_path)
        flops_per_token = 2.0 * model["matmul_parameters"]
        flops_source = (f"2 x {model['matmul_parameters'] / 1e6:.1f}M matmul parameters of "
                        f"{os.path.basename(series.model_path)} (GGUF)")
        dtype = dtype or model["dtype"]
    dtype = dtype or next((t for t in ("q8_0", "f16", "f32", "bf16") if t in series.label), None)
    peaks = {}
    for path in series.peak_paths:
        for key, value in read_peak(path, arguments.peak_basis).items():
            peaks[key] = max(peaks.get(key, 0.0), value)
    unit = None
    if dtype:
        unit = "fma" if dtype in FLOAT_TYPES else "int8"
    notes = []
    if flops_per_token is None:
        notes.append("no FLOPs per token (give --params or --model)")
    if not peaks:
        notes.append("no peak (give --peak)")
    if unit is None:
        notes.append("unknown weight type (give --dtype)")
    rows = []
    for concurrency in sorted(series.points):
        reports = series.points[concurrency]
        tokens = statistics.median(r["output_tokens_per_second"] for r in reports)
        tpot = statistics.median(r["tpot_ms"]["p50"] for r in reports)
        fraction = None
        if flops_per_token and peaks and unit:
            peak = peak_for(peaks, unit, reports[0].get("threads", 1))
            fraction = tokens * flops_per_token / peak if peak else None
        rows.append((concurrency, tokens, tpot, fraction, reports[0].get("threads")))
    if not notes:
        threads = sorted({row[4] for row in rows if row[4]})
        peak_text = ", ".join(
            f"{peak_for(peaks, unit, t) / 1e9:.4g} {'GFLOP/s' if unit == 'fma' else 'GOPS'} "
            f"on {t} thread{'s' if t > 1 else ''}" for t in threads)
        notes.append(f"{dtype} weights: FLOPs/token from {flops_source}; peak "
                     f"{'f32 FMA' if unit == 'fma' else 'int8 dot'} ({arguments.peak_basis}) "
                     f"{peak_text}")
    return rows, "; ".join(notes)


def plot_scaling(plt, all_series, arguments, out):
    # Two panels sharing the concurrency axis: the fraction is tokens/s times a constant per
    # series, so on a twin axis of the same panel it would hide under the tokens/s line.
    figure, (tokens_axis, fraction_axis) = plt.subplots(
        2, 1, sharex=True, figsize=(8, 7), gridspec_kw={"height_ratios": (3, 2)})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    any_fraction = False
    concurrencies = set()
    notes = []
    print("| series | concurrency | output tokens/s | TPOT p50 ms | fraction of peak |")
    print("|---|---|---|---|---|")
    for index, series in enumerate(all_series):
        rows, note = scaling_rows(series, arguments)
        if not rows:
            continue
        color = colors[index % len(colors)]
        concurrency = [row[0] for row in rows]
        concurrencies.update(concurrency)
        tokens_axis.plot(concurrency, [row[1] for row in rows], "o-", color=color,
                         label=series.label)
        if all(row[3] is not None for row in rows):
            any_fraction = True
            fraction_axis.plot(concurrency, [row[3] for row in rows], "s-", color=color,
                               label=series.label)
            for x, row in zip(concurrency, rows):
                fraction_axis.annotate(f"{row[3]:.3g}", (x, row[3]), textcoords="offset points",
                                       xytext=(0, 5), ha="center", fontsize="x-small")
        for row in rows:
            fraction = f"{row[3]:.3g}" if row[3] is not None else "n/a"
            print(f"| {series.label} | {row[0]} | {row[1]:.1f} | {row[2]:.2f} | {fraction} |")
        print(f"plot-bench: {series.label}: {note}", file=sys.stderr)
        notes.append(f"{series.label}: {note}")
    if not concurrencies:
        plt.close(figure)
        print("plot-bench: scaling.png skipped: no reports", file=sys.stderr)
        return None
    tokens_axis.set_xscale("log", base=2)
    fraction_axis.set_xticks(sorted(concurrencies), [str(c) for c in sorted(concurrencies)])
    fraction_axis.minorticks_off()
    fraction_axis.set_xlabel("concurrent requests (decode batch)")
    tokens_axis.set_ylabel("output tokens/s")
    tokens_axis.set_ylim(bottom=0)
    tokens_axis.grid(True, alpha=0.3)
    tokens_axis.legend(loc="upper left", fontsize="small")
    tokens_axis.set_title("Batched decode scaling")
    fraction_axis.set_ylabel("fraction of peak\n(tokens/s x 2 x params / peak)")
    fraction_axis.grid(True, alpha=0.3)
    if any_fraction:
        fraction_axis.set_ylim(0, fraction_axis.get_ylim()[1] * 1.15)
    else:
        fraction_axis.text(0.5, 0.5, "no peak or parameter count: see the messages",
                           transform=fraction_axis.transAxes, ha="center", va="center")
    # Where each series' FLOPs and peak came from, under the plot.
    footer = 0.025 * len(notes)
    figure.tight_layout(rect=(0, footer, 1, 1))
    for index, note in enumerate(notes):
        figure.text(0.01, footer - 0.025 * (index + 0.8), note, fontsize=6.5)
    path = os.path.join(out, "scaling.png")
    figure.savefig(path, dpi=arguments.dpi)
    plt.close(figure)
    return path


def plot_roofline(plt, all_series, arguments, out):
    bars = []
    for series in all_series:
        for concurrency in sorted(series.points):
            # folio bench writes "roofline": null without a model engine, and zeros when it
            # did not measure the read bandwidth (--bandwidth-buffer-mib 0).
            report = next((r for r in series.points[concurrency]
                           if (r.get("roofline") or {}).get("read_bandwidth_gbps", 0) > 0), None)
            if report is None:
                continue
            roofline = report["roofline"]
            bars.append((f"{series.label}\nc={concurrency}, {report.get('threads', '?')} thr",
                         roofline["fraction"], roofline))
            print(f"plot-bench: roofline {series.label} c={concurrency}: fraction "
                  f"{roofline['fraction']:.3g} (roofline TPOT {roofline['roofline_tpot_ms']:.3g} ms, "
                  f"{roofline['read_bandwidth_gbps']:.3g} GB/s)", file=sys.stderr)
            break
    if not bars:
        print("plot-bench: roofline.png skipped: no report has a \"roofline\" field with a "
              "measured read bandwidth (folio bench before issue 19, or "
              "--bandwidth-buffer-mib 0)", file=sys.stderr)
        return None
    figure, axis = plt.subplots(figsize=(max(5, 1.6 * len(bars) + 2), 4.5))
    positions = range(len(bars))
    axis.bar(positions, [bar[1] for bar in bars], color="tab:blue")
    for position, (_, fraction, roofline) in zip(positions, bars):
        axis.annotate(f"{fraction:.2f}\n{roofline['roofline_tpot_ms']:.2f} ms roof",
                      (position, fraction), ha="center", va="bottom", fontsize="small")
    axis.axhline(1.0, color="gray", linestyle=":")
    axis.set_xticks(list(positions), [bar[0] for bar in bars], fontsize="small")
    axis.set_ylabel("roofline TPOT / measured TPOT")
    axis.set_ylim(0, max(1.15, max(bar[1] for bar in bars) * 1.2))
    axis.set_title("Decode against the read-bandwidth roofline")
    figure.tight_layout()
    path = os.path.join(out, "roofline.png")
    figure.savefig(path, dpi=arguments.dpi)
    plt.close(figure)
    return path


def plot_profile(plt, all_series, arguments, out):
    reports = [(f"{series.label}\n{name}", report["profile"])
               for series in all_series for name, report in series.profiles]
    # A phase without steps has no ops (a run whose prompts all came from the prefix cache has
    # no prefill); its bars are left out.
    def has_ops(profile, phase):
        return bool((profile.get(phase) or {}).get("ops"))

    phases = [phase for phase in ("decode", "prefill")
              if any(has_ops(profile, phase) for _, profile in reports)]
    if not phases:
        print("plot-bench: profile.png skipped: no report has a \"profile\" field "
              "(run folio bench --profile)", file=sys.stderr)
        return None
    # One color per op kind across both phases, the kinds in order of total time.
    totals = {}
    for _, profile in reports:
        for phase in phases:
            for op in (profile.get(phase) or {}).get("ops") or []:
                totals[op["kind"]] = totals.get(op["kind"], 0.0) + op["ms_per_step"]
    kinds = sorted(totals, key=totals.get, reverse=True)
    colormap = plt.get_cmap("tab20")
    colors = {kind: colormap(index % 20) for index, kind in enumerate(kinds)}
    # Top row: ms per step (how long); bottom row: share of the step (where the time goes,
    # readable for a 10 ms and a 200 ms step side by side).
    width = max(7.0, 1.2 * len(reports) * len(phases) + 2)
    legend_columns = max(2, int(width / 2.1))
    legend_rows = math.ceil(len(kinds) / legend_columns)
    figure, axes = plt.subplots(2, len(phases), squeeze=False, sharex="col",
                                figsize=(width, 7.0 + 0.22 * legend_rows))
    for column, phase in enumerate(phases):
        names = [name for name, profile in reports if has_ops(profile, phase)]
        phase_profiles = [profile[phase] for _, profile in reports if has_ops(profile, phase)]
        for row, field in enumerate(("ms_per_step", "share")):
            axis = axes[row][column]
            bottoms = [0.0] * len(names)
            for kind in kinds:
                heights = [next((op[field] * (100.0 if field == "share" else 1.0)
                                 for op in p["ops"] if op["kind"] == kind), 0.0)
                           for p in phase_profiles]
                axis.bar(range(len(names)), heights, bottom=bottoms, color=colors[kind],
                         label=kind)
                bottoms = [b + h for b, h in zip(bottoms, heights)]
            if field == "ms_per_step":
                for position, (p, bottom) in enumerate(zip(phase_profiles, bottoms)):
                    axis.annotate(f"step {p.get('step_ms', bottom):.3g} ms\n{p.get('steps', '?')} "
                                  f"steps", (position, bottom), ha="center", va="bottom",
                                  fontsize="x-small")
                axis.set_ylim(0, max(bottoms) * 1.18)
                axis.set_ylabel("ms per step")
                axis.set_title(f"{phase} steps by op kind")
            else:
                axis.set_ylim(0, 105)
                axis.set_ylabel("% of the step")
                axis.set_xticks(range(len(names)), names, fontsize="small")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=legend_columns, fontsize="small")
    figure.tight_layout(rect=(0, 0.028 * legend_rows + 0.01, 1, 1))
    path = os.path.join(out, "profile.png")
    figure.savefig(path, dpi=arguments.dpi)
    plt.close(figure)
    return path


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", metavar="[LABEL=]INPUT",
                        help="a bench-scaling.sh directory or a folio bench --json file")
    parser.add_argument("-o", "--out", default="bench-plots", help="folder for the PNG files "
                        "(default: %(default)s)")
    parser.add_argument("--peak", help="peak_bench --benchmark_format=json output, for every input")
    parser.add_argument("--model", help="the GGUF model of every input (its parameter count)")
    parser.add_argument("--params", type=float,
                        help="matmul parameters per token, instead of reading them (FLOPs = 2x)")
    parser.add_argument("--dtype", help="weight type (f32, f16, q8_0, ...) when no GGUF is read: "
                        "picks the FMA or the int8 peak")
    parser.add_argument("--peak-basis", choices=("unloaded", "measured"), default="unloaded",
                        help="unloaded (default): peak_bench's best figure divided by the share "
                        "of its cores it got (cpu_busy); measured: the wall-clock figure as is")
    parser.add_argument("--dpi", type=int, default=120)
    arguments = parser.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # Debian's python3-matplotlib lives in the system interpreter's packages; another
        # python3 first on PATH (pyenv, a virtual environment) does not see it.
        system_python = "/usr/bin/python3"
        if (os.path.exists(system_python)
                and os.path.realpath(sys.executable) != os.path.realpath(system_python)):
            os.execv(system_python, [system_python, os.path.abspath(__file__)] + sys.argv[1:])
        print("plot-bench: matplotlib is missing (Debian: apt-get install python3-matplotlib)",
              file=sys.stderr)
        return 3

    all_series = []
    for argument in arguments.inputs:
        series = load_series(argument, arguments.peak, arguments.model)
        same = next((s for s in all_series if s.label == series.label), None)
        if same is None:
            all_series.append(series)
            continue
        # Runs of one series (say bench-scaling.sh run twice): repeats pooled, best peak.
        for concurrency, reports in series.points.items():
            same.points.setdefault(concurrency, []).extend(reports)
        same.profiles += series.profiles
        same.peak_paths += [p for p in series.peak_paths if p not in same.peak_paths]
        same.model_path = same.model_path or series.model_path
    os.makedirs(arguments.out, exist_ok=True)
    written = [path for path in (plot(plt, all_series, arguments, arguments.out)
                                 for plot in (plot_scaling, plot_roofline, plot_profile)) if path]
    for path in written:
        print(f"plot-bench: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
