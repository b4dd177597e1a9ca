#include "folio/server/generation_handler.h"

#include <algorithm>

#include <algorithm>

#include <fmt/format.h>

#include "folio/base/check.h"
#include "folio/server/chat_template.h"
#include "folio/server/grammar.h"
#include "folio/server/json_schema_grammar.h"
#include "folio/server/structured_output.h"

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

// Ids for a choice's calls [first, first + calls.size()), the same whether the answer is
// streamed or whole: derived from the response, the choice and the call's index.
void name_tool_calls(std::vector<ToolCall>& calls, uint64_t response_number, int32_t choice,
                     size_t first) {
  for (size_t call = 0; call < calls.size(); ++call) {
    calls[call].id = make_tool_call_id(response_number * 4096 + static_cast<uint64_t>(choice) * 64 +
                                       first + call);
  }
}

}  // namespace

HttpResponse error_response(int status, std::string_view message, std::string_view type,
                            std::string_view code) {
  HttpResponse response;
  response.status = status;
  response.body = format_error_body(message, type, code);
  return response;
}

Server::Handlers::Handlers(Server& server) : server_(server) {
  Result<std::shared_ptr<const VocabularyIndex>> vocabulary =
      VocabularyIndex::create(*server_.model_.tokenizer);
  // Without it, structured output is refused per request (see constraint_for).
  if (vocabulary.ok()) vocabulary_ = std::move(*vocabulary);
}

Result<std::vector<int32_t>> Server::Handlers::chat_prompt_tokens(
    const GenerationRequest& parsed) const {
  const bool uses_tools =
      !parsed.tools.empty() ||
      std::any_of(parsed.messages.begin(), parsed.messages.end(), [](const ChatMessage& message) {
        return message.role == "tool" || !message.tool_calls.empty();
      });
  std::string text;
  if (uses_tools) {
    FOLIO_ASSIGN_OR_RETURN(
        text, render_chat_with_tools(server_.chat_template_, parsed.messages, parsed.tools));
  } else {
    text = render_chat(server_.chat_template_, parsed.messages);
  }
  // Template markers are control tokens when the vocabulary has them.
  tokenizer::EncodeOptions options;
  options.parse_special = true;
  return server_.model_.tokenizer->encode(text, options);
}

Result<std::vector<int32_t>> Server::Handlers::completion_prompt_tokens(
    const CompletionPrompt& prompt) const {
  const tokenizer::Tokenizer& tokenizer = *server_.model_.tokenizer;
  if (prompt.tokens.empty()) return tokenizer.encode(prompt.text);
  for (int32_t token : prompt.tokens) {
    if (token >= tokenizer.vocab_size()) {
      return invalid_argument("prompt token id {} is outside the vocabulary of {} tokens", token,
                              tokenizer.vocab_size());
    }
  }
  return prompt.tokens;
}

Result<engine::TokenConstraintPtr> Server::Handlers::constraint_for(
    const GenerationRequest& parsed, const std::optional<ToolCallPlan>& plan) const {
  std::optional<Grammar> grammar;
  SchemaOptions schema_options;
  switch (parsed.response_format.type) {
    case ResponseFormat::Type::kText:
      break;
    case ResponseFormat::Type::kJsonObject:
      grammar = json_object_grammar(schema_options);
      break;
    case ResponseFormat::Type::kJsonSchema: {
      schema_options.strict = parsed.response_format.strict;
      Result<Grammar> compiled = compile_json_schema(parsed.response_format.schema, schema_options);
      if (!compiled.ok()) {
        return invalid_argument("'response_format.json_schema.schema': {}",
                                compiled.status().message());
      }
      grammar = std::move(*compiled);
      break;
    }
  }
  if (plan.has_value() && plan->constraint != ToolCallConstraint::kNone) {
    FOLIO_ASSIGN_OR_RETURN(grammar, tool_call_grammar(*plan, parsed.parallel_tool_calls));
  }
  if (!grammar.has_value()) return engine::TokenConstraintPtr();
  if (vocabulary_ == nullptr) {
    return invalid_argument("structured output is not available for this model's vocabulary");
  }
  Result<std::unique_ptr<engine::TokenConstraint>> constraint =
      make_structured_output(std::make_shared<const Grammar>(std::move(*grammar)), vocabulary_,
                             vocabulary_->end_of_generation_tokens());
  if (!constraint.ok()) return invalid_argument("{}", constraint.status().message());
  return engine::TokenConstraintPtr(std::move(*constraint));
}

