// End-to-end: the official OpenAI Node.js client against `folio serve`.
//
// Usage: node e2e.mjs <path to the folio binary> <scratch directory>
// Generates a tiny model, starts `folio serve` on a free port with an API key, runs a
// completion, a chat completion and a streamed chat completion through the client, checks the
// answers (usage counts, finish reasons, streamed text equal to the same request non-streamed),
// then stops the server with SIGTERM and expects a clean exit. Exit code 0: passed; 77: skipped
// because the client is not installed (`npm ci` here; scripts/install-deps.sh does it).
import { spawn, execFileSync } from "node:child_process";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "node:fs";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
if (!fs.existsSync(path.join(here, "node_modules", "openai"))) {
  console.error(`skipped: the openai package is not installed (run npm ci in ${here})`);
  process.exit(77);
}
const { default: OpenAI } = await import("openai");

const [folio, scratch] = process.argv.slice(2);
if (!folio || !scratch) {
  console.error("usage: node e2e.mjs <folio binary> <scratch directory>");
  process.exit(2);
}
fs.mkdirSync(scratch, { recursive: true });
const modelPath = path.join(scratch, "node-e2e-tiny.gguf");
execFileSync(folio, ["make-model", "-o", modelPath, "--preset", "tiny", "--seed", "5"], {
  stdio: "inherit",
});

const apiKey = "e2e-secret";
const server = spawn(folio, ["serve", "-m", modelPath, "--port", "0", "--api-key", apiKey,
                             "--threads", "2", "--memory-mib", "64", "-q"],
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

const client = new OpenAI({ apiKey, baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
const model = "node-e2e-tiny";
try {
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

  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 12, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let streamed = "";
  let finishReason = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      streamed += choice.delta?.content ?? "";
      if (choice.finish_reason) finishReason = choice.finish_reason;
    }
  }
  assert.equal(streamed, chat.choices[0].message.content, "streamed chat equals the whole one");
  assert.equal(finishReason, chat.choices[0].finish_reason);
  assert.deepEqual(usage, chat.usage);

  // A bad request surfaces as the client's typed 400 error.
  await assert.rejects(
    client.completions.create({ model, prompt: "x", max_tokens: -1 }),
    (error) => error instanceof OpenAI.BadRequestError && error.status === 400);
  // And a wrong key as its 401.
  const stranger = new OpenAI({ apiKey: "wrong", baseURL: `http://127.0.0.1:${port}/v1`,
                                maxRetries: 0 });
  await assert.rejects(stranger.models.list(),
                       (error) => error instanceof OpenAI.AuthenticationError);
  console.log(`openai-node e2e passed (completion ${JSON.stringify(completion.choices[0].text)}, ` +
              `chat ${JSON.stringify(chat.choices[0].message.content)})`);
} finally {
  const exited = new Promise((resolve) => server.on("exit", (code) => resolve(code)));
  server.kill("SIGTERM");
  const code = await exited;
  if (code !== 0) {
    console.error(`folio serve exited with ${code}:\n${serverLog}`);
    process.exitCode = 1;
  }
}
