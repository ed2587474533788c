// Drives keel serve's UI message stream route with the AI SDK's own client: a Chat (the core
// of useChat) over DefaultChatTransport, sending a prompt, approving the tool call keel asks
// about with addToolApprovalResponse, and resubmitting automatically
// (lastAssistantMessageIsCompleteWithApprovalResponses). Every chunk on the wire is checked
// with the package's uiMessageChunkSchema. Prints one JSON object for the Python test.
//
// usage: node ai_chat.mjs URL TOKEN SESSION PROMPT
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  uiMessageChunkSchema,
} from 'ai';

const [url, token, session, prompt] = process.argv.slice(2);
const schema = uiMessageChunkSchema();
const chunks = [];
const invalid = [];
const requests = [];
const headers = [];

/** fetch, reading each response whole to check its chunks before the transport parses it. */
async function checkedFetch(target, init) {
  const body = JSON.parse(init.body);
  requests.push({
    keys: Object.keys(body).sort(),
    id: body.id,
    trigger: body.trigger,
    roles: body.messages.map((m) => m.role),
  });
  const response = await fetch(target, init);
  headers.push(response.headers.get('x-vercel-ai-ui-message-stream'));
  const text = await response.text();
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ')) continue;
    const raw = line.slice('data: '.length);
    if (raw === '[DONE]') {
      chunks.push('[DONE]');
      continue;
    }
    const chunk = JSON.parse(raw);
    chunks.push(chunk.type);
    const checked = await schema.validate(chunk);
    if (!checked.success) invalid.push({ chunk, error: checked.error.message });
  }
  return new Response(text, { status: response.status, headers: response.headers });
}

class ChatState {
  status = 'ready';
  error = undefined;
  messages = [];
  pushMessage = (m) => {
    this.messages = [...this.messages, m];
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (i, m) => {
    this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)];
  };
  snapshot = (thing) => structuredClone(thing);
}

let finished = 0;
let wake = () => {};
const errors = [];
const chat = new AbstractChat({
  id: session,
  state: new ChatState(),
  transport: new DefaultChatTransport({
    api: `${url}/v1/sessions/${session}/ui-stream`,
    headers: { Authorization: `Bearer ${token}` },
    fetch: checkedFetch,
  }),
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  onFinish: () => {
    finished += 1;
    wake();
  },
  onError: (error) => errors.push(String(error)),
});

const finishes = (n) =>
  new Promise((resolve) => {
    wake = () => finished >= n && resolve();
    wake();
  });

await chat.sendMessage({ text: prompt });
await finishes(1);
const last = chat.messages[chat.messages.length - 1];
const asked = last.parts.filter((p) => p.state === 'approval-requested');
const approvals = asked.map((p) => ({ ...p.approval }));
for (const part of asked) {
  await chat.addToolApprovalResponse({ id: part.approval.id, approved: true });
}
if (asked.length > 0) await finishes(2);

console.log(
  JSON.stringify({
    chunks,
    invalid,
    requests,
    headers,
    approvals,
    errors,
    status: chat.status,
    messages: chat.messages,
  }),
);
