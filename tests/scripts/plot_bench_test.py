#!/usr/bin/env python3
"""scripts/plot-bench.py on the sample reports of tests/data/bench (the `folio bench --json`
shape with the "roofline" and "profile" fields, measured, unmeasured, null or absent; a
bench-scaling.sh directory; peak_bench JSON):
the PNG files appear and are PNG images, the fraction of peak in the printed table matches one
computed here from the sample figures and a GGUF file written here, and plots whose fields no
report has are skipped with a message. Exit 77 (skipped) when matplotlib is missing."""

import importlib.util
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts/plot-bench.py"
DATA = ROOT / "tests/data/bench"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

failures = []


def expect(condition, message):
    if not condition:
        failures.append(message)
        print(f"FAIL: {message}", file=sys.stderr)


def gguf_string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(path, tensors):
    """A GGUF v3 header with a string, a u32 and a string-array metadata entry (which the reader
    must skip) and `tensors` [(name, dims, ggml type id)]; no tensor data (not read)."""
    metadata = [
        gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("llama"),
        gguf_string("llama.block_count") + struct.pack("<II", 4, 1),
        gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3)
        + gguf_string("a") + gguf_string("bb") + gguf_string("<s>"),
    ]
    body = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)) + b"".join(metadata)
    for name, dims, type_id in tensors:
        body += gguf_string(name) + struct.pack("<I", len(dims))
        body += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", type_id, 0)
    path.write_bytes(body)


def run(arguments):
    result = subprocess.run([sys.executable, str(SCRIPT)] + arguments, capture_output=True,
                            text=True, timeout=120)
    if result.returncode == 3 and "matplotlib is missing" in result.stderr:
        print("matplotlib is missing: skipped", file=sys.stderr)
        sys.exit(77)
    return result


def table_fraction(stdout, label, concurrency):
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0] == label and cells[1] == str(concurrency):
            return cells[4]
    return None


def expect_png(path):
    expect(path.is_file() and path.stat().st_size > 1000, f"{path.name} written and non-empty")
    if path.is_file():
        expect(path.read_bytes()[:8] == PNG_MAGIC, f"{path.name} is a PNG image")


def main():
    sys.dont_write_bytecode = True  # no scripts/__pycache__ in the source tree
    spec = importlib.util.spec_from_file_location("plot_bench", SCRIPT)
    plot_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_bench)

    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        # Untied: the token embedding is a lookup, the output matrix the LM head; 1-D norms
        # are not matmuls. Matmul parameters: 100 x 64 + 64 x 64 + 128 x 64 = 18,688.
        model = scratch / "model.gguf"
        write_gguf(model, [("token_embd.weight", [64, 100], 8), ("output.weight", [64, 100], 8),
                           ("blk.0.attn_norm.weight", [64], 0),
                           ("blk.0.attn_q.weight", [64, 64], 8),
                           ("blk.0.ffn_up.weight", [64, 128], 1)])
        described = plot_bench.describe_model(str(model))
        expect(described["matmul_parameters"] == 18688,
               f"matmul parameters of the untied model: {described['matmul_parameters']}")
        expect(described["parameters"] == 18688 + 6400 + 64, "all parameters")
        expect(described["dtype"] == "q8_0", f"dominant type: {described['dtype']}")
        tied = scratch / "tied.gguf"
        write_gguf(tied, [("token_embd.weight", [64, 100], 0), ("blk.0.attn_q.weight", [64, 64], 0)])
        expect(plot_bench.describe_model(str(tied))["matmul_parameters"] == 6400 + 4096,
               "a tied embedding counts once, as the LM head")

        # A bench-scaling.sh directory whose model.txt names the GGUF above.
        series = scratch / "scaling"
        shutil.copytree(DATA / "scaling", series)
        (series / "model.txt").write_text(str(model) + "\n")
        out = scratch / "plots"
        result = run(["-o", str(out), f"q8_0={series}", f"f16={DATA / 'f16-c1.json'}"])
        expect(result.returncode == 0, f"exit 0 with every field: {result.stderr}")
        for name in ("scaling.png", "roofline.png", "profile.png"):
            expect_png(out / name)
        # Concurrency 1: median of 50 and 54 tokens/s; the int8 peak on 2 threads is the best
        # repetition divided by its cpu_busy, 0.002 / 0.5 GOPS (the aggregate row is ignored).
        expected = 52.0 * 2 * 18688 / (0.002e9 / 0.5)
        expect(table_fraction(result.stdout, "q8_0", 1) == f"{expected:.3g}",
               f"q8_0 fraction at 1: {table_fraction(result.stdout, 'q8_0', 1)} != {expected:.3g}")
        expected = 150.0 * 2 * 18688 / (0.002e9 / 0.5)
        expect(table_fraction(result.stdout, "q8_0", 4) == f"{expected:.3g}", "q8_0 fraction at 4")
        expect(table_fraction(result.stdout, "f16", 1) == "n/a",
               "no fraction without a model or a peak")
        # The roofline bar comes from the report that measured the read bandwidth.
        expect("roofline q8_0 c=1: fraction 0.64 " in result.stderr,
               f"q8_0 roofline from the measured report: {result.stderr}")

        # --params, --dtype and --peak instead of a GGUF; the measured basis takes the
        # wall-clock figure (0.0015 GFLOP/s on 2 threads).
        result = run(["-o", str(out / "measured"), "--params", "1000", "--dtype", "f16",
                      "--peak", str(series / "peak.json"), "--peak-basis", "measured",
                      f"f16={DATA / 'f16-c1.json'}"])
        expected = 60.0 * 2 * 1000 / 0.0015e9
        expect(table_fraction(result.stdout, "f16", 1) == f"{expected:.3g}",
               f"f16 fraction from --params: {table_fraction(result.stdout, 'f16', 1)}")

        # Inputs with one label are one series: the report at concurrency 8 joins the
        # directory's points and takes its peak and model.
        result = run(["-o", str(out / "merged"), f"q8_0={series}", f"q8_0={DATA / 'no-fields.json'}"])
        expected = 300.0 * 2 * 18688 / (0.002e9 / 0.5)
        expect(table_fraction(result.stdout, "q8_0", 8) == f"{expected:.3g}",
               f"merged series at 8: {table_fraction(result.stdout, 'q8_0', 8)}")
        expect(table_fraction(result.stdout, "no-fields", 8) is None, "no separate series")

        # Reports from before the roofline and profile fields, and with them null (no model
        # engine): the scaling plot only.
        out = scratch / "old"
        result = run(["-o", str(out), str(DATA / "no-fields.json"), str(DATA / "null-fields.json")])
        expect(result.returncode == 0, f"exit 0 without the fields: {result.stderr}")
        expect_png(out / "scaling.png")
        for name in ("roofline", "profile"):
            expect(not (out / f"{name}.png").exists(), f"no {name}.png without its field")
            expect(f"{name}.png skipped" in result.stderr, f"{name}.png skip message")

    if failures:
        print(f"{len(failures)} failure(s)", file=sys.stderr)
        return 1
    print("plot-bench: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
