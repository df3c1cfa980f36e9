// The whole flow through the client against a real server: sessions, turns, rewind points, a dry
// run, a rewind, and the event feed around it.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import protoLoader from '@grpc/proto-loader';
import { connect, fromStruct, LOADER_OPTIONS, PROTO_DIR, toDate, toStruct } from '@agent-rewind/client';
import { SERVER, turn, twoTurns } from './support.mjs';

const read = (path) => (existsSync(path) ? readFileSync(path, 'utf8') : null);

test('Struct options convert both ways through the protos', () => {
  const definition = protoLoader.loadSync('agent_rewind/v1/session_service.proto', { ...LOADER_OPTIONS, includeDirs: [PROTO_DIR] });
  const { requestSerialize, requestDeserialize } = definition['agent_rewind.v1.SessionService'].CreateSession;
  const options = { model: 'm', max_turns: 3, allowed_tools: ['Read', 'Bash'], env: { A: 'b' }, on: true, none: null };
  const back = requestDeserialize(requestSerialize({ options: toStruct(options) }));
  assert.deepEqual(fromStruct(back.options), options);
  assert.deepEqual(fromStruct(null), {});
  assert.equal(toDate({ seconds: '1700000000', nanos: 5_000_000 }).toISOString(), '2023-11-14T22:13:20.005Z');
});

