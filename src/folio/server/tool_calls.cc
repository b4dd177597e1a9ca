#include "folio/server/tool_calls.h"

#include <optional>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "folio/base/check.h"
#include "folio/server/json_schema_grammar.h"

namespace folio::server {
namespace {

// Keys in the order they were written: a call's arguments keep the model's order, and a schema
// keeps the client's.
using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t first_non_space(std::string_view text, size_t from = 0) {
  while (from < text.size() && is_space(text[from])) ++from;
  return from;
}

std::optional<OrderedJson> parse_json(std::string_view text) {
  OrderedJson value = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

std::string compact(const OrderedJson& value) {
  return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

// One call's JSON object (see the header's parsing rules); nullopt when malformed.
std::optional<ToolCall> parse_call_object(std::string_view json_text,
                                          std::string_view arguments_key) {
  std::optional<OrderedJson> object = parse_json(json_text);
  if (!object || !object->is_object()) return std::nullopt;
  const auto name = object->find("name");
  if (name == object->end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  const std::string_view other_key = arguments_key == "arguments" ? "parameters" : "arguments";
  auto arguments = object->find(arguments_key);
  if (arguments == object->end()) arguments = object->find(other_key);
  std::string arguments_text = "{}";
  if (arguments != object->end()) {
    if (!arguments->is_object()) return std::nullopt;
    arguments_text = compact(*arguments);
  }
  ToolCall call;
  call.name = name->get<std::string>();
  call.arguments = std::move(arguments_text);
  return call;
}

// chatml: calls in <tool_call> envelopes anywhere in the text.
ParsedToolCalls parse_chatml(std::string_view text) {
  ParsedToolCalls out;
  size_t position = 0;
  bool after_call = false;
  while (true) {
    const size_t open = text.find(kCallOpen, position);
    std::string_view segment = text.substr(
        position, open == std::string_view::npos ? std::string_view::npos : open - position);
    if (after_call) segment.remove_prefix(first_non_space(segment));
    if (open == std::string_view::npos) {
      out.content += segment;
      return out;
    }
    const size_t body = open + kCallOpen.size();
    const size_t close = text.find(kCallClose, body);
    if (close == std::string_view::npos) {  // unterminated: content
      out.content += segment;
      out.content += text.substr(open);
      return out;
    }
    const size_t end = close + kCallClose.size();
    std::optional<ToolCall> call = parse_call_object(text.substr(body, close - body), "arguments");
    if (call) {
      while (!segment.empty() && is_space(segment.back())) segment.remove_suffix(1);
      out.content += segment;
      out.calls.push_back(std::move(*call));
      after_call = true;
    } else {
      out.content += segment;
      out.content += text.substr(open, end - open);
      after_call = false;
    }
    position = end;
  }
}

// llama3.1: the whole answer is one call, or it is content.
ParsedToolCalls parse_llama(std::string_view text) {
  size_t start = first_non_space(text);
  if (text.substr(start).starts_with(kPythonTag)) {
    start = first_non_space(text, start + kPythonTag.size());
  }
  if (start < text.size() && text[start] == '{') {
    std::optional<ToolCall> call = parse_call_object(text.substr(start), "parameters");
    if (call) return ParsedToolCalls{.content = {}, .calls = {std::move(*call)}};
  }
  return ParsedToolCalls{.content = std::string(text), .calls = {}};
}

// The earliest position from which `text` is a proper prefix of `marker` (text.size() if none):
// the part that may still grow into the marker.
size_t partial_marker_start(std::string_view text, std::string_view marker) {
  const size_t from = text.size() >= marker.size() ? text.size() - marker.size() + 1 : 0;
  for (size_t i = from; i < text.size(); ++i) {
    if (marker.starts_with(text.substr(i))) return i;
  }
  return text.size();
}

// A function's entry in the call schema.
OrderedJson call_object_schema(const std::string& name, OrderedJson parameters,
                               const std::string& arguments_key) {
  OrderedJson properties = OrderedJson::object();
  properties["name"] = OrderedJson{{"const", name}};
  properties[arguments_key] = std::move(parameters);
  OrderedJson schema = OrderedJson::object();
  schema["type"] = "object";
  schema["properties"] = std::move(properties);
  schema["required"] = OrderedJson::array({"name", arguments_key});
  schema["additionalProperties"] = false;
  return schema;
}

}  // namespace

Result<ToolCallFormat> tool_call_format(ChatTemplate chat_template) {
  switch (chat_template) {
    case ChatTemplate::kChatMl:
      return ToolCallFormat{.call_prefix = "<tool_call>\n",
                            .call_suffix = "\n</tool_call>",
                            .call_separator = "\n",
                            .trigger = std::string(kCallOpen),
                            .arguments_key = "arguments",
                            .multiple_calls = true,
                            .call_is_whole_answer = false};
    case ChatTemplate::kLlama31:
      return ToolCallFormat{.call_prefix = "",
                            .call_suffix = "",
                            .call_separator = "",
                            .trigger = "{",
                            .arguments_key = "parameters",
                            .multiple_calls = false,
                            .call_is_whole_answer = true};
    case ChatTemplate::kLlama3:
    case ChatTemplate::kLlama2:
    case ChatTemplate::kMistralV1:
    case ChatTemplate::kMistralV3:
    case ChatTemplate::kZephyr:
    case ChatTemplate::kPhi3:
    case ChatTemplate::kGemma:
      break;
  }
  return invalid_argument(
      "the chat template '{}' defines no tool calling; tools need chatml (Qwen 2.5/3, "
      "Hermes-style) or llama3.1 (Llama 3.1-3.3)",
      chat_template_name(chat_template));
}

Result<ToolCallPlan> plan_tool_calls(ChatTemplate chat_template,
                                     std::span<const ToolDefinition> tools,
                                     const ToolChoice& choice) {
  ToolCallPlan plan;
  FOLIO_ASSIGN_OR_RETURN(plan.format, tool_call_format(chat_template));
  OrderedJson alternatives = OrderedJson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    std::optional<OrderedJson> parameters = parse_json(tools[i].parameters_schema);
    if (!parameters || !parameters->is_object()) {
      return invalid_argument(
          "'tools[{}].function.parameters' (function '{}') must be a JSON object", i,
          tools[i].name);
    }
    if (choice.mode == ToolChoice::Mode::kFunction && tools[i].name != choice.function) {
      continue;
    }
    alternatives.push_back(
        call_object_schema(tools[i].name, std::move(*parameters), plan.format.arguments_key));
  }
  switch (choice.mode) {
    case ToolChoice::Mode::kNone:
      plan.constraint = ToolCallConstraint::kNone;
      plan.parse_calls = false;
      return plan;
    case ToolChoice::Mode::kAuto:
      plan.constraint = ToolCallConstraint::kAfterTrigger;
      break;
    case ToolChoice::Mode::kRequired:
    case ToolChoice::Mode::kFunction:
      plan.constraint = ToolCallConstraint::kFromStart;
      break;
  }
  if (alternatives.empty()) {
    if (choice.mode == ToolChoice::Mode::kFunction) {
      return invalid_argument("'tool_choice' names function '{}', which is not in 'tools'",
                              choice.function);
    }
    return invalid_argument("'tool_choice' other than \"none\" needs 'tools'");
  }
  plan.parse_calls = true;
  plan.call_schema = alternatives.size() == 1
                         ? compact(alternatives[0])
                         : compact(OrderedJson{{"anyOf", std::move(alternatives)}});
  return plan;
}

ParsedToolCalls parse_tool_calls(ChatTemplate chat_template, std::string_view generated_text) {
  switch (chat_template) {
    case ChatTemplate::kChatMl:
      return parse_chatml(generated_text);
    case ChatTemplate::kLlama31:
      return parse_llama(generated_text);
    case ChatTemplate::kLlama3:
    case ChatTemplate::kLlama2:
    case ChatTemplate::kMistralV1:
    case ChatTemplate::kMistralV3:
    case ChatTemplate::kZephyr:
    case ChatTemplate::kPhi3:
    case ChatTemplate::kGemma:
      break;
  }
  return ParsedToolCalls{.content = std::string(generated_text), .calls = {}};
}

std::string make_tool_call_id(uint64_t seed) {
  constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  uint64_t state = seed;
  for (int word = 0; word < 4; ++word) {
    // splitmix64: every seed gives a well-mixed stream; 6 characters from each 64-bit word.
    state += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    for (int i = 0; i < 6; ++i) {
      id += kAlphabet[z % kAlphabet.size()];
      z /= kAlphabet.size();
    }
  }
  return id;
}

ToolCallStreamSplitter::ToolCallStreamSplitter(ChatTemplate chat_template)
    : chat_template_(chat_template), state_(State::kPassThrough) {
  switch (chat_template) {
    case ChatTemplate::kChatMl:
      state_ = State::kText;
      break;
    case ChatTemplate::kLlama31:
      state_ = State::kUndecided;
      break;
    case ChatTemplate::kLlama3:
    case ChatTemplate::kLlama2:
    case ChatTemplate::kMistralV1:
    case ChatTemplate::kMistralV3:
    case ChatTemplate::kZephyr:
    case ChatTemplate::kPhi3:
    case ChatTemplate::kGemma:
      break;
  }
}

// chatml. kText: pending_ holds the whitespace and partial "<tool_call>" at its end that may
// precede a call. kInCall: pending_ is the whitespace before the trigger, the trigger and the
// envelope so far.
void ToolCallStreamSplitter::advance_chatml(ParsedToolCalls& out) {
  while (true) {
    if (state_ == State::kText) {
      if (after_call_) {
        pending_.erase(0, first_non_space(pending_));
        if (pending_.empty()) return;
        after_call_ = false;
      }
      const size_t open = pending_.find(kCallOpen);
      size_t release = open != std::string::npos ? open : partial_marker_start(pending_, kCallOpen);
      while (release > 0 && is_space(pending_[release - 1])) --release;
      out.content.append(pending_, 0, release);
      pending_.erase(0, release);
      if (open == std::string::npos) return;
      state_ = State::kInCall;
      continue;
    }
    FOLIO_CHECK(state_ == State::kInCall, "chatml splitter in a llama state");
    const size_t open = pending_.find(kCallOpen);
    const size_t body = open + kCallOpen.size();
    const size_t close = pending_.find(kCallClose, body);
    if (close == std::string::npos) return;
    const size_t end = close + kCallClose.size();
    std::optional<ToolCall> call =
        parse_call_object(std::string_view(pending_).substr(body, close - body), "arguments");
    if (call) {
      out.calls.push_back(std::move(*call));
    } else {
      out.content.append(pending_, 0, end);
    }
    after_call_ = call.has_value();
    pending_.erase(0, end);
    state_ = State::kText;
  }
}

// llama3.1: decide from the answer's first visible characters whether it may be a call.
void ToolCallStreamSplitter::advance_llama(ParsedToolCalls& out) {
  if (state_ != State::kUndecided) return;
  size_t start = first_non_space(pending_);
  const std::string_view rest = std::string_view(pending_).substr(start);
  if (rest.starts_with(kPythonTag)) {
    start = first_non_space(pending_, start + kPythonTag.size());
  } else if (kPythonTag.starts_with(rest)) {
    return;  // empty, or part of the tag: wait
  }
  if (start == pending_.size()) return;
  if (pending_[start] == '{') {
    state_ = State::kWholeAnswer;
    return;
  }
  state_ = State::kPassThrough;
  out.content += pending_;
  pending_.clear();
}

ParsedToolCalls ToolCallStreamSplitter::push(std::string_view piece) {
  FOLIO_CHECK(state_ != State::kFinished, "ToolCallStreamSplitter::push after finish");
  ParsedToolCalls out;
  switch (state_) {
    case State::kPassThrough:
      out.content = std::string(piece);
      return out;
    case State::kText:
    case State::kInCall:
      pending_ += piece;
      advance_chatml(out);
      return out;
    case State::kUndecided:
    case State::kWholeAnswer:
      pending_ += piece;
      advance_llama(out);
      return out;
    case State::kFinished:
      break;
  }
  return out;
}

ParsedToolCalls ToolCallStreamSplitter::finish() {
  FOLIO_CHECK(state_ != State::kFinished, "ToolCallStreamSplitter::finish called twice");
  ParsedToolCalls out;
  if (state_ == State::kWholeAnswer) {
    out = parse_llama(pending_);
  } else {
    out.content = std::move(pending_);  // whitespace, a partial trigger, an unterminated call
  }
  pending_.clear();
  state_ = State::kFinished;
  return out;
}

// The answers a tool plan allows. "required" / a named function (kFromStart): the family's
// call envelope around the call schema, several separated calls where the family allows them
// and the client did not ask for one at a time. "auto" (kAfterTrigger): free text in which
// every occurrence of the trigger opens a call held to the schema (chatml: text and calls
// interleaved; llama3.1, where a call is the whole answer: either text that does not open like
// a call, or one call).
Result<Grammar> tool_call_grammar(const ToolCallPlan& plan, bool parallel_tool_calls) {
  Result<Grammar> object = compile_json_schema(plan.call_schema);
  if (!object.ok()) return invalid_argument("'tools': {}", object.status().message());
  const ToolCallFormat& format = plan.format;
  const Grammar call =
      sequence({literal(format.call_prefix), *object, literal(format.call_suffix)});
  const bool several = format.multiple_calls && parallel_tool_calls;
  GrammarBuilder builder;
  const RuleId one = builder.add_grammar(call);
  const RuleId answer = builder.add_rule("answer");
  switch (plan.constraint) {
    case ToolCallConstraint::kNone:
      return invalid_argument("tool_choice 'none' constrains nothing");
    case ToolCallConstraint::kFromStart: {
      builder.add_alternative(answer, {GrammarSymbol::rule(one)});
      if (several) {
        const RuleId separator = builder.add_literal(format.call_separator);
        builder.add_alternative(answer, {GrammarSymbol::rule(one), GrammarSymbol::rule(separator),
                                         GrammarSymbol::rule(answer)});
      }
      break;
    }
    case ToolCallConstraint::kAfterTrigger: {
      if (format.call_is_whole_answer) {
        // Text may not open with the call's first byte or whitespace (a call may: its object
        // takes leading whitespace).
        const RuleId text = builder.add_grammar(text_without("", format.trigger + " \t\r\n"));
        builder.add_alternative(answer, {GrammarSymbol::rule(text)});
        builder.add_alternative(answer, {GrammarSymbol::rule(one)});
        break;
      }
      const RuleId text = builder.add_grammar(text_without(format.trigger));
      builder.add_alternative(answer, {GrammarSymbol::rule(text)});
      builder.add_alternative(answer,
                              {GrammarSymbol::rule(text), GrammarSymbol::rule(one),
                               several ? GrammarSymbol::rule(answer) : GrammarSymbol::rule(text)});
      break;
    }
  }
  return builder.build(answer);
}

}  // namespace folio::server
