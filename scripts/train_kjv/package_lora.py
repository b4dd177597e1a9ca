#!/usr/bin/python3
"""Turns finished adapter runs (train_lora.py's OUT directory, one run per part) into the
shipped adapter files:

  models/lora/kjv-PART-heldout.txt   each part's held-out text (never trained on by its adapter)
  models/lora/kjv-lora.json          the training-time records (per adapter: data, split, rank,
                                     alpha, steps, held-out perplexities of base and adapter,
                                     held-out token count and hash, golden greedy tokens)
  models/lora/kjv-PART-f16.gguf      with --folio: the adapter as a llama.cpp LoRA GGUF, via
                                     `folio make-adapter -m BASE --from-weights OUT/kjv-PART
                                     --dtype f16 -o FILE`
Without --folio only the text and the record are written (and the commands are printed).
Usage: /usr/bin/python3 scripts/train_kjv/package_lora.py OUT_DIR [--folio BINARY] [REPO_ROOT]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import lora  # noqa: E402

BASE = "models/demo/kjv-f16.gguf"
DTYPE = "f16"
# Run-record keys copied into the shipped record as they are.
COPIED = ("part", "books", "heldout_rule", "heldout_chapters", "heldout_chapters_in_base_split",
          "training_chapters", "training_chapters_in_base_split", "rank", "alpha", "scale",
          "targets", "adapted_matrices", "trainable_parameters")


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("root", nargs="?", default=os.getcwd())
    parser.add_argument("--folio", help="a `folio` with make-adapter: also write the GGUFs")
    return parser.parse_args()


def shipped_record(run, out_dir, gguf):
    """The record of one adapter in models/lora/kjv-lora.json, from its run record."""
    name = run["name"]
    arguments = run["arguments"]
    record = {"name": name, "heldout_text": f"models/lora/{name}-heldout.txt"}
    if gguf is not None:
        record["file"] = gguf
    record |= {key: run[key] for key in COPIED}
    record["interchange"] = {"directory": os.path.join(out_dir, name), "format": lora.FORMAT}
    record["training"] = {
        "steps": run["steps"], "epochs": run["epochs"], "batch_size": arguments["batch_size"],
        "context": arguments["context"], "tokens_seen": run["tokens_seen"],
        "training_tokens": run["training_tokens"], "learning_rate": arguments["learning_rate"],
        "warmup_steps": arguments["warmup_steps"], "schedule": "linear warm-up, cosine decay to "
        "a tenth", "optimizer": "AdamW betas 0.9/0.95, no weight decay, gradient clipping 1.0",
        "seed": arguments["seed"], "threads": run["threads"],
        "training_seconds": run["training_seconds"], "torch_version": run["torch_version"],
        "final_train_loss": run["curve"]["train_loss"][-1], "curve": run["curve"]}
    record["tokenization"] = {"heldout_characters": run["heldout_characters"],
                              "heldout_ids": run["heldout_ids"],
                              "heldout_ids_fnv1a64": run["heldout_ids_fnv1a64"]}
    record["perplexity"] = {"text": record["heldout_text"]} | run["perplexity"]
    record["perplexity_chapters_in_base_split"] = run["perplexity_chapters_in_base_split"]
    record["perplexity_base_heldout_text"] = run["perplexity_base_heldout_text"]
    record["golden_generation"] = run["golden_generation"]
    return record


def main():
    arguments = parse_arguments()
    out_dir, root = arguments.out_dir, arguments.root
    os.makedirs(os.path.join(root, "models/lora"), exist_ok=True)
    adapters = []
    commands = []
    for part in corpus.PARTS:
        name = f"kjv-{part}"
        with open(os.path.join(out_dir, name + ".json")) as handle:
            run = json.load(handle)
        shutil.copyfile(os.path.join(out_dir, name + "-heldout.txt"),
                        os.path.join(root, f"models/lora/{name}-heldout.txt"))
        gguf = f"models/lora/{name}-{DTYPE}.gguf"
        command = ["make-adapter", "-m", BASE, "--from-weights", os.path.join(out_dir, name),
                   "--dtype", DTYPE, "-o", gguf]
        commands.append(command)
        if arguments.folio:
            # Paths in the command are relative to the repository root; OUT_DIR to here.
            run_command = list(command)
            run_command[4] = os.path.abspath(run_command[4])
            subprocess.run([os.path.abspath(arguments.folio)] + run_command, check=True,
                           cwd=root)
        adapters.append(shipped_record(run, out_dir, gguf if arguments.folio else None))
    record = {
        "base": BASE,
        "perplexity_definition": "tokens = [BOS] + encode(text); windows of `context` tokens "
                                 "with `stride`, every token after BOS scored once "
                                 "(scripts/train_kjv/evaluate.py, `folio perplexity`)",
        "adapters": adapters,
    }
    with open(os.path.join(root, "models/lora/kjv-lora.json"), "w") as handle:
        json.dump(record, handle, indent=1, ensure_ascii=False)
        handle.write("\n")
    for adapter in adapters:
        ppl = adapter["perplexity"]
        print(f"{adapter['name']}: held-out perplexity base {ppl['base_float32']:.4f}, adapter "
              f"{ppl['adapter_float32']:.4f} ({ppl['scored_tokens']} tokens)")
    if not arguments.folio:
        print("no --folio: adapters not converted; once `folio make-adapter` exists, run:")
        for command in commands:
            print("  build/release/apps/folio/folio " + " ".join(command))


if __name__ == "__main__":
    main()
