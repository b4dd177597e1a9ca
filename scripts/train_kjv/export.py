"""Writes trained weights and the vocabulary in Folio's weight interchange format, which
`folio make-model --from-weights DIR` turns into a GGUF file:

  DIR/manifest.json   {"format": "folio-weights-1", "architecture": "llama", "name": ...,
                       "shape": {vocab_size, hidden_size, num_layers, num_heads, num_kv_heads,
                                 ffn_size, context_length},
                       "rope_theta": float, "rms_norm_epsilon": float,
                       "tensors": [{"name": GGUF name, "shape": [rows, row length] or [length],
                                    "offset": byte offset in weights.bin}, ...],
                       "vocabulary": {"model": "llama", "tokens": [...], "scores": [...],
                                      "types": [...llama token types], "bos": 1, "eos": 2,
                                      "unknown": 0, "add_bos": true, "add_eos": false,
                                      "add_space_prefix": false}}
  DIR/weights.bin     every tensor as little-endian float32, row-major, at its offset.
Shapes are PyTorch's (outermost first): a matrix [rows, row length] is the GGUF tensor of ggml
shape [row length, rows].
"""
import json
import os

import numpy as np

import model as llama_model
import tokenizer as spm


def write_tensors(directory, named_tensors):
    """Writes DIR/weights.bin (every tensor as little-endian float32, row-major, one after the
    other) and returns the manifest's "tensors" list. Also used by lora.py's adapter format."""
    os.makedirs(directory, exist_ok=True)
    tensors = []
    offset = 0
    with open(os.path.join(directory, "weights.bin"), "wb") as handle:
        for tensor_name, parameter in named_tensors.items():
            data = parameter.detach().to("cpu").float().contiguous().numpy().astype("<f4")
            handle.write(data.tobytes())
            tensors.append({"name": tensor_name, "shape": list(data.shape), "offset": offset})
            offset += data.nbytes
    return tensors


def export_weights(directory, model, processor, name):
    tensors = write_tensors(directory, model.gguf_tensors())
    entries = spm.vocabulary_entries(processor)
    manifest = {
        "format": "folio-weights-1", "architecture": "llama", "name": name,
        "shape": {key: value for key, value in model.shape.as_dict().items()},
        "rope_theta": llama_model.ROPE_THETA, "rms_norm_epsilon": llama_model.RMS_NORM_EPSILON,
        "tensors": tensors,
        "vocabulary": {"model": "llama", "tokens": [e[0] for e in entries],
                       "scores": [e[1] for e in entries], "types": [e[2] for e in entries],
                       "bos": spm.BOS_ID, "eos": spm.EOS_ID, "unknown": spm.UNKNOWN_ID,
                       "add_bos": True, "add_eos": False, "add_space_prefix": False},
    }
    with open(os.path.join(directory, "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, ensure_ascii=False, indent=1)
