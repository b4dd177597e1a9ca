"""A Llama decoder in PyTorch that computes exactly what Folio's graph computes
(src/folio/model/llama_graph.cc; the float64 reference is tests/data/reference/llama_reference.py):

  x = token_embd[ids]
  per layer:  h = RMSNorm(x) * attn_norm                       (eps = RMS_NORM_EPSILON)
              q, k, v = h Wq^T, h Wk^T, h Wv^T                   (no biases)
              q, k = RoPE(q), RoPE(k)   normal (GPT-J) style: rotates the pairs (2i, 2i+1) of each
                                        head by position * theta^(-2i / head_dim)
              query head j attends with key/value head j // (heads / kv_heads)   (GQA)
              softmax(q k^T / sqrt(head_dim) + causal mask) v, heads concatenated, Wo^T
              x += that;  h = RMSNorm(x) * ffn_norm;  x += (silu(h Wg^T) * (h Wu^T)) Wd^T
  logits = (RMSNorm(x) * output_norm) Wout^T                  (untied output)

Parameter names are the GGUF tensor names with "." replaced by "_" (nn.Module names cannot contain
dots); gguf_tensors() maps them back. A torch Linear weight [out, in] in row-major order is
exactly the GGUF tensor of ggml shape [in, out], so export needs no transposition or permutation.
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn.functional as F

RMS_NORM_EPSILON = 1e-5
ROPE_THETA = 10000.0


@dataclass
class Shape:
    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 4
    ffn_size: int = 704
    context_length: int = 256

    @property
    def head_dim(self):
        return self.hidden_size // self.num_heads

    def as_dict(self):
        return asdict(self)


def rms_norm(x, weight):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + RMS_NORM_EPSILON) * weight


def rope_tables(length, head_dim, dtype):
    """cos, sin of shape [length, 1, head_dim / 2] (broadcast over heads)."""
    exponent = torch.arange(0, head_dim // 2, dtype=torch.float64) * 2 / head_dim
    inverse_frequency = ROPE_THETA ** (-exponent)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inverse_frequency[None, :]
    return torch.cos(angles)[:, None, :].to(dtype), torch.sin(angles)[:, None, :].to(dtype)


def apply_rope(x, cos, sin):
    """x: [batch, tokens, heads, head_dim]; rotates the pairs (2i, 2i+1)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated_even = even * cos - odd * sin
    rotated_odd = even * sin + odd * cos
    return torch.stack([rotated_even, rotated_odd], dim=-1).flatten(-2)


class Llama(torch.nn.Module):
    def __init__(self, shape: Shape):
        super().__init__()
        self.shape = shape
        hidden, kv_width = shape.hidden_size, shape.num_kv_heads * shape.head_dim
        self.weights = torch.nn.ParameterDict()
        self.tensor_names = []  # GGUF names, in file order
        self._add("token_embd.weight", shape.vocab_size, hidden)
        for layer in range(shape.num_layers):
            prefix = f"blk.{layer}."
            self._add(prefix + "attn_norm.weight", hidden)
            self._add(prefix + "attn_q.weight", hidden, hidden)
            self._add(prefix + "attn_k.weight", kv_width, hidden)
            self._add(prefix + "attn_v.weight", kv_width, hidden)
            self._add(prefix + "attn_output.weight", hidden, hidden)
            self._add(prefix + "ffn_norm.weight", hidden)
            self._add(prefix + "ffn_gate.weight", shape.ffn_size, hidden)
            self._add(prefix + "ffn_up.weight", shape.ffn_size, hidden)
            self._add(prefix + "ffn_down.weight", hidden, shape.ffn_size)
        self._add("output_norm.weight", hidden)
        self._add("output.weight", shape.vocab_size, hidden)

    def _add(self, name, *size):
        self.tensor_names.append(name)
        self.weights[name.replace(".", "_")] = torch.nn.Parameter(torch.empty(*size))

    def w(self, name):
        return self.weights[name.replace(".", "_")]

    def gguf_tensors(self):
        """{GGUF tensor name: parameter} in GGUF order."""
        return {name: self.w(name) for name in self.tensor_names}

    def initialize(self, generator):
        """Normal(0, 0.02) matrices; the projections into the residual stream scaled by
        1/sqrt(2 * layers); norm weights 1."""
        residual_scale = 1.0 / math.sqrt(2 * self.shape.num_layers)
        with torch.no_grad():
            for name, parameter in self.gguf_tensors().items():
                if parameter.dim() == 1:
                    parameter.fill_(1.0)
                    continue
                deviation = 0.02
                if name.endswith(("attn_output.weight", "ffn_down.weight")):
                    deviation *= residual_scale
                parameter.normal_(0.0, deviation, generator=generator)

    def linear(self, x, name):
        """x W^T for the matrix `name` (a GGUF name): every projection of forward() goes through
        here, so a subclass can add to it (lora.py adds the adapter's low-rank update)."""
        return x @ self.w(name).T

    def forward(self, ids):
        """ids: [batch, tokens] int64 -> logits [batch, tokens, vocab]."""
        shape = self.shape
        batch, length = ids.shape
        x = self.w("token_embd.weight")[ids]
        cos, sin = rope_tables(length, shape.head_dim, x.dtype)
        mask = torch.full((length, length), float("-inf"), dtype=x.dtype).triu(1)
        group = shape.num_heads // shape.num_kv_heads
        for layer in range(shape.num_layers):
            p = f"blk.{layer}."
            h = rms_norm(x, self.w(p + "attn_norm.weight"))
            q = self.linear(h, p + "attn_q.weight").view(batch, length, shape.num_heads, -1)
            k = self.linear(h, p + "attn_k.weight").view(batch, length, shape.num_kv_heads, -1)
            v = self.linear(h, p + "attn_v.weight").view(batch, length, shape.num_kv_heads, -1)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            # [batch, heads, tokens, head_dim]; kv head j // group serves query head j.
            q = q.transpose(1, 2)
            k = k.transpose(1, 2).repeat_interleave(group, dim=1)
            v = v.transpose(1, 2).repeat_interleave(group, dim=1)
            scores = q @ k.transpose(-1, -2) / math.sqrt(shape.head_dim) + mask
            attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(
                batch, length, shape.hidden_size)
            x = x + self.linear(attended, p + "attn_output.weight")
            h = rms_norm(x, self.w(p + "ffn_norm.weight"))
            gate = self.linear(h, p + "ffn_gate.weight")
            up = self.linear(h, p + "ffn_up.weight")
            x = x + self.linear(F.silu(gate) * up, p + "ffn_down.weight")
        x = rms_norm(x, self.w("output_norm.weight"))
        return self.linear(x, "output.weight")

