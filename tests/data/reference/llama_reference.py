#!/usr/bin/env python3
"""Independent reference forward pass for Folio's end-to-end model tests.

Reads a GGUF file with its own parser (no code shared with Folio's C++ reader), dequantizes the
weights with numpy, and computes the Llama-family forward pass in float64 with PyTorch
(Debian's python3-torch). Gemma 2 and 3 follow llama.cpp's reading of their GGUF files: the
embedding times sqrt(hidden), RMSNorms after attention and feed-forward, GELU (tanh) gating,
soft caps c * tanh(x / c) on attention scores (gemma2, default 50) and logits (gemma2 default
30, gemma3 only when set), sliding-window layers i % 2 == 0 (gemma2, default window 4096) or
i % 6 != 5 (gemma3, whose local layers rotate with base 10000 and no RoPE scaling), softmax
scale 1 / sqrt(head_dim) (hidden / heads for the 27B models: 46 gemma2 or 62 gemma3 layers). Writes the logits of every position of every prompt as JSON, which
tests/model/ compares against the engine's logits, and, when PROMPTS.json asks, the perplexity
of a token sequence under sliding windows (tests/engine/perplexity_test.cc; the definition is in
src/folio/engine/perplexity.h and docs/notes/perplexity.md).

With --lora, the model is the base with a LoRA adapter in llama.cpp's format merged in: each
adapted projection W (n_out x n_in) becomes W + scale * B @ A, with A = <W>.lora_a ([r, n_in]
outermost first), B = <W>.lora_b ([n_out, r]), scale = SCALE * alpha / r, or SCALE when the
adapter's adapter.lora.alpha is 0 or absent (llama.cpp's rule; docs/design/lora.md). The merge
is done in float64 on the dequantized weights, which is the same function as the engine's
separate update x W^T + scale * (x A^T) B^T.

Usage:
  llama_reference.py MODEL.gguf PROMPTS.json OUT.json [--lora ADAPTER.gguf[:SCALE]]
SCALE defaults to 1.
PROMPTS.json: {"prompts": [[token ids...], ...],
               "perplexity": {"tokens": [token ids...], "windows": [[context, stride], ...]}}
"""
import json
import struct
import sys

import numpy as np
import torch

GGUF_MAGIC = b"GGUF"
# GGUF metadata value types.
(T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY,
 T_UINT64, T_INT64, T_FLOAT64) = range(13)
SCALAR_FORMATS = {T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I",
                  T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q",
                  T_FLOAT64: "<d"}
# ggml tensor types this script understands: id -> (block elements, block bytes).
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 8, 30
BLOCKS = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_BF16: (1, 2), GGML_Q8_0: (32, 34),
          GGML_Q4_0: (32, 18)}


class Reader:
    def __init__(self, data):
        self.data = data
        self.offset = 0

    def take(self, fmt):
        value = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += struct.calcsize(fmt)
        return value[0]

    def string(self):
        length = self.take("<Q")
        value = self.data[self.offset:self.offset + length].decode("utf-8", errors="replace")
        self.offset += length
        return value

    def value(self, value_type):
        if value_type == T_STRING:
            return self.string()
        if value_type == T_ARRAY:
            item_type = self.take("<I")
            count = self.take("<Q")
            return [self.value(item_type) for _ in range(count)]
        return self.take(SCALAR_FORMATS[value_type])


def read_gguf(path):
    with open(path, "rb") as handle:
        data = handle.read()
    reader = Reader(data)
    if data[:4] != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file")
    reader.offset = 4
    version = reader.take("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} not supported")
    tensor_count = reader.take("<Q")
    metadata_count = reader.take("<Q")
    metadata = {}
    for _ in range(metadata_count):
        key = reader.string()
        metadata[key] = reader.value(reader.take("<I"))
    infos = []
    for _ in range(tensor_count):
        name = reader.string()
        dims = [reader.take("<Q") for _ in range(reader.take("<I"))]
        ggml_type = reader.take("<I")
        offset = reader.take("<Q")
        infos.append((name, dims, ggml_type, offset))
    alignment = metadata.get("general.alignment", 32)
    data_start = (reader.offset + alignment - 1) // alignment * alignment
    tensors = {}
    for name, dims, ggml_type, offset in infos:
        tensors[name] = dequantize(data, data_start + offset, dims, ggml_type, name)
    return metadata, tensors


