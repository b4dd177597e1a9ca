#!/usr/bin/python3
"""Turns a finished training run (train.py's OUT directory) into the shipped model:

  models/demo/kjv-f16.gguf, models/demo/kjv-q8_0.gguf   via `folio make-model --from-weights`
  models/kjv-heldout.txt                                 the held-out text (never trained on)
  models/kjv-loss.png                                    the loss curve
  models/kjv.json                                        the training-time records the tests
                                                         (tests/model/shipped_model_test.cc and
                                                         the perplexity tests) compare against
Usage: /usr/bin/python3 scripts/train_kjv/package.py OUT_DIR FOLIO_BINARY [REPO_ROOT]
"""
import json
import os
import shutil
import subprocess
import sys

import sentencepiece
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evaluate  # noqa: E402
import model as llama_model  # noqa: E402
import rounding  # noqa: E402
import tokenizer as spm  # noqa: E402

PROMPT = "And God said"
GOLDEN_TOKENS = 32
# The engine tests evaluate the first EXCERPT_LINES lines of the held-out text (the whole text
# takes too long for a unit test on 2 cores); its PyTorch perplexities are recorded too.
EXCERPT_LINES = 120
FILES = {"f16": "models/demo/kjv-f16.gguf", "q8_0": "models/demo/kjv-q8_0.gguf"}


def fnv1a64_ids(ids):
    """FNV-1a 64 over the ids as little-endian int32 (as the C++ test hashes them)."""
    value = 0xcbf29ce484222325
    for token in ids:
        for byte in int(token).to_bytes(4, "little", signed=True):
            value = ((value ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


@torch.no_grad()
def greedy(model, prompt_ids, count):
    """Greedy continuation (full forward each step) and the smallest top-1 / top-2 logit gap."""
    ids = list(prompt_ids)
    smallest_gap = float("inf")
    for _ in range(count):
        logits = model(torch.tensor([ids]))[0, -1]
        top = torch.topk(logits, 2)
        smallest_gap = min(smallest_gap, float(top.values[0] - top.values[1]))
        ids.append(int(top.indices[0]))
    return ids[len(prompt_ids):], smallest_gap


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    out_dir, folio = sys.argv[1], sys.argv[2]
    root = sys.argv[3] if len(sys.argv) == 4 else os.getcwd()
    with open(os.path.join(out_dir, "results.json")) as handle:
        results = json.load(handle)
    for dtype, relative in FILES.items():
        target = os.path.join(root, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        subprocess.run([folio, "make-model", "--from-weights", os.path.join(out_dir, "weights"),
                        "--dtype", dtype, "-o", target], check=True)
    shutil.copyfile(os.path.join(out_dir, "heldout.txt"),
                    os.path.join(root, "models/kjv-heldout.txt"))
    shutil.copyfile(os.path.join(out_dir, "loss.png"), os.path.join(root, "models/kjv-loss.png"))

    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(out_dir, "tokenizer.model"))
    with open(os.path.join(out_dir, "heldout.txt"), encoding="utf-8") as handle:
        heldout_text = handle.read()
    heldout_ids = processor.encode(heldout_text)
    excerpt = "".join(heldout_text.splitlines(keepends=True)[:EXCERPT_LINES])
    shape = llama_model.Shape(**results["shape"])
    model = llama_model.Llama(shape)
    model.load_state_dict(torch.load(os.path.join(out_dir, "final.pt")))
    f16_model = rounding.variant(model, rounding.round_f16, torch.float64)
    prompt_ids = spm.encode_document(processor, PROMPT)
    tokens, gap = greedy(f16_model, prompt_ids, GOLDEN_TOKENS)
    excerpt_tokens = spm.encode_document(processor, excerpt)
    excerpt_record = {"lines": EXCERPT_LINES, "characters": len(excerpt),
                      "context": shape.context_length, "stride": shape.context_length // 2}
    for label, transform, dtype in (("float32", None, torch.float32),
                                    ("float64", None, torch.float64),
                                    ("f16_weights_float32", rounding.round_f16, torch.float32),
                                    ("q8_0_weights_float32", rounding.round_q8_0, torch.float32)):
        value, scored = evaluate.perplexity(rounding.variant(model, transform, dtype),
                                            excerpt_tokens, shape.context_length)
        excerpt_record[label] = value
    excerpt_record["scored_tokens"] = scored

    record = {
        "name": results["name"], "files": FILES, "heldout_text": "models/kjv-heldout.txt",
        "shape": results["shape"], "parameters": results["parameters"],
        "rope_theta": llama_model.ROPE_THETA, "rms_norm_epsilon": llama_model.RMS_NORM_EPSILON,
        "training": {key: results[key] for key in (
            "steps", "tokens_seen", "training_tokens", "training_seconds", "final_train_loss",
            "torch_version")} | {"arguments": results["arguments"],
                                  "final_heldout_loss_16_windows": results["curve"]["heldout_loss"][-1]},
        "tokenization": {"heldout_ids": len(heldout_ids),
                         "heldout_ids_fnv1a64": fnv1a64_ids(heldout_ids)},
        "perplexity": {"text": "models/kjv-heldout.txt", "context": shape.context_length,
                       "stride": shape.context_length // 2} | results["heldout_perplexity"],
        "perplexity_excerpt": excerpt_record,
        "golden_generation": {"prompt": PROMPT, "prompt_ids": prompt_ids,
                              "max_tokens": GOLDEN_TOKENS, "tokens": tokens,
                              "weights": "f16-rounded, float64 PyTorch",
                              "smallest_top2_logit_gap": gap,
                              "text": processor.decode(tokens)},
    }
    with open(os.path.join(root, "models/kjv.json"), "w") as handle:
        json.dump(record, handle, indent=1, ensure_ascii=False)
        handle.write("\n")
    print(json.dumps(record["golden_generation"], indent=1))
    print(json.dumps(record["perplexity"], indent=1))
    print(json.dumps(record["perplexity_excerpt"], indent=1))


if __name__ == "__main__":
    main()
