// Test support for server/: a tiny generated Llama model (its tokenizer has byte tokens), the
// model served by a real ModelEngine (optionally with LoRA adapters), or the same tokenizer over
// a toy engine whose runner can be paused or scripted, a Server on a free loopback port, HTTP
// helpers that talk to it over real sockets (cpp-httplib's client) and read server-sent events,
// and the text the engine itself gives a request, for comparison.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "folio/engine/model_engine.h"
#include "folio/gguf/gguf_file.h"
#include "folio/kv/block_copier.h"
#include "folio/kv/fixed_page_source.h"
#include "folio/model/llama_model.h"
#include "folio/model/llama_model_file.h"
#include "folio/server/server.h"
#include "testing/llama_shapes.h"
#include "testing/toy_step_runner.h"

namespace folio::server::testing {

using Json = nlohmann::json;

// A generated model parsed from memory; `chat_template` goes into tokenizer.chat_template.
inline std::unique_ptr<model::LlamaModel> make_tiny_model(const std::string& chat_template = {}) {
  Result<gguf::GgufWriter> writer =
      model::make_random_llama_writer(folio::testing::tiny_llama_shape(), /*seed=*/11);
  EXPECT_TRUE(writer.ok()) << writer.status();
  if (!chat_template.empty()) {
    writer->set("tokenizer.chat_template", gguf::GgufValue::of_string(chat_template));
  }
  Result<std::vector<uint8_t>> bytes = writer->write_to_buffer();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  Result<gguf::GgufFile> file = gguf::GgufFile::parse_owned(std::move(*bytes), "tiny.gguf");
  EXPECT_TRUE(file.ok()) << file.status();
  Result<std::unique_ptr<model::LlamaModel>> opened =
      model::LlamaModel::from_file(std::move(*file));
  EXPECT_TRUE(opened.ok()) << opened.status();
  return std::move(*opened);
}

inline engine::ModelEngineOptions tiny_engine_options() {
  engine::ModelEngineOptions options;
  options.num_threads = 2;
  options.memory_budget_bytes = int64_t{48} << 20;
  options.precapture_seconds = 0;
  options.kv_dtype = DType::kF32;
  options.scheduler.max_num_sequences = 48;
  return options;
}

// The engine's text decoder over a tokenizer, exactly as ModelEngine builds it.
inline engine::TextDecoderFactory tokenizer_text_decoder(const tokenizer::Tokenizer* tokenizer) {
  tokenizer::DecodeOptions options;
  options.strip_leading_space = false;
  return engine::make_tokenizer_text_decoder_factory(tokenizer, options);
}

// An engine over a small paged KV cache whose runner is the toy model or any other, with the
// tiny model's tokenizer. A step gate lets a test hold every step until it opens the gate.
class ToyServedEngine {
 public:
  explicit ToyServedEngine(std::unique_ptr<engine::StepRunner> runner = nullptr,
                           int32_t max_context_tokens = 128)
      : model_(make_tiny_model()) {
    kv::BlockManagerOptions kv_options;
    kv_options.geometry.block_size = 8;
    kv_options.geometry.num_layers = 1;
    kv_options.geometry.num_kv_heads = 1;
    kv_options.geometry.head_dim = 4;
    kv_options.geometry.dtype = DType::kF32;
    kv_options.max_context_tokens = max_context_tokens;
    kv_options.watermark = 0.01;
    page_source_ = std::make_unique<kv::FixedPageSource>(kv_options.geometry.block_bytes() * 16,
                                                         /*num_pages=*/32);
    block_manager_ =
        std::move(kv::BlockManager::create(kv_options, *page_source_, copier_, nullptr).value());
    const auto vocab = static_cast<int32_t>(model_->tokenizer().vocab_size());
    if (runner == nullptr) {
      auto toy = std::move(
          engine::testing::ToyStepRunner::create(block_manager_->layout(), vocab).value());
      toy->set_step_observer([this](const ir::StepBatch&) {
        std::unique_lock lock(gate_mutex_);
        gate_changed_.wait(lock, [&] { return gate_open_; });
        if (step_delay_.count() > 0)
          gate_changed_.wait_for(lock, step_delay_, [] { return false; });
        return Status();
      });
      runner = std::move(toy);
    }
    runner_ = std::move(runner);
    engine::EngineOptions engine_options;
    engine_options.scheduler.max_num_sequences = 16;
    engine::EngineParts parts;
    parts.block_manager = block_manager_.get();
    parts.runner = runner_.get();
    parts.registry = &registry_;
    parts.text_decoder_factory = tokenizer_text_decoder(&model_->tokenizer());
    engine_ = std::move(engine::Engine::create(engine_options, parts).value());
    engine_->start();
  }
  ~ToyServedEngine() {
    set_gate(true);
    engine_->stop();
  }

