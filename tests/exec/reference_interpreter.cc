#include "reference_interpreter.h"

#include <cmath>

namespace folio::exec::testing {
namespace {

using Values = std::vector<double>;

const ir::TensorInfo& operand(const ir::Graph& graph, const ir::Op& op, int position) {
  return graph.tensor(op.inputs[static_cast<size_t>(position)]);
}

Values rope(const Values& x, const Values& positions, const ir::RopeAttributes& attributes) {
  Values y = x;
  const int64_t width = attributes.num_heads * attributes.head_dim;
  const int64_t pairs = attributes.rotary_dim / 2;
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int64_t h = 0; h < attributes.num_heads; ++h) {
      double* head = y.data() + int64_t(t) * width + h * attributes.head_dim;
      for (int64_t i = 0; i < pairs; ++i) {
        const double angle =
            positions[t] *
            std::pow(double(attributes.theta), -2.0 * double(i) / double(attributes.rotary_dim));
        const bool neox = attributes.style == kernels::RopeStyle::kNeox;
        const int64_t a = neox ? i : 2 * i;
        const int64_t b = neox ? i + pairs : 2 * i + 1;
        const double first = head[a], second = head[b];
        head[a] = first * std::cos(angle) - second * std::sin(angle);
        head[b] = first * std::sin(angle) + second * std::cos(angle);
      }
    }
  }
  return y;
}

Values rms_norm(const Values& x, const Values& weight, int64_t hidden,
                const ir::RmsNormAttributes& attributes) {
  Values y;
  for (size_t row = 0; row < x.size() / size_t(hidden); ++row) {
    const double* values = x.data() + row * size_t(hidden);
    double squares = 0;
    for (int64_t i = 0; i < hidden; ++i) squares += values[i] * values[i];
    const double inverse = 1.0 / std::sqrt(squares / double(hidden) + attributes.epsilon);
    for (int64_t i = 0; i < hidden; ++i) y.push_back(values[i] * inverse * weight[size_t(i)]);
  }
  return y;
}

// y [rows, n] = x [rows, k] * weight [n, k]^T (+ bias [n]).
Values matmul(const Values& x, const Values& weight, const Values* bias, int64_t k) {
  const size_t rows = x.size() / size_t(k), n = weight.size() / size_t(k);
  Values y;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < n; ++c) {
      double sum = bias != nullptr ? (*bias)[c] : 0.0;
      for (size_t i = 0; i < size_t(k); ++i)
        sum += x[r * size_t(k) + i] * weight[c * size_t(k) + i];
      y.push_back(sum);
    }
  }
  return y;
}

}  // namespace

Values ReferenceInterpreter::input_values(const ir::TensorInfo& tensor,
                                          const ir::StepBatch& step) const {
  std::span<const int32_t> source;
  if (tensor.name == "token_ids") source = step.token_ids;
  if (tensor.name == "positions") source = step.positions;
  if (tensor.name == "slot_mapping") source = step.slot_mapping;
  if (tensor.name == "seq_lens") source = step.seq_lens;
  if (tensor.name == "query_start") source = step.query_start;
  if (tensor.name == "block_tables") source = step.block_tables;
  if (tensor.name == "logit_indices") source = step.logit_indices;
  FOLIO_CHECK(static_cast<int64_t>(source.size()) == tensor.shape.num_elements(),
              "reference: input '{}' has {} values for shape {}", tensor.name, source.size(),
              tensor.shape.to_string());
  return Values(source.begin(), source.end());
}

void ReferenceInterpreter::kv_write(const ir::Graph& graph, const ir::Op& op,
                                    const std::vector<Values>& values) {
  const ir::TensorInfo& key = operand(graph, op, ir::kv_cache_write_input::kKey);
  const int64_t width = key.shape[1];
  const Values& keys = values[size_t(key.id.value())];
  const Values& vals = values[size_t(op.inputs[ir::kv_cache_write_input::kValue].value())];
  const Values& slots = values[size_t(op.inputs[ir::kv_cache_write_input::kSlotMapping].value())];
  const std::string& key_cache = graph.tensor(op.updates[0]).name;
  const std::string& value_cache = graph.tensor(op.updates[1]).name;
  for (size_t t = 0; t < slots.size(); ++t) {
    const auto slot = static_cast<int64_t>(slots[t]);
    kv_[{key_cache, slot}] =
        Values(keys.begin() + int64_t(t) * width, keys.begin() + int64_t(t + 1) * width);
    kv_[{value_cache, slot}] =
        Values(vals.begin() + int64_t(t) * width, vals.begin() + int64_t(t + 1) * width);
  }
}

