#include "folio/dist/pipeline_step_runner.h"

#include <fmt/format.h>

namespace folio::dist {

Result<std::unique_ptr<PipelineStepRunner>> PipelineStepRunner::create(
    std::vector<std::unique_ptr<WorkerClient>> workers, std::vector<PipelineStageSpec> specs,
    const std::string& model_hash) {
  if (workers.empty() || workers.size() != specs.size()) {
    return invalid_argument("a pipeline needs one stage per worker: {} workers, {} stages",
                            workers.size(), specs.size());
  }
  std::unique_ptr<PipelineStepRunner> runner(new PipelineStepRunner());
  for (size_t s = 0; s < specs.size(); ++s) {
    const PipelineStageSpec& spec = specs[s];
    const std::string& address = workers[s]->info().address;
    const int64_t expected_first = s == 0 ? 0 : specs[s - 1].end_layer;
    if (spec.first_layer != expected_first) {
      return invalid_argument(
          "stage {} (worker {}) starts at layer {}; the stages must cover the layers in order "
          "from 0, so it must start at {}",
          s, address, spec.first_layer, expected_first);
    }
    Result<PreparedStage> prepared = workers[s]->prepare_stage(spec, model_hash);
    if (!prepared.ok()) {
      return prepared.status().with_context(
          fmt::format("preparing stage {} (layers [{}, {})) on worker {}", s, spec.first_layer,
                      spec.end_layer, address));
    }
    const bool first = s == 0, last = s + 1 == specs.size();
    const int64_t hidden_in = s == 0 ? 0 : runner->prepared_.back().hidden_output_size;
    const bool chains = prepared->hidden_input_size == hidden_in &&
                        (prepared->hidden_output_size > 0) == !last &&
                        (prepared->vocab_size > 0) == last && (first || hidden_in > 0);
    if (!chains) {
      return failed_precondition(
          "stage {} on worker {} (layers [{}, {})) reads a residual stream of {} values and "
          "writes {} ({} logits columns), which does not chain after the previous stage's {}: "
          "the last stage must end at the model's last layer",
          s, address, spec.first_layer, spec.end_layer, prepared->hidden_input_size,
          prepared->hidden_output_size, prepared->vocab_size, hidden_in);
    }
    runner->prepared_.push_back(*prepared);
  }
  runner->vocab_size_ = runner->prepared_.back().vocab_size;
  runner->max_logit_rows_ =
      specs.back().max_logit_rows > 0 ? specs.back().max_logit_rows : specs.back().max_sequences;
  runner->workers_ = std::move(workers);
  runner->specs_ = std::move(specs);
  runner->results_.resize(runner->specs_.size());
  return runner;
}

Result<ir::StepOutput> PipelineStepRunner::run(const ir::StepBatch& step) {
  std::span<const float> hidden;
  for (size_t s = 0; s < workers_.size(); ++s) {
    StageStepResult& result = results_[s];
    const Status status = workers_[s]->run_stage(prepared_[s].stage_id, step, hidden, result);
    if (!status.ok()) {
      return status.with_context(fmt::format("pipeline stage {} (layers [{}, {}))", s,
                                             specs_[s].first_layer, specs_[s].end_layer));
    }
    traffic_.request_bytes += result.request_bytes;
    traffic_.reply_bytes += result.reply_bytes;
    hidden = result.hidden_out;
  }
  ++traffic_.steps;
  traffic_.tokens += step.num_tokens();
  const StageStepResult& last = results_.back();
  if (last.num_rows != step.num_logit_rows() || last.vocab_size != vocab_size_ ||
      last.logits.size() != static_cast<size_t>(int64_t{last.num_rows} * vocab_size_)) {
    return data_loss("worker {} returned {} logits for {} rows of {}, the step wants {} rows",
                     workers_.back()->info().address, last.logits.size(), last.num_rows,
                     last.vocab_size, step.num_logit_rows());
  }
  return ir::StepOutput{last.logits, last.num_rows, vocab_size_, {}, 0};
}

}  // namespace folio::dist
