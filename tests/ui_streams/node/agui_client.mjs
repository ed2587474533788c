// Drives keel serve's AG-UI route with the protocol's own client (@ag-ui/client's HttpAgent):
// a prompt, the interrupt a permission question ends the run with, and the run that resumes it.
// Every event the agent hands its subscribers is parsed with @ag-ui/core's schemas, and every
// request body it sends with RunAgentInputSchema. Prints one JSON object for the Python test.
//
// usage: node agui_client.mjs URL TOKEN SESSION PROMPT
import { HttpAgent } from '@ag-ui/client';
import { EventSchemas, RunAgentInputSchema } from '@ag-ui/core/schemas';

const [url, token, session, prompt] = process.argv.slice(2);
const events = [];
const invalid = [];
const bodies = [];
const outcomes = [];

const agent = new HttpAgent({
  url: `${url}/v1/sessions/${session}/agui`,
  headers: { Authorization: `Bearer ${token}` },
  threadId: session,
  fetch: (target, init) => {
    const body = JSON.parse(init.body);
    const checked = RunAgentInputSchema.safeParse(body);
    if (!checked.success) invalid.push({ body, error: checked.error.message });
    bodies.push({ runId: body.runId, resume: body.resume ?? null, messages: body.messages.length });
    return fetch(target, init);
  },
});

const subscriber = {
  onEvent({ event }) {
    events.push(event.type);
    const checked = EventSchemas.safeParse(event);
    if (!checked.success) invalid.push({ event, error: checked.error.message });
  },
  onRunFinishedEvent(params) {
    outcomes.push({ outcome: params.outcome, interrupts: params.interrupts ?? null });
  },
  onRunErrorEvent({ event }) {
    outcomes.push({ error: event.message });
  },
};

agent.addMessage({ id: 'user-1', role: 'user', content: prompt });
await agent.runAgent({ runId: 'run-1' }, subscriber);
const asked = agent.pendingInterrupts.map((i) => ({ ...i }));
if (asked.length > 0) {
  const resume = asked.map((i) => ({
    interruptId: i.id,
    status: 'resolved',
    payload: { approved: true },
  }));
  await agent.runAgent({ runId: 'run-2', resume }, subscriber);
}

console.log(
  JSON.stringify({
    events,
    invalid,
    bodies,
    outcomes,
    asked,
    pending: agent.pendingInterrupts,
    messages: agent.messages,
    state: agent.state,
  }),
);
