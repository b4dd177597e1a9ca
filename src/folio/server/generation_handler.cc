#include "folio/server/generation_handler.h"

#include <algorithm>

#include <fmt/format.h>

#include "folio/base/check.h"

namespace folio::server {
namespace {

std::string_view route_of(Endpoint endpoint) {
  switch (endpoint) {
    case Endpoint::kCompletions:
      return "/v1/completions";
    case Endpoint::kChatCompletions:
      return "/v1/chat/completions";
  }
  return "other";
}

// The HTTP status of a request the engine ended with an error (or cancelled for shutdown).
int status_of_failure(const engine::Completion& completion) {
  if (completion.reason == engine::FinishReason::kCancelled) return 503;
  return completion.error.code() == StatusCode::kUnavailable ? 503 : 500;
}

std::string failure_message(const engine::Completion& completion) {
  if (completion.reason == engine::FinishReason::kCancelled) {
    return "the request was cancelled: the server is shutting down";
  }
  return fmt::format("the engine failed the request: {}", completion.error.to_string());
}

GenerationResult result_of(const engine::Completion& completion, std::string text) {
  GenerationResult result;
  result.text = std::move(text);
  result.reason = completion.reason;
  result.prompt_tokens = completion.num_prompt_tokens;
  result.completion_tokens = completion.num_generated_tokens;
  return result;
}

}  // namespace

HttpResponse error_response(int status, std::string_view message, std::string_view type,
                            std::string_view code) {
  HttpResponse response;
  response.status = status;
  response.body = format_error_body(message, type, code);
  return response;
}

Result<std::vector<int32_t>> Server::Handlers::prompt_tokens(
    const GenerationRequest& parsed) const {
  const tokenizer::Tokenizer& tokenizer = *server_.model_.tokenizer;
  std::vector<int32_t> tokens;
  if (parsed.endpoint == Endpoint::kChatCompletions) {
    const bool plain =
        parsed.best_of == 1 && !parsed.logprobs.has_value() && parsed.logit_bias.empty() &&
        parsed.response_format.type == ResponseFormat::Type::kText && parsed.tools.empty() &&
        std::all_of(parsed.messages.begin(), parsed.messages.end(), [](const ChatMessage& message) {
          return message.role != "tool" && message.tool_calls.empty();
        });
    if (!plain) {
      return invalid_argument(
          "n, logprobs, logit_bias, response_format and tools are not served "
          "yet");
    }
    // Template markers are control tokens when the vocabulary has them.
    tokenizer::EncodeOptions options;
    options.parse_special = true;
    tokens = tokenizer.encode(render_chat(server_.chat_template_, parsed.messages), options);
  } else {
    // The protocol reads every form; the engine path below serves one plain prompt.
    const bool plain = parsed.prompts.size() == 1 && parsed.best_of == 1 &&
                       !parsed.logprobs.has_value() && !parsed.echo && parsed.logit_bias.empty();
    if (!plain) {
      return invalid_argument(
          "several prompts, n, best_of, logprobs, echo and logit_bias are not "
          "served yet");
    }
    const CompletionPrompt& prompt = parsed.prompts[0];
    if (!prompt.tokens.empty()) {
      for (int32_t token : prompt.tokens) {
        if (token >= tokenizer.vocab_size()) {
          return invalid_argument("prompt token id {} is outside the vocabulary of {} tokens",
                                  token, tokenizer.vocab_size());
        }
      }
      tokens = prompt.tokens;
    } else {
      tokens = tokenizer.encode(prompt.text);
    }
  }
  if (tokens.empty()) return invalid_argument("the prompt encodes to no tokens");
  return tokens;
}

Result<engine::Request> Server::Handlers::make_engine_request(
    const GenerationRequest& parsed) const {
  FOLIO_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, prompt_tokens(parsed));
  const auto num_prompt = static_cast<int32_t>(tokens.size());
  const int32_t context = server_.model_.context_length;
  const int32_t max_prompt = server_.options_.max_prompt_tokens > 0
                                 ? std::min(server_.options_.max_prompt_tokens, context - 1)
                                 : context - 1;
  if (num_prompt > max_prompt) {
    return invalid_argument(
        "the prompt has {} tokens, more than this server accepts ({}; the model's maximum "
        "context length is {} tokens)",
        num_prompt, max_prompt, context);
  }
  const int32_t room = context - num_prompt;
  int32_t max_tokens = 0;
  if (parsed.max_tokens.has_value()) {
    max_tokens = *parsed.max_tokens;
    if (max_tokens > room) {
      return invalid_argument(
          "this model's maximum context length is {} tokens; the request asks for {} tokens "
          "({} in the prompt, {} to generate)",
          context, num_prompt + max_tokens, num_prompt, max_tokens);
    }
  } else {
    const int32_t endpoint_default = parsed.endpoint == Endpoint::kCompletions
                                         ? server_.options_.protocol.default_max_tokens
                                         : server_.options_.protocol.max_tokens;
    max_tokens = std::min(endpoint_default, room);
  }
  engine::Request request;
  request.prompt = std::move(tokens);
  request.sampling = parsed.sampling;
  request.max_tokens = max_tokens;
  request.stop_strings = parsed.stop;
  request.ignore_eos = parsed.ignore_eos;
  return request;
}

