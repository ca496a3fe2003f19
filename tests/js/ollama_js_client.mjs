// ollama-js (the official JavaScript client) against a running daemon: the calls apps make, results as JSON.
//   node ollama_js_client.mjs URL MODEL SCHEMA_JSON
import { Ollama } from 'ollama'

const [url, model, schemaText] = process.argv.slice(2)
const schema = JSON.parse(schemaText)
const ollama = new Ollama({ host: url })
const opts = { temperature: 0, num_predict: 200 }
const out = {}

out.list = (await ollama.list()).models.map((m) => m.name)
out.show_family = (await ollama.show({ model })).details.family

const msgs = [{ role: 'user', content: 'Describe a person as JSON.' }]
const chat = await ollama.chat({ model, messages: msgs, format: schema, options: opts })
out.chat_schema = chat.message.content
out.chat_done_reason = chat.done_reason

let streamed = ''
for await (const part of await ollama.chat({ model, messages: msgs, format: schema, options: opts, stream: true })) {
  streamed += part.message.content
}
out.chat_schema_streamed = streamed

const gen = await ollama.generate({ model, prompt: 'JSON please', format: 'json', options: opts })
out.generate_json = gen.response
out.eval_count = gen.eval_count

// a stream the client aborts: its iterator ends with an AbortError, and the daemon frees the sequence
const long = await ollama.generate({ model, prompt: 'Go on', stream: true, options: { num_predict: 100000, ignore_eos: true } })
let parts = 0
try {
  for await (const _ of long) {
    if (++parts === 5) long.abort()
  }
} catch (e) {
  out.abort_error = e.name  // parts already parsed before the abort may still arrive first
}
out.abort_parts = parts

out.embed_dims = (await ollama.embed({ model, input: ['a', 'b'] })).embeddings.map((e) => e.length)
console.log(JSON.stringify(out))
