// End-to-end: the official OpenAI Node.js client against `folio serve`.
//
// Usage: node e2e.mjs <path to the folio binary> <scratch directory> [folio serve arguments...]
// (the extra arguments go to `folio serve` as they are, e.g. --local-workers 2: the same checks
// with the model's layers on a pipeline of worker processes).
// Generates a tiny model, starts `folio serve` on a free port with an API key, and drives it with
// two versions of the client (the pinned 5.x as `openai`, the current 6.x as `openai-6`): plain,
// streamed and n > 1 completions and chat completions, logprobs, echo (the harness's
// log-likelihood request), logit_bias, /tokenize and /detokenize, structured output against a
// JSON schema, and tool calls (forced, streamed, and a tool result fed back), checking each
// answer's shape and contents; bad requests surface as the client's typed errors. Then it
// stops the server with SIGTERM and expects a clean exit. Exit code 0: passed; 77: skipped
// because a client is not installed (`npm ci` here; scripts/install-deps.sh does it).
import { spawn, execFileSync } from "node:child_process";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "node:fs";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const clientPackages = ["openai", "openai-6"];
for (const name of clientPackages) {
  if (!fs.existsSync(path.join(here, "node_modules", name))) {
    console.error(`skipped: the ${name} package is not installed (run npm ci in ${here})`);
    process.exit(77);
  }
}

const [folio, scratch, ...serveArguments] = process.argv.slice(2);
if (!folio || !scratch) {
  console.error("usage: node e2e.mjs <folio binary> <scratch directory> [folio serve arguments...]");
  process.exit(2);
}
fs.mkdirSync(scratch, { recursive: true });
const modelPath = path.join(scratch, "node-e2e-tiny.gguf");
execFileSync(folio, ["make-model", "-o", modelPath, "--preset", "tiny", "--seed", "5", "--context", "2048"], {
  stdio: "inherit",
});

const apiKey = "e2e-secret";
const server = spawn(folio, ["serve", "-m", modelPath, "--port", "0", "--api-key", apiKey,
                             "--threads", "2", "--memory-mib", "64", "-q", ...serveArguments],
                     { stdio: ["ignore", "inherit", "pipe"] });
let serverLog = "";
const port = await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error(`no port in 60 s; log:\n${serverLog}`)), 60000);
  server.stderr.on("data", (data) => {
    serverLog += data.toString();
    const match = serverLog.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (match) {
      clearTimeout(timer);
      resolve(Number(match[1]));
    }
  });
  server.on("exit", (code) => reject(new Error(`folio serve exited (${code}):\n${serverLog}`)));
});

const baseURL = `http://127.0.0.1:${port}`;
const model = "node-e2e-tiny";

