// The cost of logprobs (token_logprobs.h) for one logits row of a 32000-token vocabulary: what
// a request asking for logprobs pays per generated token, and a prompt_logprobs request per
// prompt token, on top of the engine's own per-token overhead (engine_bench).
#include <benchmark/benchmark.h>

#include <vector>

#include "folio/base/random.h"
#include "folio/engine/token_logprobs.h"

namespace {

void BM_TokenLogprobs(benchmark::State& state) {
  const auto num_top = static_cast<int32_t>(state.range(0));
  std::vector<float> logits(32000);
  folio::SplitMix64 random(1);
  for (float& logit : logits) logit = static_cast<float>(random.next() >> 40) * 0x1.0p-21f - 4.0f;
  folio::engine::TokenLogprobs out;
  int32_t token = 0;
  for (auto _ : state) {
    folio::engine::compute_token_logprobs(logits, token, num_top, out);
    benchmark::DoNotOptimize(out.logprob);
    token = (token + 7919) % 32000;
  }
}
BENCHMARK(BM_TokenLogprobs)->Arg(0)->Arg(5)->Arg(20);

}  // namespace

BENCHMARK_MAIN();