void Server::Handlers::generate(Endpoint endpoint, const HttpRequest& http_request,
                                const std::shared_ptr<HttpExchange>& exchange) {
  const SteadyTime arrival = std::chrono::steady_clock::now();
  const std::string_view route = route_of(endpoint);
  auto refuse = [&](HttpResponse response) {
    server_.answer(*exchange, route, std::move(response));
  };
  Result<GenerationRequest> parsed =
      parse_generation_request(endpoint, http_request.body, server_.options_.protocol);
  if (!parsed.ok()) {
    return refuse(error_response(400, parsed.status().message(), kInvalidRequestError));
  }
  // OpenAI answers an unknown model with 404 and code model_not_found.
  Result<int64_t> adapter_id = server_.catalog_.resolve(parsed->model);
  if (!adapter_id.ok()) {
    return refuse(error_response(404, adapter_id.status().message(), kInvalidRequestError,
                                 "model_not_found"));
  }
  Result<engine::Request> request = make_engine_request(*parsed);
  if (!request.ok()) {
    return refuse(error_response(400, request.status().message(), kInvalidRequestError));
  }
  request->adapter_id = *adapter_id;
  switch (server_.admit()) {
    case Admission::kAdmitted:
      break;
    case Admission::kShuttingDown:
      return refuse(error_response(503, "the server is shutting down", kServerError));
    case Admission::kQueueFull:
      return refuse(
          error_response(429,
                         fmt::format("too many requests in flight (limit {}); retry later",
                                     server_.options_.max_pending_requests),
                         kRateLimitError));
  }
  auto accepted = std::make_shared<Accepted>();
  accepted->endpoint = endpoint;
  accepted->header.id =
      fmt::format("{}-{}", endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl",
                  server_.next_response_id_.fetch_add(1));
  accepted->header.created = std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
  accepted->header.model = parsed->model;
  accepted->stream = std::make_shared<RequestStream>();
  accepted->exchange = exchange;
  accepted->streaming = parsed->stream;
  accepted->include_usage = parsed->include_usage;
  accepted->route = route;
  accepted->arrival = arrival;
  // The hook runs on the engine thread: it only queues a drain on the connection's strand. It
  // holds `accepted` until the completion is drained, when the drain clears it.
  accepted->stream->set_notify(
      [this, accepted] { accepted->exchange->post([this, accepted] { drain(accepted); }); });
  RequestStream::attach(accepted->stream, *request);
  Result<engine::RequestId> id = server_.model_.engine->submit(std::move(*request));
  if (!id.ok()) {
    accepted->stream->set_notify(nullptr);
    server_.release();
    if (id.status().code() == StatusCode::kNotFound) {
      // The adapter was unloaded between resolve() and submit().
      return refuse(error_response(
          404, fmt::format("the model '{}' does not exist (it was just unloaded)", parsed->model),
          kInvalidRequestError, "model_not_found"));
    }
    const bool stopped = id.status().code() == StatusCode::kFailedPrecondition;
    return refuse(error_response(stopped ? 503 : 400, id.status().message(),
                                 stopped ? kServerError : kInvalidRequestError));
  }
  accepted->id = *id;
  server_.register_running(*id, accepted->stream);
  // Drains run on this strand after this handler returns, so the callback is in place first.
  exchange->on_complete(
      [this, accepted](bool delivered) { finish_accepted(*accepted, delivered); });
  if (!accepted->streaming) return;
  HttpResponse head;
  head.content_type = "text/event-stream";
  head.headers.emplace_back("Cache-Control", "no-cache");
  server_.metrics_->on_response(route, 200);
  exchange->begin_stream(std::move(head));
  if (endpoint == Endpoint::kChatCompletions) {
    // OpenAI opens a chat stream with the role and empty content.
    exchange->write(format_text_chunk(endpoint, accepted->header, "", /*first=*/true));
    accepted->first_chunk = false;
  }
}

