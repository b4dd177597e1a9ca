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
#include <string>
#include <string_view>

#include <httplib.h>

#include "folio/server/openai_protocol.h"
#include "folio/server/request_stream.h"
#include "folio/server/server.h"

namespace folio::server {

// Sets an OpenAI-style JSON error body and the status.
void send_error(httplib::Response& response, int status, std::string_view message,
                std::string_view type, std::string_view code = {});

class Server::Handlers {
 public:
  explicit Handlers(Server& server) : server_(server) {}

  void generate(Endpoint endpoint, const httplib::Request& http_request,
                httplib::Response& response);

 private:
  using SteadyTime = std::chrono::steady_clock::time_point;

  struct Accepted {
    Endpoint endpoint;
    ResponseHeader header;
    engine::RequestId id;
    std::shared_ptr<RequestStream> stream;
    bool include_usage = false;
    bool first_chunk = true;  // streaming: nothing written yet (the provider's thread only)
    std::string route;
    SteadyTime arrival;
  };

  // The engine request for a parsed body: prompt tokens, limits against the context. 400-type
  // errors are kInvalidArgument.
  Result<engine::Request> make_engine_request(const GenerationRequest& parsed) const;
  Result<std::vector<int32_t>> prompt_tokens(const GenerationRequest& parsed) const;
  void answer_whole(const Accepted& accepted, httplib::Response& response);
  void answer_stream(std::shared_ptr<Accepted> accepted, httplib::Response& response);
  // Called once per accepted request, when its answer is complete or abandoned.
  void finish_accepted(const Accepted& accepted);

  Server& server_;
};

}  // namespace folio::server