void ReferenceInterpreter::attention(const ir::Graph& graph, const ir::Op& op,
                                     std::vector<Values>& values) const {
  const auto& attributes = std::get<ir::AttentionAttributes>(op.attributes);
  const Values& query = values[size_t(op.inputs[ir::attention_input::kQuery].value())];
  const Values& seq_lens = values[size_t(op.inputs[ir::attention_input::kSeqLens].value())];
  const Values& starts = values[size_t(op.inputs[ir::attention_input::kQueryStartLoc].value())];
  const ir::TensorInfo& tables_info = operand(graph, op, ir::attention_input::kBlockTables);
  const Values& tables = values[size_t(tables_info.id.value())];
  const std::string& key_cache = operand(graph, op, ir::attention_input::kKeyCache).name;
  const std::string& value_cache = operand(graph, op, ir::attention_input::kValueCache).name;
  const int64_t block_size = operand(graph, op, ir::attention_input::kKeyCache).shape[1];
  const int64_t d = attributes.head_dim;
  const int64_t width = attributes.num_heads * d;
  const int64_t group = attributes.num_heads / attributes.num_kv_heads;
  Values output(query.size(), 0.0);
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    const auto begin = static_cast<int64_t>(starts[s]);
    const auto end = static_cast<int64_t>(starts[s + 1]);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t visible = static_cast<int64_t>(seq_lens[s]) - (end - begin) + (row - begin) + 1;
      for (int64_t h = 0; h < attributes.num_heads; ++h) {
        const int64_t kv_head = h / group;
        Values scores;
        std::vector<const Values*> rows;
        for (int64_t j = 0; j < visible; ++j) {
          const auto block = static_cast<int64_t>(
              tables[s * size_t(tables_info.shape[1]) + size_t(j / block_size)]);
          const int64_t slot = block * block_size + j % block_size;
          const Values& key = kv_.at({key_cache, slot});
          double dot = 0;
          for (int64_t i = 0; i < d; ++i)
            dot += query[size_t(row * width + h * d + i)] * key[size_t(kv_head * d + i)];
          double score = dot * attributes.scale;
          if (attributes.logit_soft_cap > 0) {
            score = attributes.logit_soft_cap * std::tanh(score / attributes.logit_soft_cap);
          }
          scores.push_back(score);
          rows.push_back(&kv_.at({value_cache, slot}));
        }
        double maximum = -INFINITY, sum = 0;
        for (double score : scores) maximum = std::max(maximum, score);
        for (double& score : scores) sum += (score = std::exp(score - maximum));
        for (size_t j = 0; j < scores.size(); ++j) {
          for (int64_t i = 0; i < d; ++i) {
            output[size_t(row * width + h * d + i)] +=
                scores[j] / sum * (*rows[j])[size_t(kv_head * d + i)];
          }
        }
      }
    }
  }
  values[size_t(op.outputs[0].value())] = std::move(output);
}