Result<Server::Handlers::Prepared> Server::Handlers::prepare(
    const GenerationRequest& parsed) const {
  Prepared prepared;
  const bool chat = parsed.endpoint == Endpoint::kChatCompletions;
  std::optional<ToolCallPlan> plan;
  if (chat && !parsed.tools.empty()) {
    FOLIO_ASSIGN_OR_RETURN(
        plan, plan_tool_calls(server_.chat_template_, parsed.tools, parsed.tool_choice));
    prepared.parse_tool_calls = plan->parse_calls;
  }
  FOLIO_ASSIGN_OR_RETURN(engine::TokenConstraintPtr constraint, constraint_for(parsed, plan));
  const int32_t num_prompts = chat ? 1 : static_cast<int32_t>(parsed.prompts.size());
  const int32_t context = server_.model_.context_length;
  const int32_t max_prompt = server_.options_.max_prompt_tokens > 0
                                 ? std::min(server_.options_.max_prompt_tokens, context - 1)
                                 : context - 1;
  for (int32_t prompt_index = 0; prompt_index < num_prompts; ++prompt_index) {
    PromptState prompt;
    if (chat) {
      FOLIO_ASSIGN_OR_RETURN(prompt.tokens, chat_prompt_tokens(parsed));
    } else {
      const CompletionPrompt& given = parsed.prompts[prompt_index];
      FOLIO_ASSIGN_OR_RETURN(prompt.tokens, completion_prompt_tokens(given));
      if (parsed.echo) {
        if (!given.tokens.empty()) {
          FOLIO_ASSIGN_OR_RETURN(prompt.echo_text, server_.model_.tokenizer->decode(given.tokens));
        } else {
          prompt.echo_text = given.text;
        }
      }
    }
    if (prompt.tokens.empty()) return invalid_argument("the prompt encodes to no tokens");
    const auto num_prompt = static_cast<int32_t>(prompt.tokens.size());
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
      const int32_t endpoint_default = chat ? server_.options_.protocol.max_tokens
                                            : server_.options_.protocol.default_max_tokens;
      max_tokens = std::min(endpoint_default, room);
    }
    engine::Request request;
    request.prompt = prompt.tokens;
    request.sampling = parsed.sampling;
    for (const auto& [token, bias] : parsed.logit_bias) {
      request.sampling.logit_bias.push_back(engine::LogitBias{token, bias});
    }
    request.max_tokens = max_tokens;
    request.stop_strings = parsed.stop;
    request.ignore_eos = parsed.ignore_eos;
    // The engine's priorities run the other way (larger is more important).
    request.priority = -parsed.priority.value_or(server_.options_.default_priority);
    request.num_choices = parsed.best_of;
    // best_of ranks choices by their cumulative logprob, which needs logprobs.
    request.logprobs = parsed.logprobs;
    if (parsed.best_of > parsed.n && !request.logprobs.has_value()) request.logprobs = 0;
    // Echo shows the prompt's logprobs; max_tokens 0 only scores the prompt.
    request.prompt_logprobs = parsed.echo && (parsed.logprobs.has_value() || max_tokens == 0);
    if (chat && !parsed.ignore_eos && vocabulary_ != nullptr) {
      // A chat turn ends at the template's end of turn as well as at the model's EOS.
      request.stop_token_ids = vocabulary_->end_of_generation_tokens();
    }
    request.constraint = constraint;  // copies clone it
    prepared.requests.push_back(std::move(request));
    prepared.prompts.push_back(std::move(prompt));
  }
  return prepared;
}

std::string Server::Handlers::token_text(int32_t token) const {
  Result<std::string> bytes = server_.model_.tokenizer->token_bytes(token);
  return bytes.ok() ? std::move(*bytes) : std::string();
}

