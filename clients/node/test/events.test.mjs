// The event consumer of examples/watch-events.mjs, run as a process: it follows, stores its
// cursor, resumes from it, retries while the server is away, and resyncs after CURSOR_EXPIRED.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { connect, CursorExpiredError, status } from '@agent-rewind/client';
import { example, SERVER, SHORT_RETENTION_SERVER, twoTurns } from './support.mjs';

async function until(condition, what, timeoutMs = 5000) {
  for (const deadline = Date.now() + timeoutMs; !condition(); ) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** How a watch's replay ends: null at caught_up, else the error. */
async function replayFailure(stream) {
  try {
    for await (const r of stream) if (r.caught_up) return null;
  } catch (err) {
    return err;
  }
  return new Error('the watch ended before caught_up');
}

const scratch = mkdtempSync(join(tmpdir(), 'agent-rewind-node-'));
const running = [];
function start(args, env) {
  const child = example('watch-events.mjs', args, env);
  running.push(child);
  return child;
}
after(() => Promise.all(running.map((c) => c.stop())));

describe(`examples/watch-events.mjs against ${SERVER}`, () => {
  const client = connect(SERVER);
  after(() => client.close());

  test('follows new events, stores the cursor after each, resumes after it', async () => {
    const cursorFile = join(scratch, 'follow');
    const { session, points } = await twoTurns(client);
    const watcher = start([cursorFile], { AGENT_REWIND_SERVER: SERVER });
    const [, caughtUp] = await watcher.next(/^CAUGHT_UP cursor=(\d+)$/);
    // A first start stores where it began (or, with other tests running, a later event's cursor).
    assert.ok(BigInt(readFileSync(cursorFile, 'utf8')) >= BigInt(caughtUp));

    const result = await client.rewind({ session_id: session.session_id, message_id: points[1] });
    const pattern = new RegExp(`^REWOUND cursor=(\\d+) session=${session.session_id} rewind=${result.rewind_id}$`);
    const [, cursor] = await watcher.next(pattern);
    assert.ok(BigInt(cursor) > BigInt(caughtUp));
    await until(() => BigInt(readFileSync(cursorFile, 'utf8')) >= BigInt(cursor), 'the handled cursor is stored');
    await watcher.stop();

    // Restarted after another rewind: that event comes first, from the stored cursor.
    const again = await client.rewind({ session_id: session.session_id, message_id: points[0] });
    const restarted = start([cursorFile], { AGENT_REWIND_SERVER: SERVER });
    const [, replayed] = await restarted.next(new RegExp(`^REWOUND cursor=(\\d+) session=${session.session_id} rewind=${again.rewind_id}$`));
    assert.ok(BigInt(replayed) > BigInt(cursor));
    await restarted.next(/^CAUGHT_UP /);
    assert.ok(!restarted.output.some((line) => line.includes(result.rewind_id)), 'nothing before the cursor again');
  });

  test('retries with backoff while no server answers', async () => {
    const watcher = start([join(scratch, 'nowhere')], { AGENT_REWIND_SERVER: '127.0.0.1:1' });
    await watcher.next(/^RETRY in 500 ms: UNAVAILABLE/);
    await watcher.next(/^RETRY in 1000 ms: UNAVAILABLE/);
    assert.equal(watcher.child.exitCode, null, 'still running');
  });
});

describe(
  `expired cursors against ${SHORT_RETENTION_SERVER || '$AGENT_REWIND_SHORT_RETENTION_SERVER'}`,
  () => {
    const client = connect(SHORT_RETENTION_SERVER || '127.0.0.1:1');
    after(() => client.close());
    // Skipped as a test, not as a suite: a skipped suite does not count as a skipped test.
    const skip = !SHORT_RETENTION_SERVER && 'AGENT_REWIND_SHORT_RETENTION_SERVER is not set';

    test('CURSOR_EXPIRED carries oldest_cursor; the example resyncs and goes on from there', { skip }, async () => {
      // Three events; the server keeps only the newest, trimming every second.
      const { session, points } = await twoTurns(client);
      const cursors = [];
      for (let i = 0; i < 3; i++) {
        const { rewind_id } = await client.rewind({ session_id: session.session_id, message_id: points[1] });
        cursors.push(rewind_id);
      }
      let newest = '';
      for await (const r of client.watchRewindEvents({})) {
        newest = r.caught_up.cursor;
        break;
      }
      const first = (BigInt(newest) - 2n).toString();
      let err;
      for (const deadline = Date.now() + 10_000; Date.now() < deadline; ) {
        err = await replayFailure(client.watchRewindEvents({ after_cursor: first }));
        if (err instanceof CursorExpiredError) break;
        await new Promise((r) => setTimeout(r, 200));
      }
      assert.ok(err instanceof CursorExpiredError, `no CURSOR_EXPIRED: ${err}`);
      assert.equal(err.code, status.OUT_OF_RANGE);
      assert.equal(err.oldestCursor, newest);

      const cursorFile = join(scratch, 'expired');
      writeFileSync(cursorFile, first);
      const watcher = start([cursorFile], { AGENT_REWIND_SERVER: SHORT_RETENTION_SERVER });
      await watcher.next(new RegExp(`^RESYNC session=${session.session_id} points=2$`));
      await watcher.next(new RegExp(`^REWOUND cursor=${newest} session=${session.session_id} rewind=${cursors[2]}$`));
      await watcher.next(new RegExp(`^CAUGHT_UP cursor=${newest}$`));
      assert.equal(readFileSync(cursorFile, 'utf8'), newest);
    });
  },
);
