"""Sliding-window perplexity, defined exactly as `folio perplexity` computes it.

tokens = [BOS] + encode(whole text). With context C and stride S (default C / 2): for
begin = 0, S, 2S, ... while begin + 1 < N: end = min(begin + C, N); the model sees tokens
[begin, end) as one sequence; positions p in [max(begin + 1, previous end), end) are scored with
-log softmax(logits at p - 1)[token p]; previous end = end; stop once end == N.
Perplexity = exp(mean negative log-likelihood over all scored tokens).
"""
import math

import torch


def windows(count, context, stride):
    """[(begin, end, first scored position)] of the definition above."""
    result = []
    previous_end = 0
    begin = 0
    while begin + 1 < count:
        end = min(begin + context, count)
        result.append((begin, end, max(begin + 1, previous_end)))
        previous_end = end
        if end == count:
            break
        begin += stride
    return result


@torch.no_grad()
def perplexity(model, tokens, context, stride=None, batch_size=16):
    """Returns (perplexity, scored token count). Runs in the model's parameter dtype."""
    stride = stride or context // 2
    ids = torch.tensor(tokens, dtype=torch.long)
    spans = windows(len(tokens), context, stride)
    total = 0.0
    scored = 0
    for start in range(0, len(spans), batch_size):
        group = spans[start:start + batch_size]
        # Windows of equal length run as one batch (all but possibly the last are full).
        by_length = {}
        for span in group:
            by_length.setdefault(span[1] - span[0], []).append(span)
        for length, same in by_length.items():
            batch = torch.stack([ids[begin:end] for begin, end, _ in same])
            log_probabilities = torch.log_softmax(model(batch), dim=-1)
            for row, (begin, end, first) in enumerate(same):
                positions = torch.arange(first, end)
                predicted = log_probabilities[row, positions - 1 - begin, ids[positions]]
                total -= float(predicted.double().sum())
                scored += len(positions)
    return math.exp(total / scored), scored