void Server::Handlers::drain(const std::shared_ptr<Accepted>& accepted) {
  if (accepted->completion_seen) return;
  RequestStream::Update update = accepted->stream->take();
  if (accepted->streaming) {
    std::string out;
    for (const std::string& piece : update.pieces) {
      out += format_text_chunk(accepted->endpoint, accepted->header, piece, accepted->first_chunk);
      accepted->first_chunk = false;
    }
    if (update.completion.has_value()) out += stream_end(*accepted, *update.completion);
    accepted->exchange->write(std::move(out));
  } else {
    for (const std::string& piece : update.pieces) accepted->text += piece;
  }
  if (!update.completion.has_value()) return;
  // The engine is done with the request: nothing more will be notified, and the hook's hold on
  // `accepted` (and so on the connection) is let go.
  accepted->completion_seen = true;
  accepted->stream->set_notify(nullptr);
  server_.unregister_running(accepted->id);
  if (accepted->streaming) return accepted->exchange->end_stream();
  server_.answer(*accepted->exchange, accepted->route, whole_answer(*accepted, *update.completion));
}

HttpResponse Server::Handlers::whole_answer(const Accepted& accepted,
                                            const engine::Completion& completion) const {
  if (completion.reason == engine::FinishReason::kError ||
      completion.reason == engine::FinishReason::kCancelled) {
    // An adapter unloaded after the request was accepted and before it started running: the
    // engine could not hold it (kNotFound), and the name is gone. Any other failure (a file
    // that vanished after registration, too) stays a server error.
    if (completion.error.code() == StatusCode::kNotFound &&
        !server_.catalog_.resolve(accepted.header.model).ok()) {
      return error_response(404,
                            fmt::format("the model '{}' was unloaded before the request started",
                                        accepted.header.model),
                            kInvalidRequestError, "model_not_found");
    }
    return error_response(status_of_failure(completion), failure_message(completion), kServerError);
  }
  HttpResponse response;
  response.body =
      format_response(accepted.endpoint, accepted.header, result_of(completion, accepted.text));
  return response;
}

std::string Server::Handlers::stream_end(const Accepted& accepted,
                                         const engine::Completion& completion) const {
  std::string out;
  if (completion.reason == engine::FinishReason::kError ||
      completion.reason == engine::FinishReason::kCancelled) {
    out += format_error_event(failure_message(completion), kServerError);
  } else {
    out += format_finish_chunk(accepted.endpoint, accepted.header, completion.reason);
    if (accepted.include_usage) {
      out += format_usage_chunk(accepted.endpoint, accepted.header, result_of(completion, {}));
    }
  }
  out += kStreamDone;
  return out;
}

void Server::Handlers::finish_accepted(const Accepted& accepted, bool delivered) {
  // Not delivered: the client went away (or the server stopped) first. Cancelling a finished
  // request is a no-op, so this is safe whatever the engine did meanwhile.
  if (!delivered) server_.model_.engine->cancel(accepted.id);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - accepted.arrival).count();
  server_.metrics_->on_generation_done(accepted.route, seconds);
  server_.release();
}

}  // namespace folio::server