def dequantize(data, start, dims, ggml_type, name):
    """Returns float64 array of shape reversed(dims) (ggml's ne0 is the fastest dimension)."""
    if ggml_type not in BLOCKS:
        raise ValueError(f"tensor {name}: ggml type {ggml_type} not supported")
    count = int(np.prod(dims))
    block_elements, block_bytes = BLOCKS[ggml_type]
    size = count // block_elements * block_bytes
    raw = np.frombuffer(data, dtype=np.uint8, count=size, offset=start)
    if ggml_type == GGML_F32:
        values = raw.view(np.float32).astype(np.float64)
    elif ggml_type == GGML_F16:
        values = raw.view(np.float16).astype(np.float64)
    elif ggml_type == GGML_BF16:
        values = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    elif ggml_type == GGML_Q8_0:
        blocks = raw.reshape(-1, 34)
        scale = blocks[:, :2].copy().view(np.float16).astype(np.float64)
        quants = blocks[:, 2:].copy().view(np.int8).astype(np.float64)
        values = (quants * scale).reshape(-1)
    else:  # GGML_Q4_0
        blocks = raw.reshape(-1, 18)
        scale = blocks[:, :2].copy().view(np.float16).astype(np.float64)
        packed = blocks[:, 2:]
        low = (packed & 0x0F).astype(np.float64) - 8
        high = (packed >> 4).astype(np.float64) - 8
        values = (np.concatenate([low, high], axis=1) * scale).reshape(-1)
    return values.reshape(list(reversed(dims)))


def rope_inverse_frequencies(metadata, arch, head_dim, theta, tensors, scaled=True):
    """Per-pair angular frequencies (float64 [head_dim / 2]) and the magnitude of the rotation,
    after RoPE scaling: linear divides positions (here: frequencies) by the factor; llama3 is
    Hugging Face's _compute_llama3_parameters; yarn follows ggml's rope (ramp between the
    correction dimensions of beta_fast and beta_slow, mscale = attn_factor * (1 + 0.1 ln
    factor)); rope_freqs.weight divides each frequency."""
    half = head_dim // 2
    pairs = torch.arange(0, half, dtype=torch.float64)
    frequencies = theta ** (-pairs * 2 / head_dim)
    magnitude = 1.0
    key = f"{arch}.rope.scaling."
    factor = metadata.get(key + "factor", metadata.get(f"{arch}.rope.scale_linear", 0.0))
    kind = metadata.get(key + "type", "linear")
    if not scaled:
        kind, factor = "none", 1.0
    if kind == "linear" and factor not in (0.0, 1.0):
        frequencies = frequencies / factor
    elif kind == "llama3":
        low = metadata.get(key + "low_freq_factor", 1.0)
        high = metadata.get(key + "high_freq_factor", 4.0)
        context = metadata.get(key + "original_context_length", 8192)
        wavelengths = 2 * torch.pi / frequencies
        smooth = (context / wavelengths - low) / (high - low)
        blended = (1 - smooth) * frequencies / factor + smooth * frequencies
        frequencies = torch.where(wavelengths > context / low, frequencies / factor,
                                  torch.where(wavelengths < context / high, frequencies, blended))
    elif kind == "yarn":
        context = metadata.get(key + "original_context_length",
                               metadata[f"{arch}.context_length"])
        extrapolation = metadata.get(key + "yarn_ext_factor", 1.0)
        attention = metadata.get(key + "yarn_attn_factor", 1.0) * metadata.get(
            key + "attn_factor", 1.0)
        beta_fast = metadata.get(key + "yarn_beta_fast", 32.0)
        beta_slow = metadata.get(key + "yarn_beta_slow", 1.0)

        def correction(rotations):
            return head_dim * np.log(context / (rotations * 2 * np.pi)) / (2 * np.log(theta))

        low = max(0.0, np.floor(correction(beta_fast)))
        high = min(head_dim - 1.0, np.ceil(correction(beta_slow)))
        ramp = 1 - torch.clamp((pairs - low) / max(0.001, high - low), 0, 1)
        mix = ramp * extrapolation
        frequencies = frequencies / factor * (1 - mix) + frequencies * mix
        magnitude = attention * (1 + 0.1 * np.log(factor)) if extrapolation != 0 else attention
    elif kind not in ("none", "linear"):
        raise ValueError(f"rope scaling {kind} is not implemented")
    if "rope_freqs.weight" in tensors:
        frequencies = frequencies / torch.from_numpy(tensors["rope_freqs.weight"])
    return frequencies, magnitude