  // Closed: every step waits (the engine thread blocks in the runner) until it opens.
  void set_gate(bool open) {
    {
      std::lock_guard lock(gate_mutex_);
      gate_open_ = open;
    }
    gate_changed_.notify_all();
  }

  // Every step takes at least `delay` (a slow model, so requests stay in flight a while).
  void set_step_delay(std::chrono::milliseconds delay) {
    std::lock_guard lock(gate_mutex_);
    step_delay_ = delay;
  }

  ServedModel served(std::string name = "toy") {
    ServedModel served;
    served.engine = engine_.get();
    served.tokenizer = &model_->tokenizer();
    served.registry = &registry_;
    served.name = std::move(name);
    served.context_length = block_manager_->options().max_context_tokens;
    return served;
  }
  const tokenizer::Tokenizer& tokenizer() const { return model_->tokenizer(); }

 private:
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<kv::FixedPageSource> page_source_;
  kv::HostKvBlockCopier copier_;
  std::unique_ptr<kv::BlockManager> block_manager_;
  std::unique_ptr<engine::StepRunner> runner_;
  metrics::Registry registry_;
  std::unique_ptr<engine::Engine> engine_;
  std::mutex gate_mutex_;
  std::condition_variable gate_changed_;
  bool gate_open_ = true;                    // guarded by gate_mutex_
  std::chrono::milliseconds step_delay_{0};  // guarded by gate_mutex_
};

// A real ModelEngine over the tiny model, started; with `adapters`, able to serve LoRA adapters
// (none registered yet).
inline std::unique_ptr<engine::ModelEngine> start_tiny_model_engine(
    const std::string& chat_template = {}, bool adapters = false) {
  engine::ModelEngineOptions options = tiny_engine_options();
  options.adapters = adapters;
  Result<std::unique_ptr<engine::ModelEngine>> created =
      engine::ModelEngine::create(make_tiny_model(chat_template), options);
  EXPECT_TRUE(created.ok()) << created.status();
  (*created)->engine().start();
  return std::move(*created);
}

// The text the engine produces for `request` (its callbacks are replaced), without the server.
inline std::string engine_text(engine::Engine& engine, engine::Request request) {
  std::mutex mutex;
  std::condition_variable done;
  std::string text;
  bool finished = false;
  request.on_token = [&](const engine::TokenEvent& event) {
    std::lock_guard lock(mutex);
    text += event.text;
  };
  request.on_finish = [&](const engine::Completion& completion) {
    EXPECT_NE(completion.reason, engine::FinishReason::kError) << completion.error;
    std::lock_guard lock(mutex);
    finished = true;
    done.notify_all();
  };
  Result<engine::RequestId> id = engine.submit(std::move(request));
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return {};
  std::unique_lock lock(mutex);
  EXPECT_TRUE(done.wait_for(lock, std::chrono::seconds(60), [&] { return finished; }));
  return text;
}

// The greedy text of `max_tokens` tokens after `prompt`, from the base (adapter 0) or an adapter.
inline std::string engine_greedy_text(engine::Engine& engine, std::vector<int32_t> prompt,
                                      int32_t max_tokens, int64_t adapter_id = 0) {
  engine::Request request;
  request.prompt = std::move(prompt);
  request.max_tokens = max_tokens;
  request.sampling.temperature = 0;
  request.adapter_id = adapter_id;
  return engine_text(engine, std::move(request));
}

// A Server on a free loopback port.
inline std::unique_ptr<Server> start_server(ServedModel served, const ServerOptions& options,
                                            int* port) {
  Result<std::unique_ptr<Server>> server = Server::create(options, std::move(served));
  EXPECT_TRUE(server.ok()) << server.status();
  Result<int> bound = (*server)->start(0);
  EXPECT_TRUE(bound.ok()) << bound.status();
  *port = *bound;
  return std::move(*server);
}

inline std::unique_ptr<httplib::Client> client(int port) {
  auto result = std::make_unique<httplib::Client>("127.0.0.1", port);
  result->set_read_timeout(std::chrono::seconds(60));
  return result;
}

struct HttpAnswer {
  int status = 0;  // 0: no answer (connection failed)
  std::string body;
  Json json() const { return Json::parse(body, nullptr, false); }
};

inline HttpAnswer post(int port, const std::string& path, const std::string& body,
                       const httplib::Headers& headers = {}) {
  httplib::Result result = client(port)->Post(path, headers, body, "application/json");
  if (!result) return {0, "no answer: " + httplib::to_string(result.error())};
  return {result->status, result->body};
}

inline HttpAnswer get(int port, const std::string& path) {
  httplib::Result result = client(port)->Get(path);
  if (!result) return {};
  return {result->status, result->body};
}

// An OpenAI error body {"error": {"message", "type", ...}} with a non-empty message.
inline void expect_error(const HttpAnswer& answer, int status, std::string_view type) {
  EXPECT_EQ(answer.status, status) << answer.body;
  const Json body = answer.json();
  ASSERT_FALSE(body.is_discarded()) << answer.body;
  ASSERT_TRUE(body.contains("error")) << answer.body;
  EXPECT_EQ(body["error"]["type"], type) << answer.body;
  EXPECT_TRUE(body["error"]["message"].is_string());
  EXPECT_FALSE(body["error"]["message"].get<std::string>().empty());
}

// The data payloads of a server-sent-event body, in order ("[DONE]" included).
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> payloads;
  size_t position = 0;
  while (position < body.size()) {
    const size_t end = body.find("\n\n", position);
    if (end == std::string::npos) break;
    const std::string event = body.substr(position, end - position);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    payloads.push_back(event.substr(6));
    position = end + 2;
  }
  EXPECT_EQ(position, body.size()) << "trailing bytes after the last event";
  return payloads;
}