TokenLogprob Server::Handlers::answer_logprob(const engine::TokenLogprobs& entry) const {
  TokenLogprob answer;
  answer.token = token_text(entry.token);
  answer.logprob = entry.logprob;
  for (const engine::TopLogprob& top : entry.top) {
    answer.top.emplace_back(token_text(top.token), top.logprob);
  }
  return answer;
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
  Result<Prepared> prepared = prepare(*parsed);
  if (!prepared.ok()) {
    return refuse(error_response(400, prepared.status().message(), kInvalidRequestError));
  }
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
  accepted->response_number = static_cast<uint64_t>(server_.next_response_id_.fetch_add(1));
  accepted->header.id =
      fmt::format("{}-{}", endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl",
                  accepted->response_number);
  accepted->header.created = std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
  accepted->header.model = parsed->model;
  accepted->exchange = exchange;
  accepted->streaming = parsed->stream;
  accepted->include_usage = parsed->include_usage;
  accepted->logprobs = parsed->logprobs;
  accepted->echo = parsed->echo;
  accepted->n = parsed->n;
  accepted->best_of = parsed->best_of;
  accepted->parse_tool_calls = prepared->parse_tool_calls;
  accepted->prompts = std::move(prepared->prompts);
  const auto num_prompts = static_cast<int32_t>(accepted->prompts.size());
  accepted->choices.resize(static_cast<size_t>(num_prompts * parsed->best_of));
  for (size_t choice = 0; choice < accepted->choices.size(); ++choice) {
    accepted->choices[choice].prompt = static_cast<int32_t>(choice) / parsed->best_of;
    if (accepted->streaming && accepted->parse_tool_calls) {
      accepted->choices[choice].splitter =
          std::make_unique<ToolCallStreamSplitter>(server_.chat_template_);
    }
  }
  accepted->route = route;
  accepted->arrival = arrival;
  accepted->stream =
      std::make_shared<RequestStream>(static_cast<int32_t>(accepted->choices.size()));
  // The hook runs on the engine thread: it only queues a drain on the connection's strand. It
  // holds `accepted` until the last completion is drained, when the drain clears it.
  accepted->stream->set_notify(
      [this, accepted] { accepted->exchange->post([this, accepted] { drain(accepted); }); });
  for (int32_t prompt = 0; prompt < num_prompts; ++prompt) {
    engine::Request& request = prepared->requests[prompt];
    request.adapter_id = *adapter_id;
    RequestStream::attach(accepted->stream, request, prompt * parsed->best_of, prompt);
    Result<engine::RequestId> id = server_.model_.engine->submit(std::move(request));
    if (id.ok()) {
      accepted->ids.push_back(*id);
      server_.register_running(*id, accepted->stream);
      continue;
    }
    // Nothing of this request may run on: cancel what was submitted, answer the error.
    accepted->stream->set_notify(nullptr);
    for (engine::RequestId submitted : accepted->ids) {
      server_.unregister_running(submitted);
      server_.model_.engine->cancel(submitted);
    }
    server_.release();
    if (id.status().code() == StatusCode::kNotFound) {
      // The adapter was unloaded between resolve() and submit().
      return refuse(error_response(
          404, fmt::format("the model '{}' does not exist (it was just unloaded)", parsed->model),
          kInvalidRequestError, "model_not_found"));
    }
    // Stopped, or its step runner unavailable (a pipeline without a complete worker group):
    // the server's state, not the request's fault.
    const bool stopped = id.status().code() == StatusCode::kFailedPrecondition ||
                         id.status().code() == StatusCode::kUnavailable;
    return refuse(error_response(stopped ? 503 : 400, id.status().message(),
                                 stopped ? kServerError : kInvalidRequestError));
  }
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
    // OpenAI opens each chat choice's stream with the role and empty content.
    std::string out;
    for (int32_t choice = 0; choice < static_cast<int32_t>(accepted->choices.size()); ++choice) {
      out += stream_choice_start(*accepted, choice);
    }
    exchange->write(std::move(out));
  }
}

