"""LoRA adapters for the Llama of model.py: the adapted model, the base weights read from the
shipped GGUF file, and the adapter interchange format.

An adapter adds to each targeted projection W [n_out, n_in] of every layer a low-rank update,

  y = x W^T + (alpha / r) (x A^T) B^T,   i.e. W' = W + (alpha / r) B A,

with A [r, n_in] and B [n_out, r]. That is what Folio's LoRA kernel computes
(src/folio/kernels/lora.h: output = base + scale * B (A x), scale = alpha / rank) and what
llama.cpp's LoRA GGUF files hold ("blk.N.attn_q.weight.lora_a" of ggml shape [n_in, r], i.e. A
in PyTorch's [r, n_in] order, and ".lora_b" of ggml shape [r, n_out], i.e. B [n_out, r]).
Initialization as in Hu et al. (2021) and PEFT's default: A uniform in +-1/sqrt(n_in)
(kaiming-uniform with a = sqrt(5)), B zero, so the adapted model starts equal to the base. The
base weights are frozen; only A and B train.

The base weights are the shipped models/demo/kjv-f16.gguf (the f32 weights it was exported from
are not shipped), read with the GGUF parser of tests/data/reference/llama_reference.py (the
float64 reference model.py was checked against). Its f16 matrices are exactly representable in
float32, so the PyTorch base computes with exactly the weights the engine loads.

Interchange format, which `folio make-adapter -m BASE.gguf --from-weights DIR --dtype f16
-o OUT.gguf` turns into a LoRA GGUF (the sibling of export.py's folio-weights-1):
  DIR/manifest.json  {"format": "folio-lora-1", "architecture": "llama", "name": ...,
                      "alpha": float,
                      "tensors": [{"name": "blk.0.attn_q.weight.lora_a", "shape": [r, n_in],
                                   "offset": byte offset in weights.bin},
                                  {"name": "blk.0.attn_q.weight.lora_b", "shape": [n_out, r],
                                   "offset": ...}, ...]}   (layer by layer, TARGETS order)
  DIR/weights.bin    every tensor as little-endian float32, row-major, at its offset.
"""
import json
import math
import os
import struct
import sys

import torch

import export
import model as llama_model

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_REPO, "tests", "data", "reference"))
import llama_reference  # noqa: E402  (its GGUF parser; importing it runs nothing)

# The projections an adapter targets, in the order of a layer's tensors (GGUF names without the
# "blk.N." prefix and ".weight" suffix).
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
FORMAT = "folio-lora-1"


def _key(name, matrix):
    """ParameterDict key of an adapter matrix ("a" or "b") of the GGUF tensor `name`."""
    return name.replace(".", "_") + "_lora_" + matrix


class LoraLlama(llama_model.Llama):
    """model.Llama with a rank-`rank` adapter on the TARGETS projections of every layer."""

    def __init__(self, shape, rank, alpha):
        super().__init__(shape)
        self.rank, self.alpha = rank, alpha
        self.scale = alpha / rank
        self.adapter = torch.nn.ParameterDict()
        self.adapted = []  # GGUF names of the adapted matrices, in file order
        for name in self.tensor_names:
            parts = name.split(".")
            if parts[0] != "blk" or parts[2] not in TARGETS:
                continue
            out_features, in_features = self.w(name).shape
            self.adapted.append(name)
            self.adapter[_key(name, "a")] = torch.nn.Parameter(torch.zeros(rank, in_features))
            self.adapter[_key(name, "b")] = torch.nn.Parameter(torch.zeros(out_features, rank))

    def load_base(self, tensors):
        """Copies {GGUF name: tensor} into the base weights (all of them, shapes checked) and
        freezes them."""
        if set(tensors) != set(self.tensor_names):
            raise ValueError(f"base tensors differ from the model's: "
                             f"{sorted(set(tensors) ^ set(self.tensor_names))}")
        with torch.no_grad():
            for name, parameter in self.gguf_tensors().items():
                if tuple(tensors[name].shape) != tuple(parameter.shape):
                    raise ValueError(f"{name}: shape {tuple(tensors[name].shape)}, expected "
                                     f"{tuple(parameter.shape)}")
                parameter.copy_(tensors[name])
                parameter.requires_grad_(False)

    def initialize_adapter(self, generator):
        """A uniform in +-1/sqrt(n_in), B zero (the adapted model then equals the base)."""
        with torch.no_grad():
            for name in self.adapted:
                a = self.adapter[_key(name, "a")]
                bound = 1.0 / math.sqrt(a.shape[1])
                a.uniform_(-bound, bound, generator=generator)
                self.adapter[_key(name, "b")].zero_()

    def adapter_tensors(self):
        """{interchange / GGUF name: parameter}: per adapted matrix, its lora_a then lora_b."""
        result = {}
        for name in self.adapted:
            result[name + ".lora_a"] = self.adapter[_key(name, "a")]
            result[name + ".lora_b"] = self.adapter[_key(name, "b")]
        return result

    def linear(self, x, name):
        y = super().linear(x, name)
        if _key(name, "a") not in self.adapter:
            return y
        a, b = self.adapter[_key(name, "a")], self.adapter[_key(name, "b")]
        return y + self.scale * ((x @ a.T) @ b.T)


def read_base(path):
    """Reads a Llama GGUF file. Returns (model.Shape, {GGUF name: float32 tensor},
    [(piece, score, llama token type)] in id order). Refuses a file whose architecture, RoPE or
    norm constants differ from what model.py computes."""
    metadata, arrays = llama_reference.read_gguf(path)
    if metadata.get("general.architecture") != "llama":
        raise ValueError(f"{path}: architecture {metadata.get('general.architecture')!r}, "
                         f"expected 'llama'")
    shape = llama_model.Shape(
        vocab_size=len(metadata["tokenizer.ggml.tokens"]),
        hidden_size=metadata["llama.embedding_length"],
        num_layers=metadata["llama.block_count"],
        num_heads=metadata["llama.attention.head_count"],
        num_kv_heads=metadata["llama.attention.head_count_kv"],
        ffn_size=metadata["llama.feed_forward_length"],
        context_length=metadata["llama.context_length"])

    def as_float32(value):
        return struct.unpack("<f", struct.pack("<f", value))[0]

    expected = {"llama.rope.freq_base": as_float32(llama_model.ROPE_THETA),
                "llama.attention.layer_norm_rms_epsilon":
                    as_float32(llama_model.RMS_NORM_EPSILON),
                "llama.rope.dimension_count": shape.head_dim}
    for key, value in expected.items():
        if metadata.get(key, value) != value:
            raise ValueError(f"{path}: {key} = {metadata[key]}, model.py computes with {value}")
    # float64 arrays of f16 / f32 values: the conversion to float32 is exact.
    tensors = {name: torch.from_numpy(array).float() for name, array in arrays.items()}
    vocabulary = list(zip(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.scores"],
                          metadata["tokenizer.ggml.token_type"]))
    return shape, tensors, vocabulary


def export_adapter(directory, model, name):
    """Writes DIR/manifest.json and DIR/weights.bin (the interchange format above)."""
    tensors = export.write_tensors(directory, model.adapter_tensors())
    manifest = {"format": FORMAT, "architecture": "llama", "name": name,
                "alpha": float(model.alpha), "tensors": tensors}
    with open(os.path.join(directory, "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
        handle.write("\n")
