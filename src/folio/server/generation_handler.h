// Server::Handlers: the generation routes (private to the server layer).
//
// One generation request: parse and validate the body (openai_protocol.h), resolve its `model`
// to the base or an adapter (model_catalog.h; unknown: 404), turn the prompt or the
// conversation into token ids and check them against the context, admit it (429 / 503), submit
// it to the engine with a RequestStream (request_stream.h) whose notify hook posts a drain to
// the connection's strand. Each drain takes what the engine produced: a stream writes it as
// server-sent events at once; a whole answer collects it and responds at the completion. The
// exchange's completion (answer written, or client gone) releases the request's slot, and a
// client gone before the engine finished cancels the engine request.
//
// Thread-safety: generate() and the drains run on connection strands (io threads), concurrently
// for different connections; a request's drains and its exchange's completion run on its one
// strand, so its Accepted state needs no lock. They share only the Server's guarded state, the
// engine (thread-safe submit / cancel) and the tokenizer (immutable).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "folio/server/http_exchange.h"
#include "folio/server/openai_protocol.h"
#include "folio/server/request_stream.h"
#include "folio/server/server.h"
#include "folio/server/tool_calls.h"
#include "folio/server/vocabulary_index.h"

namespace folio::server {

// An OpenAI-style JSON error answer.
HttpResponse error_response(int status, std::string_view message, std::string_view type,
                            std::string_view code = {});

class Server::Handlers {
 public:
  explicit Handlers(Server& server);

  // Answers through `exchange`: at once when the request is refused, later otherwise.
  void generate(Endpoint endpoint, const HttpRequest& http_request,
                const std::shared_ptr<HttpExchange>& exchange);
  // POST /tokenize and /detokenize: answered at once.
  HttpResponse tokenize(const HttpRequest& http_request) const;
  HttpResponse detokenize(const HttpRequest& http_request) const;

 private:
  using SteadyTime = std::chrono::steady_clock::time_point;

  // One prompt of an accepted request.
  struct PromptState {
    std::vector<int32_t> tokens;
    std::string echo_text;                    // completions with echo: the prompt as text
    std::vector<TokenLogprob> echo_logprobs;  // with echo and logprobs: every prompt token's
    bool echo_logprobs_ready = false;
  };
  // One choice of an accepted request, as the answer shows it.
  struct ChoiceState {
    int32_t prompt = 0;
    std::string text;  // content (tool calls taken out when they are parsed)
    std::vector<TokenLogprob> logprobs;
    std::vector<ToolCall> calls;
    std::optional<engine::Completion> completion;
    bool started = false;  // streaming: its first event (role, echo) is written
    std::unique_ptr<ToolCallStreamSplitter> splitter;  // streaming with tool calls
  };
  // One admitted request; touched only on its connection's strand.
  struct Accepted {
    Endpoint endpoint = Endpoint::kCompletions;
    ResponseHeader header;
    std::vector<engine::RequestId> ids;  // one engine request per prompt
    std::shared_ptr<RequestStream> stream;
    std::shared_ptr<HttpExchange> exchange;
    bool streaming = false;
    bool include_usage = false;
    bool finished = false;            // every choice ended (drained)
    std::optional<int32_t> logprobs;  // what the client asked for (alternatives per token)
    bool echo = false;
    int32_t n = 1;
    int32_t best_of = 1;
    bool parse_tool_calls = false;
    uint64_t response_number = 0;  // seeds tool call ids
    std::vector<PromptState> prompts;
    std::vector<ChoiceState> choices;  // prompt-major: prompt p's are [p * best_of, ...)
    std::string route;
    SteadyTime arrival;
  };
  // What a parsed body becomes before admission.
  struct Prepared {
    std::vector<engine::Request> requests;  // one per prompt
    std::vector<PromptState> prompts;
    bool parse_tool_calls = false;
  };

  // The engine requests for a parsed body: prompt tokens, limits against the context, logit
  // bias, the structured-output constraint. 400-type errors are kInvalidArgument.
  Result<Prepared> prepare(const GenerationRequest& parsed) const;
  Result<std::vector<int32_t>> chat_prompt_tokens(const GenerationRequest& parsed) const;
  Result<std::vector<int32_t>> completion_prompt_tokens(const CompletionPrompt& prompt) const;
  // The constraint of the request's structured output or forced tool calls; null for none.
  Result<engine::TokenConstraintPtr> constraint_for(const GenerationRequest& parsed,
                                                    const std::optional<ToolCallPlan>& plan) const;
  TokenLogprob answer_logprob(const engine::TokenLogprobs& entry) const;
  std::string token_text(int32_t token) const;

  // On the strand: takes what the engine produced and writes or collects it.
  void drain(const std::shared_ptr<Accepted>& accepted);
  // Streaming: the events of one choice's new token / its end.
  std::string stream_token(Accepted& accepted, const RequestStream::Token& token);
  std::string stream_choice_start(Accepted& accepted, int32_t choice);
  std::string stream_choice_end(Accepted& accepted, int32_t choice);
  std::string stream_end(const Accepted& accepted) const;
  HttpResponse whole_answer(Accepted& accepted) const;
  // The first failed choice, if any.
  const engine::Completion* failure(const Accepted& accepted) const;
  // Called once per accepted request, when its exchange completes.
  void finish_accepted(const Accepted& accepted, bool delivered);

  Server& server_;
  std::shared_ptr<const VocabularyIndex> vocabulary_;  // structured output's token trie
};

}  // namespace folio::server
