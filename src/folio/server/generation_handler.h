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
// Server::Handlers: the HTTP handlers of the generation routes (private to the server layer).
//
// One generation request: parse and validate the body (openai_protocol.h), resolve its `model`
// to the base or an adapter (model_catalog.h; unknown: 404), turn the prompt or
// the conversation into token ids and check them against the context, admit it (429 / 503),
// submit it to the engine with a RequestStream (request_stream.h), then either wait for the
// whole answer or stream it as server-sent events through a chunked content provider that
// takes the stream's pieces on the HTTP thread and cancels the request when a write fails.
//
// Thread-safety: handlers run concurrently on the HTTP worker threads; they share only the
// Server's guarded state, the engine (thread-safe submit / cancel) and the tokenizer
// (immutable).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "folio/server/http_exchange.h"
#include "folio/server/openai_protocol.h"
#include "folio/server/request_stream.h"
#include "folio/server/server.h"

namespace folio::server {

// An OpenAI-style JSON error answer.
HttpResponse error_response(int status, std::string_view message, std::string_view type,
                            std::string_view code = {});

class Server::Handlers {
 public:
  explicit Handlers(Server& server) : server_(server) {}

  // Answers through `exchange`: at once when the request is refused, later otherwise.
  void generate(Endpoint endpoint, const HttpRequest& http_request,
                const std::shared_ptr<HttpExchange>& exchange);

 private:
  using SteadyTime = std::chrono::steady_clock::time_point;

  // One admitted request; touched only on its connection's strand.
  struct Accepted {
    Endpoint endpoint = Endpoint::kCompletions;
    ResponseHeader header;
    engine::RequestId id;
    std::shared_ptr<RequestStream> stream;
    std::shared_ptr<HttpExchange> exchange;
    bool streaming = false;
    bool include_usage = false;
    bool first_chunk = true;  // streaming: no text chunk written yet
    bool completion_seen = false;
    std::string text;  // whole answers: the text so far
    std::string route;
    SteadyTime arrival;
  };

  // The engine request for a parsed body: prompt tokens, limits against the context. 400-type
  // errors are kInvalidArgument.
  Result<engine::Request> make_engine_request(const GenerationRequest& parsed) const;
  Result<std::vector<int32_t>> prompt_tokens(const GenerationRequest& parsed) const;
  // On the strand: takes what the engine produced and writes or collects it.
  void drain(const std::shared_ptr<Accepted>& accepted);
  HttpResponse whole_answer(const Accepted& accepted, const engine::Completion& completion) const;
  std::string stream_end(const Accepted& accepted, const engine::Completion& completion) const;
  // Called once per accepted request, when its exchange completes.
  void finish_accepted(const Accepted& accepted, bool delivered);

  Server& server_;
};

}  // namespace folio::server
