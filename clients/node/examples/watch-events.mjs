// Follow every rewind this principal may see, and never miss one (docs/events.md):
//   node examples/watch-events.mjs [CURSOR_FILE]    # server: $AGENT_REWIND_SERVER
// The cursor is stored after each event is handled, so a restart resumes right after the last
// event handled: at least once, never a gap. Handling must therefore be idempotent.
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { connect, Reason } from '@agent-rewind/client';

const client = connect(process.env.AGENT_REWIND_SERVER, { token: process.env.AGENT_REWIND_TOKEN });
const cursorFile = process.argv[2] ?? 'last-cursor';
const stored = () => (existsSync(cursorFile) ? readFileSync(cursorFile, 'utf8').trim() : '');
function store(cursor) { // a uint64 as a decimal string; the rename makes it atomic
  writeFileSync(`${cursorFile}.tmp`, cursor);
  renameSync(`${cursorFile}.tmp`, cursorFile);
}

function handle({ kind, cursor, session_id, rewind_id }) {
  console.log(`${kind.replace('REWIND_EVENT_KIND_', '')} cursor=${cursor} session=${session_id} rewind=${rewind_id}`);
}

async function resync() { // rebuild what you mirror from the sessions themselves
  let page_token = '';
  do {
    const page = await client.listSessions({ page_token });
    for (const { session_id } of page.sessions) {
      const { points } = await client.listRewindPoints({ session_id });
      console.log(`RESYNC session=${session_id} points=${points.length}`);
    }
    page_token = page.next_page_token;
  } while (page_token);
}

let backoff = 500;
for (;;) {
  const after = stored(); // exclusive; none yet: only new events
  try {
    for await (const { event, caught_up } of client.watchRewindEvents({ after_cursor: after || undefined })) {
      if (caught_up) {
        if (!after) store(caught_up.cursor); // a first start follows from here on
        console.log(`CAUGHT_UP cursor=${caught_up.cursor}`);
        backoff = 500;
        continue;
      }
      handle(event);
      store(event.cursor); // after handling it
    }
  } catch (err) {
    if (err.reason === Reason.CURSOR_EXPIRED) { // events were trimmed before we saw them
      await resync();
      store((BigInt(err.oldestCursor) - 1n).toString()); // then everything still kept
      continue;
    }
    // UNAVAILABLE (SHUTTING_DOWN, a restart...), SUBSCRIBER_TOO_SLOW: again from the stored cursor.
    if (!err.retryable) throw err; // PERMISSION_DENIED...: retrying will not help
    console.log(`RETRY in ${backoff} ms: ${err.message}`);
    await sleep(backoff);
    backoff = Math.min(backoff * 2, 30_000);
  }
}