Status ReferenceInterpreter::evaluate(const ir::Graph& graph, const ir::Op& op,
                                      std::vector<Values>& values) {
  auto in = [&](int position) -> const Values& {
    return values[size_t(op.inputs[size_t(position)].value())];
  };
  auto shape = [&](int position) { return operand(graph, op, position).shape; };
  Values* out = op.outputs.empty() ? nullptr : &values[size_t(op.outputs[0].value())];
  switch (op.kind) {
    case ir::OpKind::kEmbedding: {
      const int64_t hidden = shape(1)[1];
      for (double id : in(0)) {
        out->insert(out->end(), in(1).begin() + int64_t(id) * hidden,
                    in(1).begin() + (int64_t(id) + 1) * hidden);
      }
      break;
    }
    case ir::OpKind::kRmsNorm:
      // Groups of the weight's length are normalized on their own (per-head norms).
      *out = rms_norm(in(0), in(1), shape(1)[0], std::get<ir::RmsNormAttributes>(op.attributes));
      break;
    case ir::OpKind::kMatMul:
      *out = matmul(in(0), in(1), op.inputs.size() > 2 ? &in(2) : nullptr, shape(0)[1]);
      break;
    case ir::OpKind::kAdd:
      for (size_t i = 0; i < in(0).size(); ++i) out->push_back(in(0)[i] + in(1)[i]);
      break;
    case ir::OpKind::kSwiGlu:
      for (size_t i = 0; i < in(0).size(); ++i)
        out->push_back(in(0)[i] / (1.0 + std::exp(-in(0)[i])) * in(1)[i]);
      break;
    case ir::OpKind::kGeGlu:
      for (size_t i = 0; i < in(0).size(); ++i) {
        const double g = in(0)[i];
        const double inner = std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
        out->push_back(0.5 * g * (1.0 + std::tanh(inner)) * in(1)[i]);
      }
      break;
    case ir::OpKind::kScale: {
      const double factor = std::get<ir::ScaleAttributes>(op.attributes).factor;
      for (double x : in(0)) out->push_back(factor * x);
      break;
    }
    case ir::OpKind::kSoftCap: {
      const double cap = std::get<ir::SoftCapAttributes>(op.attributes).cap;
      for (double x : in(0)) out->push_back(cap * std::tanh(x / cap));
      break;
    }
    case ir::OpKind::kRope:
      *out = rope(in(0), in(1), std::get<ir::RopeAttributes>(op.attributes));
      break;
    case ir::OpKind::kKvCacheWrite:
      kv_write(graph, op, values);
      break;
    case ir::OpKind::kPagedAttention:
      attention(graph, op, values);
      break;
    case ir::OpKind::kGatherRows: {
      const int64_t hidden = shape(0)[1];
      for (double index : in(1)) {
        out->insert(out->end(), in(0).begin() + int64_t(index) * hidden,
                    in(0).begin() + (int64_t(index) + 1) * hidden);
      }
      break;
    }
    case ir::OpKind::kMul:
    case ir::OpKind::kSilu:
    // KV-parallel merges are checked against the whole-sequence executor (tests/model/
    // llama_kv_parallel_test.cc) and the double reference of tests/kernels/attention_merge_test.
    case ir::OpKind::kAttentionMerge:
    // Adapter updates are checked against the PyTorch reference (tests/model/
    // llama_forward_test.cc, LlamaAdapterForwardTest), not here.
    case ir::OpKind::kLora:
    // One process has no group to sum over; tensor-parallel graphs are compared with the
    // single-process graph instead (tests/dist).
    case ir::OpKind::kAllReduceSum:
      return invalid_argument("reference: {} not supported", ir::op_kind_name(op.kind));
  }
  return Status();
}

Result<std::vector<double>> ReferenceInterpreter::run(const ir::Graph& graph,
                                                      const ir::StepBatch& step) {
  std::vector<Values> values(size_t(graph.num_tensors()));
  for (const ir::TensorInfo& tensor : graph.tensors()) {
    if (tensor.residency == ir::Residency::kInput)
      values[size_t(tensor.id.value())] = input_values(tensor, step);
    if (tensor.residency == ir::Residency::kWeight) {
      const std::vector<float> stored = weights_.values(tensor.name);
      values[size_t(tensor.id.value())] = Values(stored.begin(), stored.end());
    }
  }
  for (const ir::Op& op : graph.ops()) FOLIO_RETURN_IF_ERROR(evaluate(graph, op, values));
  const std::optional<ir::TensorId> logits = graph.find_tensor("logits");
  if (!logits) return invalid_argument("reference: no logits output");
  return values[size_t(logits->value())];
}

}  // namespace folio::exec::testing