def rope(x, positions, frequencies, magnitude, neox):
    """x: [tokens, heads, head_dim]. Normal style rotates pairs (2i, 2i+1); NeoX (i, i+d/2)."""
    half = x.shape[-1] // 2
    angles = positions.to(torch.float64)[:, None] * frequencies[None, :]
    cos = (torch.cos(angles) * magnitude)[:, None, :]
    sin = (torch.sin(angles) * magnitude)[:, None, :]
    if neox:
        first, second = x[..., :half], x[..., half:]
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    first, second = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = first * cos - second * sin
    out[..., 1::2] = first * sin + second * cos
    return out


def rms_norm(x, weight, eps):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def forward(metadata, tensors, tokens):
    arch = metadata["general.architecture"]
    key = lambda name: metadata[f"{arch}.{name}"]
    layers = key("block_count")
    heads = key("attention.head_count")
    kv_heads = metadata.get(f"{arch}.attention.head_count_kv", heads)
    eps = key("attention.layer_norm_rms_epsilon")
    theta = metadata.get(f"{arch}.rope.freq_base", 10000.0)
    neox = arch in ("qwen2", "qwen3", "phi3", "gemma2", "gemma3")
    gemma = arch in ("gemma2", "gemma3")
    if arch == "phi3":  # fused matrices: attn_qkv rows q, k, v; ffn_up rows gate, up
        tensors = dict(tensors)
        q_width = heads * metadata.get(f"{arch}.attention.key_length",
                                       key("embedding_length") // heads)
        kv_width = (q_width // heads) * kv_heads
        ffn = key("feed_forward_length")
        for layer in range(key("block_count")):
            prefix = f"blk.{layer}."
            qkv = tensors.pop(prefix + "attn_qkv.weight")
            tensors[prefix + "attn_q.weight"] = qkv[:q_width]
            tensors[prefix + "attn_k.weight"] = qkv[q_width:q_width + kv_width]
            tensors[prefix + "attn_v.weight"] = qkv[q_width + kv_width:]
            up = tensors.pop(prefix + "ffn_up.weight")
            tensors[prefix + "ffn_gate.weight"] = up[:ffn]
            tensors[prefix + "ffn_up.weight"] = up[ffn:]
    weight = lambda name: torch.from_numpy(tensors[name])
    optional = lambda name: torch.from_numpy(tensors[name]) if name in tensors else None

    ids = torch.tensor(tokens, dtype=torch.long)
    positions = torch.arange(len(tokens))
    x = weight("token_embd.weight")[ids]
    hidden = x.shape[-1]
    if gemma:
        x = x * np.sqrt(hidden)
    head_dim = metadata.get(f"{arch}.attention.key_length", hidden // heads)
    if metadata.get(f"{arch}.attention.value_length", head_dim) != head_dim:
        raise ValueError("value_length != key_length is not implemented")
    frequencies, magnitude = rope_inverse_frequencies(metadata, arch, head_dim, theta, tensors)
    causal = torch.full((len(tokens), len(tokens)), float("-inf"), dtype=torch.float64).triu(1)
    window = metadata.get(f"{arch}.attention.sliding_window", 4096 if arch == "gemma2" else 0)
    windowed = causal
    if window > 0:  # query p sees keys (p - window, p]
        windowed = causal + torch.full_like(causal, float("-inf")).tril(-window)
    pattern = {"gemma2": 2, "gemma3": 6}.get(arch, 0)
    attention_cap = metadata.get(f"{arch}.attn_logit_softcapping", 50.0) if arch == "gemma2" else 0
    final_cap = metadata.get(f"{arch}.final_logit_softcapping",
                             30.0 if arch == "gemma2" else 0.0) if gemma else 0
    if arch == "gemma3" and f"{arch}.attn_logit_softcapping" in metadata:
        raise ValueError("gemma3 attention soft-capping is not implemented")
    scale = 1 / np.sqrt(head_dim)
    if (arch, layers) in (("gemma2", 46), ("gemma3", 62)):
        scale = 1 / np.sqrt(hidden // heads)
    for layer in range(layers):
        sliding = window > 0 and (pattern == 0 or layer % pattern < pattern - 1)
        mask = windowed if sliding else causal
        layer_frequencies, layer_magnitude = frequencies, magnitude
        if sliding and arch == "gemma3":
            layer_frequencies, layer_magnitude = rope_inverse_frequencies(
                metadata, arch, head_dim, 10000.0, tensors, scaled=False)
        prefix = f"blk.{layer}."
        h = rms_norm(x, weight(prefix + "attn_norm.weight"), eps)
        projections = []
        for name in ("attn_q", "attn_k", "attn_v"):
            y = h @ weight(prefix + name + ".weight").T
            bias = optional(prefix + name + ".bias")
            projections.append(y if bias is None else y + bias)
        q = projections[0].view(len(tokens), heads, head_dim)
        k = projections[1].view(len(tokens), kv_heads, head_dim)
        v = projections[2].view(len(tokens), kv_heads, head_dim)
        q_norm = optional(prefix + "attn_q_norm.weight")  # qwen3: per-head RMSNorm before RoPE
        if q_norm is not None:
            q = rms_norm(q, q_norm, eps)
            k = rms_norm(k, weight(prefix + "attn_k_norm.weight"), eps)
        q = rope(q, positions, layer_frequencies, layer_magnitude, neox)
        k = rope(k, positions, layer_frequencies, layer_magnitude, neox)
        group = heads // kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if attention_cap > 0:
            scores = attention_cap * torch.tanh(scores / attention_cap)
        attention = torch.einsum("hqk,khd->qhd", torch.softmax(scores + mask, dim=-1), v)
        out = attention.reshape(len(tokens), heads * head_dim) @ weight(
            prefix + "attn_output.weight").T
        if gemma:
            out = rms_norm(out, weight(prefix + "post_attention_norm.weight"), eps)
        x = x + out
        h = rms_norm(x, weight(prefix + "ffn_norm.weight"), eps)
        gate = h @ weight(prefix + "ffn_gate.weight").T
        up = h @ weight(prefix + "ffn_up.weight").T
        if gemma:
            activated = torch.nn.functional.gelu(gate, approximate="tanh") * up
        else:
            activated = torch.nn.functional.silu(gate) * up
        out = activated @ weight(prefix + "ffn_down.weight").T
        if gemma:
            out = rms_norm(out, weight(prefix + "post_ffw_norm.weight"), eps)
        x = x + out
    x = rms_norm(x, weight("output_norm.weight"), eps)
    output = optional("output.weight")
    if output is None:
        output = weight("token_embd.weight")
    logits = x @ output.T
    if final_cap > 0:
        logits = final_cap * torch.tanh(logits / final_cap)
    return logits


def perplexity(metadata, tensors, tokens, context, stride):
    """Sliding-window perplexity: windows begin at 0, stride, 2 stride, ... while begin + 1 < n;
    each runs tokens[begin:end] (end = min(begin + context, n)) from position 0 and scores the
    positions p in [max(begin + 1, previous end), end) with -log softmax(logits[p - 1])[token p];
    the window reaching n is the last."""
    n = len(tokens)
    nll_sum, num_scored, num_windows, previous_end, begin = 0.0, 0, 0, 0, 0
    while begin + 1 < n:
        end = min(begin + context, n)
        log_probs = torch.log_softmax(forward(metadata, tensors, tokens[begin:end]), dim=-1)
        for p in range(max(begin + 1, previous_end), end):
            nll_sum -= log_probs[p - 1 - begin, tokens[p]].item()
            num_scored += 1
        num_windows += 1
        previous_end = end
        if end == n:
            break
        begin += stride
    mean_nll = nll_sum / num_scored
    return {"context": context, "stride": stride, "num_windows": num_windows,
            "num_scored_tokens": num_scored, "mean_nll": mean_nll,
            "perplexity": float(np.exp(mean_nll))}


def merge_lora(metadata, tensors, adapter_path, user_scale):
    """Adds scale * B @ A to every projection the adapter targets, in place."""
    adapter_metadata, adapter_tensors = read_gguf(adapter_path)
    for key, expected in (("general.type", "adapter"), ("adapter.type", "lora"),
                          ("general.architecture", metadata["general.architecture"])):
        if adapter_metadata.get(key) != expected:
            raise ValueError(f"{adapter_path}: {key} is {adapter_metadata.get(key)!r}, "
                             f"expected {expected!r}")
    alpha = adapter_metadata.get("adapter.lora.alpha", 0.0)
    pairs = {}
    for name, values in adapter_tensors.items():
        if name.endswith("_norm.weight"):
            continue  # norm vectors: skipped, as llama.cpp does
        if not name.endswith((".lora_a", ".lora_b")):
            raise ValueError(f"{adapter_path}: tensor {name} is not a LoRA tensor")
        base_name, half = name[:-len(".lora_a")], name[-1]
        if base_name.endswith("_norm.weight"):
            continue
        pairs.setdefault(base_name, {})[half] = values
    for base_name, pair in sorted(pairs.items()):
        if base_name not in tensors or base_name == "token_embd.weight":
            raise ValueError(f"{adapter_path}: {base_name} is not a projection of the base")
        a, b = pair["a"], pair["b"]  # [r, n_in], [n_out, r]
        rank = b.shape[1]
        weight = tensors[base_name]
        if a.shape != (rank, weight.shape[1]) or b.shape != (weight.shape[0], rank):
            raise ValueError(f"{adapter_path}: {base_name}: A {a.shape} and B {b.shape} do not "
                             f"fit the base's {weight.shape}")
        scale = user_scale if alpha == 0 else user_scale * alpha / rank
        tensors[base_name] = weight + scale * (b @ a)
    return len(pairs)


def fnv1a64(data):
    """FNV-1a 64-bit hash of the model file, so a test can tell a stale golden file."""
    value = 0xcbf29ce484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return value


def file_hash(path):
    with open(path, "rb") as handle:
        return f"{fnv1a64(handle.read()):016x}"


def main():
    arguments = sys.argv[1:]
    adapter = None
    if len(arguments) == 5 and arguments[3] == "--lora":
        path, _, scale = arguments[4].partition(":")
        adapter = (path, float(scale) if scale else 1.0)
        arguments = arguments[:3]
    if len(arguments) != 3:
        sys.exit(__doc__)
    model_path, prompts_path, out_path = arguments
    metadata, tensors = read_gguf(model_path)
    if adapter is not None:
        merge_lora(metadata, tensors, *adapter)
    with open(prompts_path) as handle:
        requests = json.load(handle)
    results = []
    perplexities = []
    with torch.no_grad():
        for tokens in requests["prompts"]:
            logits = forward(metadata, tensors, tokens)
            results.append({"tokens": tokens,
                            "logits": [[float(f"{v:.7g}") for v in row] for row in logits.tolist()]})
        if "perplexity" in requests:
            tokens = requests["perplexity"]["tokens"]
            for context, stride in requests["perplexity"]["windows"]:
                perplexities.append(perplexity(metadata, tensors, tokens, context, stride))
    with open(out_path, "w") as handle:
        output = {"model": model_path.split("/")[-1], "model_fnv1a64": file_hash(model_path)}
        if adapter is not None:
            output.update({"adapter": adapter[0].split("/")[-1],
                           "adapter_fnv1a64": file_hash(adapter[0]), "adapter_scale": adapter[1]})
        output["results"] = results
        if "perplexity" in requests:
            output["perplexity"] = {"tokens": requests["perplexity"]["tokens"],
                                    "windows": perplexities}
        json.dump(output, handle)


if __name__ == "__main__":
    main()
