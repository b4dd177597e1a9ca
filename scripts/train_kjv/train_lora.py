#!/usr/bin/python3
"""Trains a LoRA adapter of the shipped demo model on one part of the corpus (see lora.py and
the "LoRA adapters" section of models/README.md).

Stages (all deterministic for a given --seed and --threads):
  1. read the base weights and vocabulary from --base (models/demo/kjv-f16.gguf);
  2. corpus.py: the verses; the tokenizer is retrained exactly as train.py trained it (on the
     base model's training text) and must reproduce the GGUF's vocabulary piece for piece, so
     sentencepiece gives the ids the engine gives (models/README.md, "Tokenizer");
  3. corpus.split_part: the part's verses, every 10th chapter of the Bible held out (which
     includes the base split's every 20th);
  4. train the adapter (rank --rank, alpha --alpha, lora.TARGETS of every layer; base frozen)
     with train.train: --steps steps (default: --epochs 4 of the part's training tokens) of
     --batch-size windows of context + 1 tokens drawn uniformly from [BOS] + encode(part
     training text), AdamW, linear warm-up and cosine decay;
  5. held-out perplexities (evaluate.py, `folio perplexity`'s definition) of the base and of
     the adapted model on the part's held-out text and on its chapters the base never saw
     either; of the adapted model on the base's held-out text (models/kjv-heldout.txt);
  6. greedy tokens from package.PROMPT (golden tokens for engine tests);
  7. write OUT/NAME/ (lora.py's interchange format, for `folio make-adapter --from-weights`),
     OUT/NAME.json (the records package_lora.py collects), OUT/NAME-heldout.txt.
Usage: /usr/bin/python3 scripts/train_kjv/train_lora.py --part psalms --out-dir out/lora
"""
import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import evaluate  # noqa: E402
import lora  # noqa: E402
import model as llama_model  # noqa: E402
import package  # noqa: E402
import rounding  # noqa: E402
import tokenizer as spm  # noqa: E402
import train  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
log = train.log


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", required=True, choices=sorted(corpus.PARTS))
    parser.add_argument("--base", default=os.path.join(REPO, "models/demo/kjv-f16.gguf"))
    parser.add_argument("--base-record", default=os.path.join(REPO, "models/kjv.json"),
                        help="the base's records: its held-out tokenization is checked")
    parser.add_argument("--out-dir", default="out/lora")
    parser.add_argument("--name", help="default kjv-PART")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, help="default: the rank (scale alpha / rank = 1)")
    parser.add_argument("--epochs", type=float, default=4.0,
                        help="sets --steps: epochs of the part's training tokens")
    parser.add_argument("--steps", type=int, help="overrides --epochs")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--warmup-steps", type=int, help="default: a tenth of the steps")
    parser.add_argument("--seed", type=int, default=20240612)
    # One thread: on the 2 shared cores of the machine the adapters were trained on, two
    # OpenBLAS threads were 3x slower per step than one while other builds ran.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-every", type=int, help="default: a quarter of the steps")
    arguments = parser.parse_args()
    arguments.name = arguments.name or f"kjv-{arguments.part}"
    arguments.alpha = float(arguments.rank) if arguments.alpha is None else arguments.alpha
    arguments.context = None  # set from the base's shape (train.train reads it)
    return arguments


def matching_tokenizer(vocabulary, train_text, model_prefix):
    """train.py's tokenizer, retrained on the base's training text; refuses one whose
    (piece, score, type) differ in any entry from the GGUF's vocabulary."""
    processor = spm.train_tokenizer(train_text, len(vocabulary), model_prefix)
    if spm.vocabulary_entries(processor) != vocabulary:
        raise RuntimeError("the retrained tokenizer differs from the base GGUF's vocabulary")
    return processor


def encode(processor, text):
    """[BOS] + ids, after checking that the ids decode back to the text."""
    tokens = spm.encode_document(processor, text)
    if processor.decode(tokens[1:]) != text:
        raise RuntimeError("sentencepiece does not round-trip the text")
    return tokens


def perplexities(models, tokens, context):
    """{label: perplexity} of each (label, model) on tokens, plus the scored token count."""
    results = {}
    for label, model in models:
        begin = time.time()
        value, scored = evaluate.perplexity(model, tokens, context)
        results[label] = value
        log(f"  {label}: {value:.6f} over {scored} tokens ({time.time() - begin:.0f}s)")
    results["scored_tokens"] = scored
    return results


