// The whole flow against a running server, with the offline scripted model (docs/scripted-model.md):
//
//   node examples/flow.mjs          # server: $AGENT_REWIND_SERVER, default 127.0.0.1:50051
//
// Create a session, prompt twice, list the rewind points, preview a files rewind, then watch the
// event feed while applying it, and resume the feed from a cursor. Exits non-zero if anything is
// not as documented.
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { connect } from '@agent-rewind/client';

const client = connect(process.env.AGENT_REWIND_SERVER || '127.0.0.1:50051', {
  token: process.env.AGENT_REWIND_TOKEN,
});

function check(ok, what) {
  if (!ok) throw new Error(`unexpected: ${what}`);
}

/** A workspace file as the agent left it (null: absent), when the server runs on this host. */
async function show(cwd, name) {
  if (!existsSync(cwd)) return console.log(`  ${name}: (the workspace is on the server's host)`);
  const text = existsSync(join(cwd, name)) ? await readFile(join(cwd, name), 'utf8') : null;
  console.log(`  ${name}: ${text === null ? '(absent)' : JSON.stringify(text)}`);
  return text;
}

/** Runs one turn; returns its rewind point (the user prompt's message_id). */
async function prompt(session_id, text) {
  console.log(`> ${text.replaceAll('\n', ' \\n ')}`);
  let point = '';
  // A request_id makes a retry of this call re-attach to the same turn instead of running another.
  for await (const event of client.prompt({ session_id, text, request_id: randomUUID() })) {
    if (event.event === 'user_prompt') point = event.message_id;
    if (event.event === 'assistant_message') {
      for (const tool of event.assistant_message.tool_uses) console.log(`  tool ${tool.name} ${tool.input.file_path ?? ''}`);
      if (event.assistant_message.text) console.log(`  says ${event.assistant_message.text}`);
    }
    if (event.event === 'result') console.log(`  result ${event.result.subtype} in ${event.result.duration_ms} ms`);
  }
  return point;
}

const caps = await client.getCapabilities();
console.log(`server ${caps.service_version}, model ${caps.model_backend}, modes ${caps.modes.join(' ')}`);

const session = await client.createSession({ request_id: randomUUID() });
const { session_id, cwd } = session;
console.log(`session ${session_id} in ${cwd}`);

const first = await prompt(session_id, 'write a.txt v0');
const second = await prompt(session_id, 'edit a.txt v0 => v1\nwrite b.txt bee');
await show(cwd, 'a.txt');
await show(cwd, 'b.txt');

const { points, last_message_id } = await client.listRewindPoints({ session_id });
for (const p of points) console.log(`point ${p.index} ${p.message_id} ${JSON.stringify(p.text)} files_rewindable=${p.files_rewindable}`);
check(points.map((p) => p.message_id).join() === [first, second].join(), 'the points are the two prompts');

// Rewinding to the second prompt restores the files as they were just before it was sent.
const request = { session_id, message_id: second, mode: 'REWIND_MODE_FILES' };
const preview = await client.dryRun(request);
const { files } = preview;
console.log(`dry run: can_rewind=${files.can_rewind} files_changed=${files.files_changed.length} +${files.insertions} -${files.deletions}`);
check(files.can_rewind && files.files_changed.length === 2, 'the dry run would change a.txt and b.txt');

// Watch before rewinding. No after_cursor: only new events; caught_up comes first, at once.
const watch = client.watchRewindEvents({ session_id });
const feed = watch[Symbol.asyncIterator]();
const hello = (await feed.next()).value;
check(hello.response === 'caught_up', 'caught_up opens a watch without after_cursor');
console.log(`watching from cursor ${hello.caught_up.cursor}`);

// expected_last_message_id: refused with REWIND_CONFLICT if someone changed the session meanwhile.
const result = await client.rewind({ ...request, expected_last_message_id: last_message_id, request_id: randomUUID() });
console.log(`rewound: rewind_id=${result.rewind_id} files_changed=${result.files.files_changed.length}`);
const [a, b] = [await show(cwd, 'a.txt'), await show(cwd, 'b.txt')];
check(!existsSync(cwd) || (a === 'v0\n' && b === null), 'a.txt is back to v0 and b.txt is gone');

const { event } = (await feed.next()).value;
console.log(`event ${event.kind} cursor=${event.cursor} rewind_id=${event.rewind_id} by ${event.principal}`);
check(event.kind === 'REWIND_EVENT_KIND_REWOUND' && event.rewind_id === result.rewind_id, 'the event is our rewind');
watch.cancel();

// Cursors are uint64, carried as decimal strings. after_cursor is exclusive: the cursor before
// this event replays it, then caught_up says the replay is done and live events follow.
const after = (BigInt(event.cursor) - 1n).toString();
for await (const response of client.watchRewindEvents({ session_id, after_cursor: after })) {
  if (response.response === 'event') {
    console.log(`replayed after ${after}: ${response.event.kind} cursor=${response.event.cursor}`);
    check(response.event.cursor === event.cursor, 'the replay starts right after after_cursor');
  } else {
    console.log(`caught up at ${response.caught_up.cursor}`);
    break; // leaving the loop ends the watch
  }
}

const after_rewind = await client.getSession({ session_id });
console.log(`session: ${after_rewind.state} turns=${after_rewind.turn_count} (a files rewind keeps the conversation)`);
await client.closeSession({ session_id });
client.close();
console.log('flow done');
