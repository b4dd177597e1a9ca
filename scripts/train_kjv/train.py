#!/usr/bin/python3
"""Trains Folio's demo model: a small Llama on the King James Bible (see models/README.md).

Stages (all deterministic for a given --seed and --threads):
  1. corpus.py: extract the text with `bible`, hold out every 20th chapter;
  2. tokenizer.py: train the SentencePiece BPE vocabulary on the training verses;
  3. train for --steps steps of --batch-size windows of context_length + 1 tokens drawn
     uniformly from [BOS] + encode(training text), AdamW with linear warm-up and cosine decay;
  4. write OUT/weights (export.py interchange, for `folio make-model --from-weights`),
     OUT/results.json (loss curve, timings, held-out perplexities of the final weights evaluated
     in float32, float64 and with the matrices rounded to f16 and q8_0), OUT/loss.png.
Usage: /usr/bin/python3 scripts/train_kjv/train.py --out-dir out/train_kjv --steps N
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
import export  # noqa: E402
import model as llama_model  # noqa: E402
import rounding  # noqa: E402
import tokenizer as spm  # noqa: E402


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="out/train_kjv")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=20240611)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--ffn-size", type=int, default=704)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--name", default="folio-kjv")
    parser.add_argument("--skip-final-eval", action="store_true",
                        help="smoke runs: skip the full held-out perplexities")
    return parser.parse_args()


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def learning_rate(step, arguments):
    """Linear warm-up to the peak, then cosine decay to a tenth of it at the last step."""
    if step < arguments.warmup_steps:
        return arguments.learning_rate * (step + 1) / arguments.warmup_steps
    progress = (step - arguments.warmup_steps) / max(1, arguments.steps - arguments.warmup_steps)
    return arguments.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, arguments):
    matrices = [p for p in model.parameters() if p.dim() == 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": arguments.weight_decay},
                              {"params": vectors, "weight_decay": 0.0}],
                             lr=arguments.learning_rate, betas=(0.9, 0.95), eps=1e-8)


@torch.no_grad()
def heldout_loss(model, heldout_ids, context, windows=16):
    """Mean loss over the first `windows` non-overlapping windows of the held-out stream."""
    rows = [heldout_ids[i * context:(i + 1) * context + 1] for i in range(windows)]
    batch = torch.stack(rows)
    logits = model(batch[:, :-1])
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   batch[:, 1:].reshape(-1)))


def train(model, train_ids, heldout_ids, arguments, out_dir, optimizer=None,
          measure_heldout=None):
    """Trains `model` in place on random windows of train_ids; returns (curve, seconds).
    optimizer: default make_optimizer(model, arguments) (train_lora.py passes one over the
    adapter's matrices only); measure_heldout(model) -> held-out loss at each evaluation:
    default heldout_loss over the first 16 windows of heldout_ids."""
    generator = torch.Generator().manual_seed(arguments.seed + 1)
    if optimizer is None:
        optimizer = make_optimizer(model, arguments)
    if measure_heldout is None:
        def measure_heldout(model):
            return heldout_loss(model, heldout_ids, arguments.context)
    context = arguments.context
    curve = {"step": [], "train_loss": [], "eval_step": [], "heldout_loss": []}
    start = time.time()
    running = []
    for step in range(arguments.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, arguments)
        starts = torch.randint(0, len(train_ids) - context - 1, (arguments.batch_size,),
                               generator=generator)
        batch = torch.stack([train_ids[s:s + context + 1] for s in starts.tolist()])
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running.append(float(loss))
        if (step + 1) % 10 == 0 or step + 1 == arguments.steps:
            curve["step"].append(step + 1)
            curve["train_loss"].append(sum(running) / len(running))
            elapsed = time.time() - start
            log(f"step {step + 1}/{arguments.steps} loss {curve['train_loss'][-1]:.4f} "
                f"lr {learning_rate(step, arguments):.2e} elapsed {elapsed:.0f}s "
                f"({elapsed / (step + 1):.3f} s/step)")
            running = []
        if (step + 1) % arguments.eval_every == 0 or step + 1 == arguments.steps:
            curve["eval_step"].append(step + 1)
            curve["heldout_loss"].append(measure_heldout(model))
            log(f"step {step + 1} held-out loss {curve['heldout_loss'][-1]:.4f}")
            torch.save({"model": model.state_dict(), "curve": curve, "step": step + 1},
                       os.path.join(out_dir, "checkpoint.pt"))
    return curve, time.time() - start


def plot_curve(curve, tokens_per_step, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(7, 4), dpi=100)
    axes.plot(curve["step"], curve["train_loss"], label="training loss (mean of 10 steps)")
    axes.plot(curve["eval_step"], curve["heldout_loss"], "o-", label="held-out loss (16 windows)")
    axes.set_xlabel(f"step ({tokens_per_step} tokens each)")
    axes.set_ylabel("cross-entropy (nats / token)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


def final_perplexities(model, heldout_tokens, context):
    """Held-out perplexity of the final weights in several numeric forms."""
    results = {}
    for label, transform, dtype in (("float32", None, torch.float32),
                                    ("float64", None, torch.float64),
                                    ("f16_weights_float32", rounding.round_f16, torch.float32),
                                    ("q8_0_weights_float32", rounding.round_q8_0, torch.float32)):
        variant = rounding.variant(model, transform, dtype)
        begin = time.time()
        value, scored = evaluate.perplexity(variant, heldout_tokens, context)
        results[label] = value
        log(f"held-out perplexity ({label}): {value:.6f} over {scored} tokens "
            f"({time.time() - begin:.0f}s)")
    results["scored_tokens"] = scored
    return results


def main():
    arguments = parse_arguments()
    torch.manual_seed(arguments.seed)
    torch.set_num_threads(arguments.threads)
    out_dir = arguments.out_dir
    os.makedirs(out_dir, exist_ok=True)

    train_text, heldout_text = corpus.split_corpus(corpus.read_verses())
    for name, text in (("train.txt", train_text), ("heldout.txt", heldout_text)):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as handle:
            handle.write(text)
    processor = spm.train_tokenizer(train_text, arguments.vocab_size,
                                    os.path.join(out_dir, "tokenizer"))
    train_ids = torch.tensor(spm.encode_document(processor, train_text), dtype=torch.long)
    heldout_tokens = spm.encode_document(processor, heldout_text)
    if processor.decode(heldout_tokens[1:]) != heldout_text:
        raise RuntimeError("sentencepiece does not round-trip the held-out text")
    log(f"corpus: {len(train_text)} training characters -> {len(train_ids)} tokens; held-out "
        f"{len(heldout_text)} characters -> {len(heldout_tokens)} tokens")

    shape = llama_model.Shape(arguments.vocab_size, arguments.hidden_size, arguments.layers,
                              arguments.heads, arguments.kv_heads, arguments.ffn_size,
                              arguments.context)
    model = llama_model.Llama(shape)
    model.initialize(torch.Generator().manual_seed(arguments.seed))
    parameters = sum(p.numel() for p in model.parameters())
    log(f"model {shape.as_dict()}: {parameters} parameters")

    heldout_ids = torch.tensor(heldout_tokens, dtype=torch.long)
    curve, seconds = train(model, train_ids, heldout_ids, arguments, out_dir)
    tokens_per_step = arguments.batch_size * arguments.context
    results = {
        "name": arguments.name, "shape": shape.as_dict(), "parameters": parameters,
        "arguments": vars(arguments), "torch_version": torch.__version__,
        "training_seconds": seconds, "steps": arguments.steps,
        "tokens_seen": arguments.steps * tokens_per_step,
        "training_tokens": len(train_ids), "heldout_tokens": len(heldout_tokens),
        "final_train_loss": curve["train_loss"][-1], "curve": curve,
    }
    torch.save(model.state_dict(), os.path.join(out_dir, "final.pt"))
    export.export_weights(os.path.join(out_dir, "weights"), model, processor, arguments.name)
    plot_curve(curve, tokens_per_step, os.path.join(out_dir, "loss.png"),
               f"{arguments.name}: {parameters / 1e6:.1f}M parameters, "
               f"{arguments.steps} steps, {seconds / 60:.0f} min on {arguments.threads} threads")
    if not arguments.skip_final_eval:
        results["heldout_perplexity"] = final_perplexities(model, heldout_tokens,
                                                           arguments.context)
    with open(os.path.join(out_dir, "results.json"), "w") as handle:
        json.dump(results, handle, indent=1)
    log("done")


if __name__ == "__main__":
    main()
