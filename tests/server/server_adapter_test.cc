// LoRA adapters through the server, over real loopback sockets: the `model` field selects the
// base or an adapter (greedy text equal to what the engine gives that adapter id, and different
// from the base's), unknown names get 404 model_not_found, /v1/models lists adapters with their
// parent, POST /v1/load_lora_adapter and /v1/unload_lora_adapter (on and off), adapter files
// that do not fit the base get 400 and change nothing, and unloading an adapter while a streamed
// request runs on it lets that request finish. Adapters are random ones written to a temporary
// directory (lora::make_random_adapter_writer).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "folio/lora/adapter_writer.h"
#include "folio/server/server.h"
#include "server_test_util.h"

namespace folio::server {
namespace {

using testing::expect_error;
using testing::get;
using testing::HttpAnswer;
using testing::Json;
using testing::post;

// A directory of adapter files for the tiny model, written once per test program.
class AdapterFiles {
 public:
  // One directory per process: ctest runs this binary's tests as parallel processes, and two
  // writers of one file made each other's SetUpTestSuite fail (which ctest reports as skipped).
  AdapterFiles()
      : directory_(std::filesystem::path(::testing::TempDir()) /
                   ("folio_server_lora_" + std::to_string(getpid()))) {
    std::filesystem::create_directories(directory_);
    const model::LlamaShape base = folio::testing::tiny_llama_shape();
    write_random(base, /*seed=*/1, "alpha.gguf");
    write_random(base, /*seed=*/2, "beta.gguf");
    // Made for a base with another hidden size: every A has the wrong row length.
    model::LlamaShape wider = base;
    wider.hidden_size = 64;
    write_random(wider, /*seed=*/3, "wider_base.gguf");
    std::ofstream(path("not_gguf.gguf"), std::ios::binary) << "these bytes are not a GGUF file";
  }

  std::string path(const std::string& file) const { return (directory_ / file).string(); }

 private:
  void write_random(const model::LlamaShape& base, uint64_t seed, const std::string& file) {
    lora::RandomAdapterOptions options;
    options.rank = 8;
    options.seed = seed;
    Result<gguf::GgufWriter> writer = lora::make_random_adapter_writer(base, options);
    ASSERT_TRUE(writer.ok()) << writer.status();
    const Status written = writer->write_file(path(file));
    ASSERT_TRUE(written.ok()) << written;
  }