// The text of a streamed answer (completion or chat), checking the chunk format on the way.
inline std::string streamed_text(const std::string& body, std::string* finish_reason = nullptr) {
  const std::vector<std::string> payloads = sse_payloads(body);
  EXPECT_FALSE(payloads.empty());
  if (payloads.empty()) return {};
  EXPECT_EQ(payloads.back(), "[DONE]");
  std::string text;
  for (size_t index = 0; index + 1 < payloads.size(); ++index) {
    const Json chunk = Json::parse(payloads[index], nullptr, false);
    EXPECT_FALSE(chunk.is_discarded()) << payloads[index];
    EXPECT_FALSE(chunk.contains("error")) << payloads[index];
    if (chunk.is_discarded() || !chunk.contains("choices") || chunk["choices"].empty()) continue;
    const Json& choice = chunk["choices"][0];
    if (choice.contains("delta") && choice["delta"].contains("content")) {
      text += choice["delta"]["content"].get<std::string>();
    } else if (choice.contains("text")) {
      text += choice["text"].get<std::string>();
    }
    if (finish_reason != nullptr && !choice["finish_reason"].is_null()) {
      *finish_reason = choice["finish_reason"].get<std::string>();
    }
  }
  return text;
}

// The value of one series in a Prometheus text body ("name{labels}" exactly as rendered), or
// nullopt when it is absent.
inline std::optional<double> metric_value(const std::string& body, const std::string& series) {
  size_t position = 0;
  while ((position = body.find(series + " ", position)) != std::string::npos) {
    if (position == 0 || body[position - 1] == '\n') {
      return std::stod(body.substr(position + series.size() + 1));
    }
    position += series.size();
  }
  return std::nullopt;
}

}  // namespace folio::server::testing