describe(`the flow against ${SERVER}`, () => {
  const client = connect(SERVER);
  after(() => client.close());

  test('capabilities', async () => {
    const caps = await client.getCapabilities();
    assert.deepEqual(caps.modes, ['REWIND_MODE_FILES', 'REWIND_MODE_CONVERSATION', 'REWIND_MODE_BOTH']);
    assert.equal(caps.dry_run, true);
    assert.equal(caps.events, true);
    assert.equal(caps.model_backend, 'offline');
  });

  test('sessions: create with options, get, list, close', async () => {
    const request_id = randomUUID();
    const options = { model: 'claude-test', allowed_tools: ['Read'], max_turns: 5 };
    const created = await client.createSession({ options, request_id });
    assert.match(created.session_id, /^[0-9a-f-]{36}$/);
    assert.equal(created.state, 'SESSION_STATE_IDLE');
    assert.deepEqual(created.options, options);
    assert.equal(typeof created.snapshot_bytes, 'string', 'int64 fields are strings');
    assert.ok(toDate(created.create_time) instanceof Date);
    const again = await client.createSession({ options, request_id });
    assert.equal(again.session_id, created.session_id, 'the same request_id is the same session');

    const got = await client.getSession({ session_id: created.session_id });
    assert.deepEqual(got.options, options);
    const { sessions } = await client.listSessions({ page_size: 1000 });
    assert.ok(sessions.some((s) => s.session_id === created.session_id));
    const closed = await client.closeSession({ session_id: created.session_id });
    assert.equal(closed.state, 'SESSION_STATE_CLOSED');
  });

  test('a turn streams its prompt, the tool calls and the result', async () => {
    const session = await client.createSession({});
    const { point, events } = await turn(client, session.session_id, 'write notes.txt hello\nsay noted');
    assert.deepEqual(
      events.map((e) => e.event),
      ['user_prompt', 'assistant_message', 'tool_result', 'assistant_message', 'result'],
    );
    assert.equal(events[0].user_prompt.text, 'write notes.txt hello\nsay noted');
    assert.equal(events[0].message_id, point);
    const [write] = events[1].assistant_message.tool_uses;
    assert.equal(write.name, 'Write');
    assert.deepEqual(write.input, { file_path: join(session.cwd, 'notes.txt'), content: 'hello\n' });
    assert.equal(events.at(-1).result.subtype, 'success');
    assert.equal(events.at(-1).result.result, 'noted');
    assert.equal(read(join(session.cwd, 'notes.txt')), 'hello\n');
  });

  test('a turn the client stops listening to runs to its end', async () => {
    const session = await client.createSession({});
    for await (const event of client.prompt({ session_id: session.session_id, text: 'sleep 0.5\nwrite late.txt done' })) {
      assert.equal(event.event, 'user_prompt');
      break; // cancels the call, not the turn
    }
    const deadline = Date.now() + 20_000;
    let s = await client.getSession({ session_id: session.session_id });
    while (s.state === 'SESSION_STATE_RUNNING' && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
      s = await client.getSession({ session_id: session.session_id });
    }
    assert.equal(s.state, 'SESSION_STATE_IDLE');
    assert.equal(read(join(session.cwd, 'late.txt')), 'done\n');
  });

  test('points, dry run, rewind, and the event feed around it', async () => {
    const { session, points } = await twoTurns(client);
    const { session_id, cwd } = session;
    assert.equal(read(join(cwd, 'a.txt')), 'v1\n');

    const listed = await client.listRewindPoints({ session_id });
    assert.deepEqual(listed.points.map((p) => p.message_id), points);
    assert.deepEqual(listed.points.map((p) => p.index), [0, 1]);
    assert.equal(listed.points[0].resume_at_message_id, '', 'the first prompt has no anchor');
    assert.ok(listed.points.every((p) => p.files_rewindable));

    const request = { session_id, message_id: points[1], mode: 'REWIND_MODE_FILES' };
    const preview = await client.dryRun(request);
    assert.equal(preview.rewind_id, '');
    assert.equal(preview.files.can_rewind, true);
    assert.deepEqual(preview.files.files_changed.toSorted(), [join(cwd, 'a.txt'), join(cwd, 'b.txt')]);
    assert.equal(preview.conversation?.requested ?? false, false, 'files mode leaves the conversation alone');
    assert.equal(read(join(cwd, 'a.txt')), 'v1\n', 'a dry run applies nothing');

    const watch = client.watchRewindEvents({ session_id });
    const feed = watch[Symbol.asyncIterator]();
    const first = (await feed.next()).value;
    assert.equal(first.response, 'caught_up');
    assert.match(first.caught_up.cursor, /^\d+$/);

    const result = await client.rewind({ ...request, expected_last_message_id: listed.last_message_id });
    assert.match(result.rewind_id, /./);
    assert.equal(read(join(cwd, 'a.txt')), 'v0\n');
    assert.equal(read(join(cwd, 'b.txt')), null);

    const { event } = (await feed.next()).value;
    assert.equal(event.kind, 'REWIND_EVENT_KIND_REWOUND');
    assert.equal(event.rewind_id, result.rewind_id);
    assert.equal(event.session_id, session_id);
    assert.equal(event.message_id, points[1]);
    assert.equal(event.mode, 'REWIND_MODE_FILES');
    assert.ok(BigInt(event.cursor) > BigInt(first.caught_up.cursor));
    watch.cancel();
    assert.deepEqual(await feed.next(), { done: true, value: undefined }, 'a cancelled watch ends quietly');

    // Resuming: after_cursor (exclusive) as a string, a number or a bigint replays the event.
    for (const after_cursor of [(BigInt(event.cursor) - 1n).toString(), Number(event.cursor) - 1, BigInt(event.cursor) - 1n]) {
      const seen = [];
      for await (const r of client.watchRewindEvents({ session_id, after_cursor })) {
        seen.push(r.response === 'event' ? r.event.cursor : `caught_up ${r.caught_up.cursor}`);
        if (r.response === 'caught_up') break;
      }
      assert.equal(seen[0], event.cursor, `after_cursor ${after_cursor}`);
      assert.equal(seen.at(-1).startsWith('caught_up'), true);
    }
    // 0: from the oldest retained event, which includes ours.
    const all = [];
    for await (const r of client.watchRewindEvents({ session_id, after_cursor: 0 })) {
      if (r.caught_up) break;
      all.push(r.event.rewind_id);
    }
    assert.ok(all.includes(result.rewind_id));

    const now = await client.getSession({ session_id });
    assert.equal(now.turn_count, 2, 'a files rewind keeps the conversation');
  });
});