def main():
    arguments = parse_arguments()
    torch.manual_seed(arguments.seed)
    torch.set_num_threads(arguments.threads)
    out_dir = arguments.out_dir
    os.makedirs(out_dir, exist_ok=True)

    shape, base_tensors, vocabulary = lora.read_base(arguments.base)
    context = arguments.context = shape.context_length
    verses = corpus.read_book_verses()
    base_train_text, base_heldout_text = corpus.split_corpus(
        [(verse.chapter_index, verse.text) for verse in verses])
    processor = matching_tokenizer(vocabulary, base_train_text,
                                   os.path.join(out_dir, "tokenizer"))
    base_heldout_tokens = encode(processor, base_heldout_text)
    with open(arguments.base_record) as handle:
        base_record = json.load(handle)
    expected = base_record["tokenization"]
    if (len(base_heldout_tokens) - 1 != expected["heldout_ids"] or
            package.fnv1a64_ids(base_heldout_tokens[1:]) != expected["heldout_ids_fnv1a64"]):
        raise RuntimeError("the base's held-out text does not tokenize as its record says")

    train_text, heldout_text, train_chapters, heldout_chapters = corpus.split_part(
        verses, arguments.part)
    unseen_chapters = [c for c in heldout_chapters if corpus.is_heldout(c[2])]
    unseen_text = "".join(verse.text + "\n" for verse in verses
                          if corpus.is_heldout(verse.chapter_index)
                          and verse.book in corpus.PARTS[arguments.part])
    train_ids = torch.tensor(encode(processor, train_text), dtype=torch.long)
    tokens_per_step = arguments.batch_size * context
    if arguments.steps is None:
        arguments.steps = max(1, round(arguments.epochs * len(train_ids) / tokens_per_step))
    if arguments.warmup_steps is None:
        arguments.warmup_steps = max(1, arguments.steps // 10)
    if arguments.eval_every is None:
        arguments.eval_every = max(1, arguments.steps // 4)
    heldout_tokens = encode(processor, heldout_text)
    unseen_tokens = encode(processor, unseen_text)
    with open(os.path.join(out_dir, arguments.name + "-heldout.txt"), "w",
              encoding="utf-8") as handle:
        handle.write(heldout_text)
    log(f"{arguments.part}: {len(train_chapters)} training chapters, {len(train_text)} "
        f"characters -> {len(train_ids)} tokens; held out {len(heldout_chapters)} chapters "
        f"({len(unseen_chapters)} also in the base's split), {len(heldout_text)} characters "
        f"-> {len(heldout_tokens)} tokens")

    base = llama_model.Llama(shape)
    with torch.no_grad():
        for name, parameter in base.gguf_tensors().items():
            parameter.copy_(base_tensors[name])
    model = lora.LoraLlama(shape, arguments.rank, arguments.alpha)
    model.load_base(base_tensors)
    model.initialize_adapter(torch.Generator().manual_seed(arguments.seed))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(f"adapter: rank {arguments.rank}, alpha {arguments.alpha}, {len(model.adapted)} "
        f"matrices, {trainable} parameters")

    log("base model, part held-out text:")
    heldout = perplexities([("base_float32", base)], heldout_tokens, context)

    # Only the adapter trains: AdamW without weight decay (B starts at zero), base frozen.
    optimizer = torch.optim.AdamW(model.adapter.parameters(), lr=arguments.learning_rate,
                                  betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)

    def measure_heldout(current):
        """Mean NLL over the whole part held-out text (log of its perplexity)."""
        return math.log(evaluate.perplexity(current, heldout_tokens, context)[0])

    curve, seconds = train.train(model, train_ids, None, arguments, out_dir, optimizer,
                                 measure_heldout)
    os.remove(os.path.join(out_dir, "checkpoint.pt"))  # train.train's; the adapter is below
    lora.export_adapter(os.path.join(out_dir, arguments.name), model, arguments.name)

    f16_adapter = rounding.variant(model, rounding.round_f16, torch.float32)
    # adapter_f16_float32: A and B rounded to f16, as `make-adapter --dtype f16` stores them
    # (the base matrices are f16 already): the figure the engine's should match.
    adapted_models = [("adapter_float32", model),
                      ("adapter_float64", rounding.variant(model, None, torch.float64)),
                      ("adapter_f16_float32", f16_adapter)]
    log("adapted model, part held-out text:")
    heldout |= perplexities(adapted_models, heldout_tokens, context)
    log("part held-out chapters that are also in the base's split:")
    unseen = perplexities([("base_float32", base), ("adapter_float32", model)], unseen_tokens,
                          context)
    log("the base's held-out text (models/kjv-heldout.txt):")
    whole = perplexities([("adapter_float32", model)], base_heldout_tokens, context)
    # The base's figure (its f16 matrices, float32) was measured when it was trained.
    whole["base_float32"] = base_record["perplexity"]["f16_weights_float32"]

    # Golden greedy tokens, as package.py records the base's: the adapter's matrices rounded
    # to f16 (what `make-adapter --dtype f16` stores), float64.
    prompt_ids = spm.encode_document(processor, package.PROMPT)
    golden, gap = package.greedy(rounding.variant(model, rounding.round_f16, torch.float64),
                                 prompt_ids, package.GOLDEN_TOKENS)
    log(f"greedy: {package.PROMPT + processor.decode(golden)!r}")

    def chapter_names(chapters):
        return [f"{book} {chapter}" for book, chapter, _ in chapters]

    results = {
        "name": arguments.name, "part": arguments.part,
        "books": list(corpus.PARTS[arguments.part].values()),
        "heldout_rule": f"chapters whose canonical index (Genesis 1 = 0) is "
                        f"{corpus.PART_HELDOUT_PHASE} mod {corpus.PART_HELDOUT_EVERY}: every "
                        f"{corpus.PART_HELDOUT_EVERY}th chapter of the Bible; includes every "
                        f"chapter of the base's split (index {corpus.HELDOUT_PHASE} mod "
                        f"{corpus.HELDOUT_EVERY}) in the part",
        "heldout_chapters": chapter_names(heldout_chapters),
        "heldout_chapters_in_base_split": chapter_names(unseen_chapters),
        "training_chapters": len(train_chapters),
        "training_chapters_in_base_split": 0,  # corpus.split_part guarantees it
        "base": os.path.relpath(os.path.abspath(arguments.base), REPO),
        "rank": arguments.rank, "alpha": arguments.alpha, "scale": arguments.alpha /
        arguments.rank, "targets": list(lora.TARGETS), "adapted_matrices": len(model.adapted),
        "trainable_parameters": trainable,
        "arguments": {key: value for key, value in vars(arguments).items()
                      if key not in ("base", "base_record")},
        "torch_version": torch.__version__, "threads": arguments.threads,
        "training_seconds": seconds, "steps": arguments.steps,
        "tokens_seen": arguments.steps * tokens_per_step, "training_tokens": len(train_ids),
        "epochs": arguments.steps * tokens_per_step / len(train_ids),
        "heldout_characters": len(heldout_text),
        "heldout_ids": len(heldout_tokens) - 1,
        "heldout_ids_fnv1a64": package.fnv1a64_ids(heldout_tokens[1:]),
        "perplexity": {"context": context, "stride": context // 2} | heldout,
        "perplexity_chapters_in_base_split": {
            "chapters": chapter_names(unseen_chapters), "ids": len(unseen_tokens) - 1,
            "context": context, "stride": context // 2} | unseen,
        "perplexity_base_heldout_text": {"text": "models/kjv-heldout.txt", "context": context,
                                         "stride": context // 2} | whole,
        "golden_generation": {"prompt": package.PROMPT, "prompt_ids": prompt_ids,
                              "max_tokens": package.GOLDEN_TOKENS, "tokens": golden,
                              "weights": "base f16 + f16-rounded adapter, float64 PyTorch",
                              "smallest_top2_logit_gap": gap,
                              "text": processor.decode(golden)},
        "curve": curve,
    }
    with open(os.path.join(out_dir, arguments.name + ".json"), "w") as handle:
        json.dump(results, handle, indent=1)
        handle.write("\n")
    log(f"done: {arguments.name} base {heldout['base_float32']:.4f} -> adapter "
        f"{heldout['adapter_float32']:.4f} in {seconds:.0f}s of training")


if __name__ == "__main__":
    main()
