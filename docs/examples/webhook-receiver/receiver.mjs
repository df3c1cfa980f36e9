// Receive agent-rewind's webhooks, verify each with the Standard Webhooks library, handle each
// event once (docs/events.md#webhooks):
//   npm ci && WEBHOOK_SECRETS="whsec_..." PORT=8080 node receiver.mjs
// WEBHOOK_SECRETS: the key(s) this receiver trusts, separated by spaces (during a rotation, the
// old and the new: the service signs with every key of its file). Delivery is at least once, so
// an event is handled once by its `id` (the event's cursor); answer 2xx once it is handled.
import { createServer } from 'node:http';
import { Webhook } from 'standardwebhooks';

const verifiers = process.env.WEBHOOK_SECRETS.split(/\s+/).filter(Boolean).map((key) => new Webhook(key));
const handled = new Set(); // keep these durably in a real receiver, as a watcher keeps its cursor

function verify(body, headers) { // the CloudEvent, if one of our keys signed it recently
  for (const verifier of verifiers) {
    try {
      return verifier.verify(body, headers);
    } catch {
      // not this key: try the next
    }
  }
  throw new Error('no key of ours signed it');
}

function handle(event) {
  const kind = event.type.replace('agent_rewind.v1.', '');
  console.log(`${kind} id=${event.id} session=${event.subject} rewind=${event.data.rewindId ?? ''}`);
}

const server = createServer((request, response) => {
  const chunks = [];
  request.on('data', (chunk) => chunks.push(chunk));
  request.on('end', () => {
    let event;
    try {
      event = verify(Buffer.concat(chunks).toString('utf8'), request.headers);
    } catch {
      response.writeHead(401).end(); // not ours, tampered with, or too old: never handled
      return;
    }
    if (!handled.has(event.id)) { // at least once: a repeat is answered, not handled again
      handle(event);
      handled.add(event.id);
    }
    response.writeHead(204).end();
  });
});
server.listen(Number(process.env.PORT ?? 8080), '127.0.0.1', () => {
  console.log(JSON.stringify({ listening: server.address().port }));
});