  std::filesystem::path directory_;
};

const AdapterFiles& adapter_files() {
  static const AdapterFiles* files = new AdapterFiles();
  return *files;
}

Json load_body(const std::string& name, const std::string& file) {
  return Json{{"lora_name", name}, {"lora_path", adapter_files().path(file)}};
}

Json completion_body(const std::string& model, const std::string& prompt, int max_tokens) {
  return Json{{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// The tiny model with adapters, "alpha" registered at start-up (as --lora would), served as
// "tiny" with loading at run time on.
class ServerAdapterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_engine_ = testing::start_tiny_model_engine({}, /*adapters=*/true).release();
    Result<lora::AdapterInfo> alpha =
        model_engine_->adapters()->register_adapter("alpha", adapter_files().path("alpha.gguf"));
    ASSERT_TRUE(alpha.ok()) << alpha.status();
    ServerOptions options;
    options.allow_lora_loading = true;
    server_ = testing::start_server(serve_model_engine(*model_engine_, "tiny"), options, &port_)
                  .release();
  }
  static void TearDownTestSuite() {
    server_->shutdown();
    delete server_;
    model_engine_->engine().stop();
    delete model_engine_;
  }

  static int64_t adapter_id(const std::string& name) {
    std::optional<lora::AdapterInfo> info = model_engine_->adapters()->find(name);
    EXPECT_TRUE(info.has_value()) << name;
    return info.has_value() ? info->id : -1;
  }
  static std::string engine_text(const std::string& prompt, int32_t max_tokens, int64_t adapter) {
    return testing::engine_greedy_text(model_engine_->engine(),
                                       model_engine_->model().tokenizer().encode(prompt),
                                       max_tokens, adapter);
  }
  static std::vector<std::string> model_ids() {
    std::vector<std::string> ids;
    const HttpAnswer models = get(port_, "/v1/models");
    EXPECT_EQ(models.status, 200) << models.body;
    const Json body = models.json();
    for (const Json& entry : body["data"]) ids.push_back(entry["id"]);
    return ids;
  }

  static inline engine::ModelEngine* model_engine_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline int port_ = 0;
};

TEST_F(ServerAdapterTest, ModelFieldSelectsTheAdapterAndMatchesTheEngine) {
  const std::string prompt = "The lighthouse keeper";
  const HttpAnswer base =
      post(port_, "/v1/completions", completion_body("tiny", prompt, 16).dump());
  const HttpAnswer adapted =
      post(port_, "/v1/completions", completion_body("alpha", prompt, 16).dump());
  ASSERT_EQ(base.status, 200) << base.body;
  ASSERT_EQ(adapted.status, 200) << adapted.body;
  EXPECT_EQ(adapted.json()["model"], "alpha");
  const std::string adapted_text = adapted.json()["choices"][0]["text"];
  EXPECT_EQ(adapted_text, engine_text(prompt, 16, adapter_id("alpha")));
  EXPECT_EQ(base.json()["choices"][0]["text"], engine_text(prompt, 16, 0));
  EXPECT_NE(adapted_text, base.json()["choices"][0]["text"]);

  // Chat and streaming route the same way.
  Json chat{{"model", "alpha"},
            {"messages", Json::array({{{"role", "user"}, {"content", "Hello"}}})},
            {"max_tokens", 8},
            {"temperature", 0}};
  const HttpAnswer whole = post(port_, "/v1/chat/completions", chat.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(whole.json()["model"], "alpha");
  chat["stream"] = true;
  const HttpAnswer streamed = post(port_, "/v1/chat/completions", chat.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(testing::streamed_text(streamed.body),
            whole.json()["choices"][0]["message"]["content"]);
}

TEST_F(ServerAdapterTest, UnknownModelOrAdapterGets404NamingIt) {
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    Json body{{"model", "gamma"}, {"max_tokens", 2}};
    if (path == "/v1/completions") {
      body["prompt"] = "x";
    } else {
      body["messages"] = Json::array({{{"role", "user"}, {"content", "x"}}});
    }
    const HttpAnswer answer = post(port_, path, body.dump());
    expect_error(answer, 404, kInvalidRequestError);
    EXPECT_EQ(answer.json()["error"]["code"], "model_not_found");
    const std::string message = answer.json()["error"]["message"];
    EXPECT_NE(message.find("'gamma'"), std::string::npos) << message;
    EXPECT_NE(message.find("/v1/models"), std::string::npos) << message;
  }
}

TEST_F(ServerAdapterTest, ModelListShowsAdaptersWithTheBaseAsParent) {
  const HttpAnswer models = get(port_, "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  const Json data = models.json()["data"];
  ASSERT_GE(data.size(), 2u) << models.body;
  EXPECT_EQ(data[0]["id"], "tiny");
  EXPECT_TRUE(data[0]["parent"].is_null());
  bool listed = false;
  for (const Json& entry : data) {
    if (entry["id"] != "alpha") continue;
    listed = true;
    EXPECT_EQ(entry["object"], "model");
    EXPECT_EQ(entry["parent"], "tiny");
    EXPECT_EQ(entry["root"], "tiny");
    EXPECT_EQ(entry["owned_by"], "folio");
  }
  EXPECT_TRUE(listed) << models.body;
}

TEST_F(ServerAdapterTest, LoadServeAndUnloadAnAdapter) {
  const HttpAnswer loaded =
      post(port_, "/v1/load_lora_adapter", load_body("beta", "beta.gguf").dump());
  ASSERT_EQ(loaded.status, 200) << loaded.body;
  EXPECT_EQ(loaded.json()["id"], "beta");
  EXPECT_EQ(loaded.json()["parent"], "tiny");
  std::vector<std::string> ids = model_ids();
  EXPECT_NE(std::find(ids.begin(), ids.end(), "beta"), ids.end());

  const std::string prompt = "Once upon a time";
  const HttpAnswer answer =
      post(port_, "/v1/completions", completion_body("beta", prompt, 12).dump());
  ASSERT_EQ(answer.status, 200) << answer.body;
  EXPECT_EQ(answer.json()["choices"][0]["text"], engine_text(prompt, 12, adapter_id("beta")));
  EXPECT_NE(answer.json()["choices"][0]["text"], engine_text(prompt, 12, adapter_id("alpha")));

  // The adapter manager's series are in the shared registry /metrics renders: the registered
  // adapters by tier add up to what is registered.
  const std::string metrics = get(port_, "/metrics").body;
  EXPECT_NE(metrics.find("# TYPE folio_lora_adapters gauge"), std::string::npos);
  double adapters = 0;
  for (const char* tier : {"hot", "warm", "cold"}) {
    adapters +=
        testing::metric_value(metrics, fmt::format("folio_lora_adapters{{tier=\"{}\"}}", tier))
            .value_or(0);
  }
  EXPECT_EQ(adapters, static_cast<double>(model_engine_->adapters()->stats().registered));
  EXPECT_GE(adapters, 2);

  const HttpAnswer again =
      post(port_, "/v1/load_lora_adapter", load_body("beta", "beta.gguf").dump());
  expect_error(again, 400, kInvalidRequestError);
  EXPECT_EQ(again.json()["error"]["code"], "adapter_exists");

  const HttpAnswer unloaded =
      post(port_, "/v1/unload_lora_adapter", Json{{"lora_name", "beta"}}.dump());
  ASSERT_EQ(unloaded.status, 200) << unloaded.body;
  EXPECT_EQ(unloaded.json(), (Json{{"id", "beta"}, {"object", "model"}, {"deleted", true}}));
  ids = model_ids();
  EXPECT_EQ(std::find(ids.begin(), ids.end(), "beta"), ids.end());
  const HttpAnswer gone = post(port_, "/v1/completions", completion_body("beta", prompt, 2).dump());
  expect_error(gone, 404, kInvalidRequestError);
  const HttpAnswer unknown =
      post(port_, "/v1/unload_lora_adapter", Json{{"lora_name", "beta"}}.dump());
  expect_error(unknown, 404, kInvalidRequestError);
  EXPECT_EQ(unknown.json()["error"]["code"], "model_not_found");
  // The base is not an adapter and stays.
  expect_error(post(port_, "/v1/unload_lora_adapter", Json{{"lora_name", "tiny"}}.dump()), 404,
               kInvalidRequestError);
  EXPECT_EQ(post(port_, "/v1/completions", completion_body("tiny", prompt, 2).dump()).status, 200);
}

TEST_F(ServerAdapterTest, AdapterFilesThatDoNotFitGet400AndNothingIsLoaded) {
  const std::vector<std::string> before = model_ids();
  struct Case {
    Json body;
    std::string in_message;  // the message names what is wrong
  };
  const std::vector<Case> cases = {
      {load_body("wide", "wider_base.gguf"), ".weight.lora_a'"},
      {load_body("wide", "wider_base.gguf"), "wider_base.gguf"},
      {load_body("junk", "not_gguf.gguf"), "not_gguf.gguf"},
      {load_body("missing", "no_such_file.gguf"), "no_such_file.gguf"},
      {load_body("tiny", "beta.gguf"), "'tiny'"},
      {load_body("base", "beta.gguf"), "'base'"},
      {Json{{"lora_name", "x"}}, "lora_path"},
      {Json{{"lora_name", "x"}, {"lora_path", 3}}, "lora_path"},
  };
  for (const Case& each : cases) {
    SCOPED_TRACE(each.body.dump());
    const HttpAnswer answer = post(port_, "/v1/load_lora_adapter", each.body.dump());
    expect_error(answer, 400, kInvalidRequestError);
    const std::string message = answer.json()["error"]["message"];
    EXPECT_NE(message.find(each.in_message), std::string::npos) << message;
  }
  EXPECT_EQ(model_ids(), before);
  // The server still serves the base and the adapters it had.
  EXPECT_EQ(post(port_, "/v1/completions", completion_body("tiny", "x", 2).dump()).status, 200);
  EXPECT_EQ(post(port_, "/v1/completions", completion_body("alpha", "x", 2).dump()).status, 200);
}

// Holds the engine between kernels: a parallel_for on its thread pool whose one task waits for
// the gate, so the engine's next parallel_for (every step has them) waits its turn.
class EngineGate {
 public:
  explicit EngineGate(ThreadPool& pool) {
    holder_ = std::thread([this, &pool] {
      pool.parallel_for(1, [this](int64_t, int) {
        std::unique_lock lock(mutex_);
        closed_ = true;
        changed_.notify_all();
        changed_.wait(lock, [&] { return opened_; });
      });
    });
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return closed_; });
  }
  ~EngineGate() {
    open();
    holder_.join();
  }
  void open() {
    std::lock_guard lock(mutex_);
    opened_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool closed_ = false;  // guarded by mutex_
  bool opened_ = false;  // guarded by mutex_
  std::thread holder_;
};

// Waits up to 30 s for `condition`, checking every millisecond.
template <typename Condition>
bool wait_until(Condition condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(ServerAdapterUnloadTest, UnloadingWhileAStreamRunsLetsItFinish) {
  std::unique_ptr<engine::ModelEngine> model_engine =
      testing::start_tiny_model_engine({}, /*adapters=*/true);
  ServerOptions options;
  options.allow_lora_loading = true;
  int port = 0;
  std::unique_ptr<Server> server =
      testing::start_server(serve_model_engine(*model_engine, "tiny"), options, &port);
  lora::AdapterManager& adapters = *model_engine->adapters();
  ASSERT_EQ(post(port, "/v1/load_lora_adapter", load_body("gamma", "beta.gguf").dump()).status,
            200);
  const std::string prompt = "In the beginning";
  engine::Request reference;
  reference.prompt = model_engine->model().tokenizer().encode(prompt);
  reference.max_tokens = 24;
  reference.ignore_eos = true;
  reference.sampling.temperature = 0;
  reference.adapter_id = adapters.find("gamma")->id;
  const std::string expected = testing::engine_text(model_engine->engine(), reference);

  // The stream starts and holds the adapter, then its step waits at the gate.
  Json body = completion_body("gamma", prompt, 24);
  body["ignore_eos"] = true;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  HttpAnswer streamed;
  std::optional<EngineGate> gate;
  gate.emplace(model_engine->thread_pool());
  std::thread client([&] { streamed = post(port, "/v1/completions", body.dump()); });
  const bool running = wait_until([&] { return adapters.stats().held == 1; });
  EXPECT_TRUE(running) << "the streamed request never started";
  if (running) {
    const HttpAnswer unloaded =
        post(port, "/v1/unload_lora_adapter", Json{{"lora_name", "gamma"}}.dump());
    EXPECT_EQ(unloaded.status, 200) << unloaded.body;
    // New requests for it are refused at once, while the running one still holds it.
    expect_error(post(port, "/v1/completions", completion_body("gamma", prompt, 2).dump()), 404,
                 kInvalidRequestError);
    EXPECT_EQ(adapters.stats().held, 1);
    EXPECT_EQ(adapters.stats().registered, 0);
  }
  gate.reset();  // opens it (also when the checks above failed, so the client can be joined)
  client.join();
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::string finish_reason;
  EXPECT_EQ(testing::streamed_text(streamed.body, &finish_reason), expected);
  EXPECT_EQ(finish_reason, "length");
  const std::vector<std::string> payloads = testing::sse_payloads(streamed.body);
  ASSERT_GE(payloads.size(), 2u);
  EXPECT_EQ(Json::parse(payloads[payloads.size() - 2])["usage"]["completion_tokens"], 24);
  EXPECT_EQ(adapters.stats().held, 0);

  // The manager frees its weights between later steps (a base request makes some).
  ASSERT_EQ(post(port, "/v1/completions", completion_body("tiny", prompt, 4).dump()).status, 200);
  EXPECT_TRUE(wait_until([&] {
    const lora::AdapterManagerStats stats = adapters.stats();
    return stats.hot.adapters + stats.warm.adapters == 0;
  }));
  server->shutdown();
  model_engine->engine().stop();
}

TEST(ServerAdapterLoadingOffTest, AdapterRoutesSayHowToTurnThemOn) {
  std::unique_ptr<engine::ModelEngine> model_engine =
      testing::start_tiny_model_engine({}, /*adapters=*/true);
  ASSERT_TRUE(
      model_engine->adapters()->register_adapter("alpha", adapter_files().path("alpha.gguf")).ok());
  int port = 0;
  std::unique_ptr<Server> server =
      testing::start_server(serve_model_engine(*model_engine, "tiny"), {}, &port);
  for (const auto& [path, body] :
       {std::pair{"/v1/load_lora_adapter", load_body("beta", "beta.gguf")},
        std::pair{"/v1/unload_lora_adapter", Json{{"lora_name", "alpha"}}}}) {
    SCOPED_TRACE(path);
    const HttpAnswer answer = post(port, path, body.dump());
    expect_error(answer, 404, kInvalidRequestError);
    EXPECT_EQ(answer.json()["error"]["code"], "lora_loading_disabled");
    const std::string message = answer.json()["error"]["message"];
    EXPECT_NE(message.find("--allow-lora-loading"), std::string::npos) << message;
  }
  // Adapters given at start-up are served all the same, and nothing changed.
  EXPECT_EQ(post(port, "/v1/completions", completion_body("alpha", "x", 2).dump()).status, 200);
  EXPECT_EQ(model_engine->adapters()->list().size(), 1u);
  server->shutdown();
  model_engine->engine().stop();
}

TEST(ServerAdapterCreateTest, RefusesLoadingWithoutAdaptersAndAnAdapterNamedLikeTheModel) {
  testing::ToyServedEngine toy;
  ServerOptions options;
  options.allow_lora_loading = true;
  Result<std::unique_ptr<Server>> without = Server::create(options, toy.served());
  EXPECT_EQ(without.status().code(), StatusCode::kInvalidArgument);

  std::unique_ptr<engine::ModelEngine> model_engine =
      testing::start_tiny_model_engine({}, /*adapters=*/true);
  ASSERT_TRUE(
      model_engine->adapters()->register_adapter("tiny", adapter_files().path("alpha.gguf")).ok());
  Result<std::unique_ptr<Server>> clash =
      Server::create({}, serve_model_engine(*model_engine, "tiny"));
  EXPECT_EQ(clash.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(clash.status().message().find("'tiny'"), std::string::npos) << clash.status();
  model_engine->engine().stop();
}

}  // namespace
}  // namespace folio::server