std::string Server::Handlers::stream_choice_start(Accepted& accepted, int32_t choice) {
  ChoiceState& state = accepted.choices[choice];
  if (state.started) return {};
  if (accepted.echo && accepted.logprobs.has_value() &&
      !accepted.prompts[state.prompt].echo_logprobs_ready) {
    return {};  // echo waits for the prompt's logprobs, which come before any token
  }
  state.started = true;
  ChoiceDelta delta;
  delta.index = choice;
  delta.first = true;
  if (accepted.echo) {
    const PromptState& prompt = accepted.prompts[state.prompt];
    delta.text = prompt.echo_text;
    delta.has_logprobs = accepted.logprobs.has_value();
    delta.logprobs = prompt.echo_logprobs;
  } else if (accepted.endpoint != Endpoint::kChatCompletions) {
    return {};  // a completion's stream opens with its first text
  }
  return format_chunk(accepted.endpoint, accepted.header, delta);
}

std::string Server::Handlers::stream_token(Accepted& accepted, const RequestStream::Token& token) {
  std::string out = stream_choice_start(accepted, token.choice);
  ChoiceState& state = accepted.choices[token.choice];
  ChoiceDelta delta;
  delta.index = token.choice;
  std::vector<TokenLogprob> logprobs;
  if (accepted.logprobs.has_value() && token.logprobs.has_value()) {
    logprobs.push_back(answer_logprob(*token.logprobs));
    delta.has_logprobs = true;
    delta.logprobs = logprobs;
  }
  std::string text = token.text;
  ParsedToolCalls parsed;
  if (state.splitter != nullptr) {
    parsed = state.splitter->push(token.text);
    text = std::move(parsed.content);
    name_tool_calls(parsed.calls, accepted.response_number, token.choice, state.calls.size());
    delta.tool_calls = parsed.calls;
    delta.first_tool_call = static_cast<int32_t>(state.calls.size());
  }
  delta.text = text;
  if (!text.empty() || delta.has_logprobs || !delta.tool_calls.empty()) {
    out += format_chunk(accepted.endpoint, accepted.header, delta);
  }
  state.calls.insert(state.calls.end(), parsed.calls.begin(), parsed.calls.end());
  return out;
}

std::string Server::Handlers::stream_choice_end(Accepted& accepted, int32_t choice) {
  ChoiceState& state = accepted.choices[choice];
  std::string out = stream_choice_start(accepted, choice);
  if (state.splitter != nullptr) {
    ParsedToolCalls rest = state.splitter->finish();
    name_tool_calls(rest.calls, accepted.response_number, choice, state.calls.size());
    if (!rest.content.empty() || !rest.calls.empty()) {
      ChoiceDelta delta;
      delta.index = choice;
      delta.text = rest.content;
      delta.tool_calls = rest.calls;
      delta.first_tool_call = static_cast<int32_t>(state.calls.size());
      out += format_chunk(accepted.endpoint, accepted.header, delta);
    }
    state.calls.insert(state.calls.end(), rest.calls.begin(), rest.calls.end());
  }
  const engine::Completion& completion = *state.completion;
  if (completion.reason == engine::FinishReason::kError ||
      completion.reason == engine::FinishReason::kCancelled) {
    return out;  // stream_end reports the failure once
  }
  out += format_finish_chunk(accepted.endpoint, accepted.header, choice, completion.reason,
                             !state.calls.empty());
  return out;
}

const engine::Completion* Server::Handlers::failure(const Accepted& accepted) const {
  for (const ChoiceState& choice : accepted.choices) {
    if (!choice.completion.has_value()) continue;
    const engine::FinishReason reason = choice.completion->reason;
    if (reason == engine::FinishReason::kError || reason == engine::FinishReason::kCancelled) {
      return &*choice.completion;
    }
  }
  return nullptr;
}

