"""Copies of a model with its matrices rounded the way GGUF stores them, so the perplexity of
the f16 and q8_0 files can be predicted in PyTorch. Norm weights stay float32 (Folio and
llama.cpp keep 1-D tensors in f32)."""
import copy

import torch


def round_f16(matrix):
    return matrix.to(torch.float16).to(matrix.dtype)


def round_q8_0(matrix):
    """ggml's q8_0: blocks of 32 along a row; d = max|x| / 127 stored as f16; q = round(x / d)
    (half away from zero, as ggml's roundf) in [-127, 127]; value = q * f16(d)."""
    rows, columns = matrix.shape
    blocks = matrix.float().reshape(rows, columns // 32, 32)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 127.0
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    scaled = blocks * inverse
    quantized = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    stored_scale = scale.to(torch.float16).float()
    return (quantized * stored_scale).reshape(rows, columns).to(matrix.dtype)


def variant(model, transform, dtype):
    """A copy of `model` in `dtype`, with `transform` (or nothing) applied to every matrix."""
    result = copy.deepcopy(model).to(dtype)
    if transform is not None:
        with torch.no_grad():
            for parameter in result.parameters():
                if parameter.dim() == 2:
                    parameter.copy_(transform(parameter))
    return result