// POST a JSON body to a route outside /v1 (the client has no method for it).
async function postJson(route, body) {
  const answer = await fetch(`${baseURL}${route}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify(body),
  });
  assert.equal(answer.status, 200, `${route}: ${await answer.clone().text()}`);
  return answer.json();
}

// The chat completion's text and tool calls, streamed: chunks merged per choice index.
async function collectStream(stream) {
  const choices = new Map();
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      if (!choices.has(choice.index)) choices.set(choice.index, { text: "", calls: [], finish: null, logprobs: [] });
      const entry = choices.get(choice.index);
      const delta = choice.delta ?? {};
      entry.text += delta.content ?? choice.text ?? "";
      for (const call of delta.tool_calls ?? []) {
        if (!entry.calls[call.index]) entry.calls[call.index] = { id: "", name: "", arguments: "" };
        const merged = entry.calls[call.index];
        merged.id += call.id ?? "";
        merged.name += call.function?.name ?? "";
        merged.arguments += call.function?.arguments ?? "";
      }
      if (choice.logprobs?.content) entry.logprobs.push(...choice.logprobs.content);
      if (choice.finish_reason) entry.finish = choice.finish_reason;
    }
  }
  return { choices, usage };
}

const answerSchema = {
  type: "object",
  properties: {
    answer: { type: "string", enum: ["yes", "no", "maybe"] },
    sure: { type: "boolean" },
    votes: { type: "array", items: { type: "string", enum: ["a", "b"] }, maxItems: 3 },
  },
  required: ["answer", "sure", "votes"],
  additionalProperties: false,
};
function checkAnswer(value) {
  assert.deepEqual(Object.keys(value).sort(), ["answer", "sure", "votes"]);
  assert.ok(["yes", "no", "maybe"].includes(value.answer));
  assert.equal(typeof value.sure, "boolean");
  assert.ok(Array.isArray(value.votes) && value.votes.length <= 3);
  for (const vote of value.votes) assert.ok(["a", "b"].includes(vote));
}
const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: {
      type: "object",
      properties: { unit: { type: "string", enum: ["celsius", "fahrenheit"] },
                    days: { type: "array", items: { type: "boolean" }, maxItems: 2 } },
      required: ["unit", "days"],
      additionalProperties: false,
    },
  },
};
function checkWeatherCall(call) {
  assert.equal(call.function?.name ?? call.name, "get_weather");
  const args = JSON.parse(call.function?.arguments ?? call.arguments);
  assert.ok(["celsius", "fahrenheit"].includes(args.unit));
  assert.ok(Array.isArray(args.days) && args.days.length <= 2);
}

async function exercise(OpenAI, label) {
  const client = new OpenAI({ apiKey, baseURL: `${baseURL}/v1`, maxRetries: 0 });
  const models = await client.models.list();
  assert.deepEqual(models.data.map((entry) => entry.id), [model]);

  const completion = await client.completions.create({
    model, prompt: "The lighthouse", max_tokens: 10, temperature: 0,
  });
  assert.equal(completion.object, "text_completion");
  assert.equal(typeof completion.choices[0].text, "string");
  assert.ok(["stop", "length"].includes(completion.choices[0].finish_reason));
  assert.ok(completion.usage.prompt_tokens > 0);
  assert.ok(completion.usage.completion_tokens >= 1 && completion.usage.completion_tokens <= 10);
  assert.equal(completion.usage.total_tokens,
               completion.usage.prompt_tokens + completion.usage.completion_tokens);

  const messages = [
    { role: "system", content: "You are terse." },
    { role: "user", content: "Say something about the sea." },
  ];
  const chat = await client.chat.completions.create({
    model, messages, max_tokens: 12, temperature: 0,
  });
  assert.equal(chat.object, "chat.completion");
  assert.equal(chat.choices[0].message.role, "assistant");
  assert.equal(typeof chat.choices[0].message.content, "string");
  assert.ok(chat.usage.completion_tokens >= 1);

  const streamed = await collectStream(await client.chat.completions.create({
    model, messages, max_tokens: 12, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  }));
  assert.equal(streamed.choices.get(0).text, chat.choices[0].message.content,
               "streamed chat equals the whole one");
  assert.equal(streamed.choices.get(0).finish, chat.choices[0].finish_reason);
  assert.deepEqual(streamed.usage, chat.usage);

  // n > 1 with a seed: three choices, and the streamed ones equal the whole ones.
  const sampled = { model, prompt: "The sea", max_tokens: 8, temperature: 1, seed: 11, n: 3 };
  const several = await client.completions.create({ ...sampled, logprobs: 2 });
  assert.deepEqual(several.choices.map((choice) => choice.index), [0, 1, 2]);
  let tokensSeen = 0;
  for (const choice of several.choices) {
    const logprobs = choice.logprobs;
    assert.equal(logprobs.tokens.length, logprobs.token_logprobs.length);
    for (let i = 0; i < logprobs.tokens.length; ++i) {
      assert.ok(logprobs.token_logprobs[i] <= 0);
      assert.ok(Object.keys(logprobs.top_logprobs[i]).length <= 2);
    }
    tokensSeen += logprobs.tokens.length;
  }
  assert.equal(tokensSeen, several.usage.completion_tokens);
  const severalStreamed = await collectStream(await client.completions.create({
    ...sampled, stream: true }));
  for (const choice of several.choices) {
    assert.equal(severalStreamed.choices.get(choice.index).text, choice.text);
  }

  // The log-likelihood request of evaluation harnesses: echo, logprobs, max_tokens 0.
  const scored = await client.completions.create({
    model, prompt: "The lighthouse keeper", max_tokens: 0, echo: true, logprobs: 1,
    temperature: 0,
  });
  const scoredLogprobs = scored.choices[0].logprobs;
  assert.equal(scored.choices[0].text, "The lighthouse keeper");
  assert.equal(scoredLogprobs.token_logprobs[0], null);
  assert.ok(scoredLogprobs.token_logprobs.slice(1).every((value) => value <= 0));
  assert.equal(scored.usage.completion_tokens, 0);

  // /tokenize and /detokenize, then logit_bias forcing one token.
  const tokenized = await postJson("/tokenize", { model, prompt: " harbour", add_special_tokens: false });
  assert.equal(tokenized.count, tokenized.tokens.length);
  const detokenized = await postJson("/detokenize", { model, tokens: tokenized.tokens });
  assert.equal(detokenized.prompt, " harbour");
  const forced = tokenized.tokens[0];
  const biased = await client.completions.create({
    model, prompt: "x", max_tokens: 3, temperature: 0, logprobs: 0, ignore_eos: true,
    logit_bias: { [String(forced)]: 100 },
  });
  // The forced token's own text: what it adds after other tokens (alone, a leading space of a
  // SentencePiece piece would be dropped).
  const before = (await postJson("/detokenize", { tokens: tokenized.tokens })).prompt;
  const after = (await postJson("/detokenize", { tokens: [...tokenized.tokens, forced] })).prompt;
  assert.ok(after.startsWith(before));
  const forcedText = after.slice(before.length);
  assert.equal(biased.choices[0].text, forcedText.repeat(3));

  // Chat logprobs with alternatives.
  const withLogprobs = await client.chat.completions.create({
    model, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  const content = withLogprobs.choices[0].logprobs.content;
  assert.equal(content.length, withLogprobs.usage.completion_tokens);
  for (const entry of content) {
    assert.equal(entry.top_logprobs.length, 2);
    assert.ok(entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob);
    // The exact bytes; the text equals them unless the token ends inside a character.
    if (!entry.token.includes("\uFFFD")) assert.deepEqual(entry.bytes, [...Buffer.from(entry.token)]);
  }

  // Structured output: every sampled answer parses and fits the schema.
  const structured = await client.chat.completions.create({
    model, messages, max_tokens: 400, temperature: 1, seed: 3, n: 4,
    response_format: { type: "json_schema",
                       json_schema: { name: "answer", strict: true, schema: answerSchema } },
  });
  for (const choice of structured.choices) {
    assert.equal(choice.finish_reason, "stop", choice.message.content);
    checkAnswer(JSON.parse(choice.message.content));
  }
  const anyObject = await client.chat.completions.create({
    model, messages, max_tokens: 150, temperature: 0.7, seed: 5,
    response_format: { type: "json_object" },
  });
  if (anyObject.choices[0].finish_reason === "stop") {
    assert.equal(typeof JSON.parse(anyObject.choices[0].message.content), "object");
  }

  // Tools: a forced call, whole and streamed, then its result fed back.
  const toolRequest = {
    model, messages: [{ role: "user", content: "Weather in Paris?" }], max_tokens: 600,
    temperature: 1, seed: 9, tools: [weatherTool], parallel_tool_calls: false,
    tool_choice: { type: "function", function: { name: "get_weather" } },
  };
  const called = await client.chat.completions.create(toolRequest);
  const message = called.choices[0].message;
  assert.equal(called.choices[0].finish_reason, "tool_calls");
  assert.equal(message.tool_calls.length, 1);
  assert.ok(message.tool_calls[0].id.length > 0);
  checkWeatherCall(message.tool_calls[0]);
  const calledStream = await collectStream(await client.chat.completions.create({
    ...toolRequest, stream: true }));
  const streamedCall = calledStream.choices.get(0);
  assert.equal(streamedCall.finish, "tool_calls");
  assert.equal(streamedCall.calls.length, 1);
  checkWeatherCall(streamedCall.calls[0]);
  assert.equal(streamedCall.calls[0].arguments, message.tool_calls[0].function.arguments);
  // tool_choice "auto": free text, but a "<tool_call>" the model writes always opens a call held
  // to the schema (the random model rarely writes one; tool_calls_test checks the grammar).
  for (const seed of [1, 2]) {
    const auto = await client.chat.completions.create({
      ...toolRequest, tool_choice: "auto", seed, max_tokens: 120 });
    const answer = auto.choices[0];
    assert.ok(!(answer.message.content ?? "").includes("<tool_call>"), answer.message.content);
    for (const call of answer.message.tool_calls ?? []) checkWeatherCall(call);
  }

  const followUp = await client.chat.completions.create({
    model, max_tokens: 6, temperature: 0, tools: [weatherTool],
    messages: [...toolRequest.messages, message,
               { role: "tool", tool_call_id: message.tool_calls[0].id, content: "sunny, 21 C" }],
  });
  assert.equal(followUp.choices[0].message.role, "assistant");

  // Bad requests surface as the client's typed errors.
  await assert.rejects(
    client.completions.create({ model, prompt: "x", max_tokens: -1 }),
    (error) => error instanceof OpenAI.BadRequestError && error.status === 400);
  await assert.rejects(
    client.completions.create({ model, prompt: "x", suffix: "y" }),
    (error) => error instanceof OpenAI.BadRequestError && /suffix/.test(error.message));
  await assert.rejects(
    client.chat.completions.create({ model, messages, response_format: {
      type: "json_schema", json_schema: { name: "s", strict: true,
                                          schema: { type: "string", pattern: "^a+$" } } } }),
    (error) => error instanceof OpenAI.BadRequestError && /pattern/.test(error.message));
  await assert.rejects(
    client.completions.create({ model: "no-such-model", prompt: "x" }),
    (error) => error instanceof OpenAI.NotFoundError);
  const stranger = new OpenAI({ apiKey: "wrong", baseURL: `${baseURL}/v1`, maxRetries: 0 });
  await assert.rejects(stranger.models.list(),
                       (error) => error instanceof OpenAI.AuthenticationError);
  console.log(`${label}: passed (completion ${JSON.stringify(completion.choices[0].text)}, ` +
              `structured ${structured.choices[0].message.content}, ` +
              `call ${message.tool_calls[0].function.arguments})`);
}

try {
  for (const name of clientPackages) {
    const { default: OpenAI } = await import(name);
    await exercise(OpenAI, `openai-node e2e with ${name}`);
  }
} finally {
  const exited = new Promise((resolve) => server.on("exit", (code) => resolve(code)));
  server.kill("SIGTERM");
  const code = await exited;
  if (code !== 0) {
    console.error(`folio serve exited with ${code}:\n${serverLog}`);
    process.exitCode = 1;
  }
}