void Server::Handlers::drain(const std::shared_ptr<Accepted>& accepted) {
  if (accepted->finished) return;
  RequestStream::Update update = accepted->stream->take();
  for (const auto& [prompt_index, entries] : update.prompt_logprobs) {
    PromptState& prompt = accepted->prompts[prompt_index];
    // Without logprobs the prompt was only scored for max_tokens 0: nothing to show.
    if (accepted->logprobs.has_value()) {
      // The first prompt token has no context, so no logprob.
      prompt.echo_logprobs.push_back(TokenLogprob{token_text(prompt.tokens[0]), std::nullopt, {}});
      for (const engine::TokenLogprobs& entry : entries) {
        prompt.echo_logprobs.push_back(answer_logprob(entry));
      }
    }
    prompt.echo_logprobs_ready = true;
  }
  std::string out;
  for (const RequestStream::Token& token : update.tokens) {
    if (accepted->streaming) {
      out += stream_token(*accepted, token);
      continue;
    }
    ChoiceState& choice = accepted->choices[token.choice];
    choice.text += token.text;
    if (accepted->logprobs.has_value() && token.logprobs.has_value()) {
      choice.logprobs.push_back(answer_logprob(*token.logprobs));
    }
  }
  for (const engine::Completion& completion : update.completions) {
    accepted->choices[completion.choice].completion = completion;
    if (accepted->streaming) out += stream_choice_end(*accepted, completion.choice);
  }
  if (update.finished && accepted->streaming) out += stream_end(*accepted);
  if (accepted->streaming && !out.empty()) accepted->exchange->write(std::move(out));
  if (!update.finished) return;
  // The engine is done with the request: nothing more will be notified, and the hook's hold on
  // `accepted` (and so on the connection) is let go.
  accepted->finished = true;
  accepted->stream->set_notify(nullptr);
  for (engine::RequestId id : accepted->ids) server_.unregister_running(id);
  if (accepted->streaming) return accepted->exchange->end_stream();
  server_.answer(*accepted->exchange, accepted->route, whole_answer(*accepted));
}

HttpResponse Server::Handlers::whole_answer(Accepted& accepted) const {
  if (const engine::Completion* failed = failure(accepted); failed != nullptr) {
    // An adapter unloaded after the request was accepted and before it started running: the
    // engine could not hold it (kNotFound), and the name is gone. Any other failure (a file
    // that vanished after registration, too) stays a server error.
    if (failed->error.code() == StatusCode::kNotFound &&
        !server_.catalog_.resolve(accepted.header.model).ok()) {
      return error_response(404,
                            fmt::format("the model '{}' was unloaded before the request started",
                                        accepted.header.model),
                            kInvalidRequestError, "model_not_found");
    }
    return error_response(status_of_failure(*failed), failure_message(*failed), kServerError);
  }
  ResponseBody body;
  for (const PromptState& prompt : accepted.prompts) {
    body.prompt_tokens += static_cast<int32_t>(prompt.tokens.size());
  }
  const auto num_prompts = static_cast<int32_t>(accepted.prompts.size());
  for (int32_t prompt = 0; prompt < num_prompts; ++prompt) {
    // best_of: the n choices with the highest cumulative logprob, in that order; otherwise all.
    std::vector<int32_t> order(static_cast<size_t>(accepted.best_of));
    for (int32_t k = 0; k < accepted.best_of; ++k) order[k] = prompt * accepted.best_of + k;
    if (accepted.best_of > accepted.n) {
      std::stable_sort(order.begin(), order.end(), [&](int32_t left, int32_t right) {
        return accepted.choices[left].completion->cumulative_logprob.value_or(0) >
               accepted.choices[right].completion->cumulative_logprob.value_or(0);
      });
      order.resize(static_cast<size_t>(accepted.n));
    }
    for (int32_t choice_index : order) {
      ChoiceState& state = accepted.choices[choice_index];
      body.completion_tokens += state.completion->num_generated_tokens;
      ChoiceResult result;
      result.index = static_cast<int32_t>(body.choices.size());
      result.reason = state.completion->reason;
      result.has_logprobs = accepted.logprobs.has_value();
      const PromptState& prompt_state = accepted.prompts[prompt];
      if (accepted.echo) {
        result.text = prompt_state.echo_text;
        result.logprobs = prompt_state.echo_logprobs;
      }
      std::string text = std::move(state.text);
      if (accepted.parse_tool_calls) {
        ParsedToolCalls parsed = parse_tool_calls(server_.chat_template_, text);
        text = std::move(parsed.content);
        name_tool_calls(parsed.calls, accepted.response_number, choice_index, 0);
        result.tool_calls = std::move(parsed.calls);
      }
      result.text += text;
      result.logprobs.insert(result.logprobs.end(), state.logprobs.begin(), state.logprobs.end());
      body.choices.push_back(std::move(result));
    }
  }
  HttpResponse response;
  response.body = format_response(accepted.endpoint, accepted.header, body);
  return response;
}

std::string Server::Handlers::stream_end(const Accepted& accepted) const {
  std::string out;
  if (const engine::Completion* failed = failure(accepted); failed != nullptr) {
    out += format_error_event(failure_message(*failed), kServerError);
  } else if (accepted.include_usage) {
    int32_t prompt_tokens = 0, completion_tokens = 0;
    for (const PromptState& prompt : accepted.prompts) {
      prompt_tokens += static_cast<int32_t>(prompt.tokens.size());
    }
    for (const ChoiceState& choice : accepted.choices) {
      completion_tokens += choice.completion->num_generated_tokens;
    }
    out += format_usage_chunk(accepted.endpoint, accepted.header, prompt_tokens, completion_tokens);
  }
  out += kStreamDone;
  return out;
}

void Server::Handlers::finish_accepted(const Accepted& accepted, bool delivered) {
  // Not delivered: the client went away (or the server stopped) first. Cancelling a finished
  // request is a no-op, so this is safe whatever the engine did meanwhile.
  if (!delivered) {
    for (engine::RequestId id : accepted.ids) server_.model_.engine->cancel(id);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - accepted.arrival).count();
  server_.metrics_->on_generation_done(accepted.route, seconds);
  server_.release();
}

HttpResponse Server::Handlers::tokenize(const HttpRequest& http_request) const {
  Result<TokenizeRequest> parsed =
      parse_tokenize_request(http_request.body, server_.options_.protocol);
  if (!parsed.ok()) return error_response(400, parsed.status().message(), kInvalidRequestError);
  if (!parsed->model.empty() && !server_.catalog_.resolve(parsed->model).ok()) {
    return error_response(404, fmt::format("the model '{}' does not exist", parsed->model),
                          kInvalidRequestError, "model_not_found");
  }
  const tokenizer::Tokenizer& tokenizer = *server_.model_.tokenizer;
  std::vector<int32_t> tokens;
  if (parsed->prompt.has_value()) {
    tokenizer::EncodeOptions options;
    options.add_special = parsed->add_special_tokens;
    tokens = tokenizer.encode(*parsed->prompt, options);
  } else {
    GenerationRequest conversation;
    conversation.endpoint = Endpoint::kChatCompletions;
    conversation.messages = std::move(parsed->messages);
    Result<std::vector<int32_t>> rendered = chat_prompt_tokens(conversation);
    if (!rendered.ok()) {
      return error_response(400, rendered.status().message(), kInvalidRequestError);
    }
    tokens = std::move(*rendered);
  }
  HttpResponse response;
  response.body = format_tokenize_response(tokens, server_.model_.context_length);
  return response;
}

HttpResponse Server::Handlers::detokenize(const HttpRequest& http_request) const {
  Result<DetokenizeRequest> parsed =
      parse_detokenize_request(http_request.body, server_.options_.protocol);
  if (!parsed.ok()) return error_response(400, parsed.status().message(), kInvalidRequestError);
  if (!parsed->model.empty() && !server_.catalog_.resolve(parsed->model).ok()) {
    return error_response(404, fmt::format("the model '{}' does not exist", parsed->model),
                          kInvalidRequestError, "model_not_found");
  }
  // The text the tokens were encoded from: SentencePiece's added leading space is dropped.
  Result<std::string> text = server_.model_.tokenizer->decode(parsed->tokens);
  if (!text.ok()) return error_response(400, text.status().message(), kInvalidRequestError);
  HttpResponse response;
  response.body = format_detokenize_response(*text);
  return response;
}

}  // namespace folio::server
