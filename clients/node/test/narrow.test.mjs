// RewindRequest.paths and scope: what the client sends (offline, to a server of the test's own),
// and what a real server does with them: a rewind narrowed to some paths, and the revert of one
// turn that keeps the later turns' changes.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { isAbsolute, join, relative } from 'node:path';
import { after, before, describe, test } from 'node:test';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';
import { AgentRewindError, connect, LOADER_OPTIONS, PROTO_DIR, Reason, status } from '@agent-rewind/client';
import { rejection, SERVER, turn, twoTurns } from './support.mjs';

const read = (path) => (existsSync(path) ? readFileSync(path, 'utf8') : null);
/** Workspace-relative, whether the server named a path absolute or relative. */
const inWorkspace = (cwd, paths) => paths.map((p) => (isAbsolute(p) ? relative(cwd, p) : p)).toSorted();

describe('what the client sends', () => {
  const seen = [];
  let server;
  let client;

  before(async () => {
    // A RewindService of our own that records each request and answers an empty result.
    const definition = protoLoader.loadSync('agent_rewind/v1/rewind_service.proto', { ...LOADER_OPTIONS, includeDirs: [PROTO_DIR] });
    const { RewindService } = grpc.loadPackageDefinition(definition).agent_rewind.v1;
    const record = (method) => (call, callback) => {
      seen.push({ method, request: call.request });
      callback(null, {});
    };
    server = new grpc.Server();
    server.addService(RewindService.service, { DryRun: record('DryRun'), Rewind: record('Rewind'), UndoRewind: record('UndoRewind') });
    const port = await new Promise((resolve, reject) =>
      server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
    );
    client = connect(`127.0.0.1:${port}`);
  });
  after(() => {
    client?.close();
    server?.forceShutdown();
  });

  test('paths and scope reach DryRun and Rewind; short names are made whole', async () => {
    seen.length = 0;
    const request = { session_id: 's', message_id: 'm', mode: 'files', paths: ['src/', 'a b.txt'], scope: 'turn', conflict_policy: 'Skip' };
    await client.dryRun(request);
    await client.rewind({ ...request, scope: 'REWIND_SCOPE_SINCE', conflict_policy: 3 });
    assert.deepEqual(
      seen.map(({ method, request: r }) => [method, r.mode, r.paths, r.scope, r.conflict_policy]),
      [
        ['DryRun', 'REWIND_MODE_FILES', ['src/', 'a b.txt'], 'REWIND_SCOPE_TURN', 'CONFLICT_POLICY_SKIP'],
        ['Rewind', 'REWIND_MODE_FILES', ['src/', 'a b.txt'], 'REWIND_SCOPE_SINCE', 'CONFLICT_POLICY_OVERWRITE'],
      ],
    );
  });

  test('without paths and scope nothing is narrowed', async () => {
    seen.length = 0;
    await client.dryRun({ session_id: 's', message_id: 'm', mode: 'REWIND_MODE_BOTH' });
    const [{ request }] = seen;
    assert.deepEqual([request.mode, request.paths, request.scope], ['REWIND_MODE_BOTH', [], 'REWIND_SCOPE_UNSPECIFIED']);
  });

  test('a name the enum does not have is a TypeError, and nothing is sent', async () => {
    // protobufjs alone would send it as 0: scope 'turns' would become a rewind of everything since.
    seen.length = 0;
    const base = { session_id: 's', message_id: 'm', mode: 'files' };
    const scope = await rejection(client.dryRun({ ...base, scope: 'turns' }));
    assert.ok(scope instanceof TypeError);
    assert.equal(scope.message, `scope: "turns" is not one of 'since', 'turn' (or a whole REWIND_SCOPE_... name, or its number)`);
    const mode = await rejection(client.rewind({ ...base, mode: 'everything' }));
    assert.match(mode.message, /^mode: "everything" is not one of 'files', 'conversation', 'both'/);
    const policy = await rejection(client.undoRewind({ session_id: 's', rewind_id: 'r', conflict_policy: 'merge' }));
    assert.match(policy.message, /^conflict_policy: "merge" is not one of 'refuse', 'skip', 'overwrite'/);
    assert.throws(() => client.prompt({ session_id: 's', text: 't', rewind: { message_id: 'm', mode: 'all' } }), TypeError);
    assert.deepEqual(seen, []);
  });
});

// These need a server that serves RewindRequest.paths and scope (issue 39).
describe(`paths and scope against ${SERVER}`, () => {
  const client = connect(SERVER);
  after(() => client.close());

  test('paths narrow a dry run, the rewind, its event and its undo', async () => {
    const { session, points } = await twoTurns(client); // a.txt v0 -> v1 and b.txt made, in turn 2
    const { session_id, cwd } = session;
    const request = { session_id, message_id: points[1], mode: 'files', paths: ['b.txt'] };

    const preview = await client.dryRun(request);
    assert.equal(preview.files.can_rewind, true);
    assert.deepEqual(inWorkspace(cwd, preview.files.files_changed), ['b.txt'], 'a.txt is not among the paths');

    const watch = client.watchRewindEvents({ session_id });
    const feed = watch[Symbol.asyncIterator]();
    assert.equal((await feed.next()).value.response, 'caught_up');
    const result = await client.rewind(request);
    assert.equal(read(join(cwd, 'b.txt')), null);
    assert.equal(read(join(cwd, 'a.txt')), 'v1\n', 'every other path keeps its content');
    const { event } = (await feed.next()).value;
    watch.cancel();
    assert.equal(event.rewind_id, result.rewind_id);
    assert.deepEqual(event.paths, ['b.txt']);

    await client.undoRewind({ session_id, rewind_id: result.rewind_id });
    assert.equal(read(join(cwd, 'b.txt')), 'bee\n');
    assert.equal(read(join(cwd, 'a.txt')), 'v1\n');
  });

  test('a path outside the workspace is PATH_OUTSIDE_WORKSPACE, naming paths', async () => {
    const { session, points } = await twoTurns(client);
    for (const path of ['../elsewhere', '/etc/passwd']) {
      const err = await rejection(client.dryRun({ session_id: session.session_id, message_id: points[1], paths: [path] }));
      assert.ok(err instanceof AgentRewindError);
      assert.equal(err.code, status.INVALID_ARGUMENT, path);
      assert.equal(err.reason, Reason.PATH_OUTSIDE_WORKSPACE, path);
      assert.deepEqual(err.fieldViolations.map((v) => v.field), ['paths'], path);
    }
  });

  /** Three turns over a.txt's five lines: turn 2 changes the first and makes c.txt; turn 3 `third`. */
  async function threeTurns(third) {
    const session = await client.createSession({});
    const { session_id } = session;
    const points = [];
    for (const text of ['write a.txt alpha\\nbeta\\ngamma\\ndelta\\nepsilon', 'edit a.txt alpha => ALPHA\nwrite c.txt created', third]) {
      points.push((await turn(client, session_id, text)).point);
    }
    return { session, points };
  }

  test('a revert of turn 2 of 3 undoes its changes and keeps turn 3 and the conversation', async () => {
    const { session, points } = await threeTurns('edit a.txt epsilon => EPSILON');
    const { session_id, cwd } = session;
    const before = await client.listRewindPoints({ session_id });
    const request = { session_id, message_id: points[1], mode: 'files', scope: 'turn' };

    const preview = await client.dryRun({ ...request, include_diff: true });
    assert.equal(preview.files.can_rewind, true);
    assert.deepEqual(inWorkspace(cwd, preview.files.files_changed), ['a.txt', 'c.txt']);
    assert.deepEqual(preview.files.conflicts, []);
    assert.deepEqual(
      preview.files.diffs.map((d) => [d.path, d.change]).toSorted(),
      [['a.txt', 'FILE_CHANGE_MODIFIED'], ['c.txt', 'FILE_CHANGE_DELETED']],
    );
    assert.equal(read(join(cwd, 'c.txt')), 'created\n', 'a dry run applies nothing');

    const result = await client.rewind(request);
    assert.match(result.rewind_id, /./);
    assert.equal(read(join(cwd, 'a.txt')), 'alpha\nbeta\ngamma\ndelta\nEPSILON\n');
    assert.equal(read(join(cwd, 'c.txt')), null, 'the file turn 2 made is gone');

    const now = await client.listRewindPoints({ session_id });
    assert.deepEqual(now.points.map((p) => p.message_id), points, 'the points stay points');
    assert.equal(now.last_message_id, before.last_message_id, 'the conversation is unchanged');

    const events = [];
    for await (const r of client.watchRewindEvents({ session_id, after_cursor: 0 })) {
      if (r.response === 'caught_up') break;
      events.push(r.event);
    }
    assert.equal(events.at(-1).rewind_id, result.rewind_id);
    assert.equal(events.at(-1).scope, 'REWIND_SCOPE_TURN');
  });

  test('a later turn that changed the same line is a conflict: refused by default, skipped with skip', async () => {
    const { session, points } = await threeTurns('edit a.txt ALPHA => Alpha!');
    const { session_id, cwd } = session;
    const request = { session_id, message_id: points[1], mode: 'files', scope: 'turn' };

    const preview = await client.dryRun(request);
    assert.equal(preview.files.can_rewind, false);
    assert.equal(preview.files.refusal.reason, Reason.REVERT_CONFLICT);
    assert.deepEqual(preview.files.conflicts, [{ path: 'a.txt', resolution: 'CONFLICT_RESOLUTION_REFUSED' }]);

    const refused = await rejection(client.rewind(request));
    assert.equal(refused.code, status.FAILED_PRECONDITION);
    assert.equal(refused.reason, Reason.REVERT_CONFLICT);
    assert.equal(refused.metadata.paths, '1');
    assert.equal(read(join(cwd, 'c.txt')), 'created\n', 'a refused revert applies nothing');

    const skipped = await client.rewind({ ...request, conflict_policy: 'skip' });
    assert.deepEqual(skipped.files.conflicts, [{ path: 'a.txt', resolution: 'CONFLICT_RESOLUTION_SKIPPED' }]);
    assert.equal(read(join(cwd, 'a.txt')), 'Alpha!\nbeta\ngamma\ndelta\nepsilon\n', 'left as it is');
    assert.equal(read(join(cwd, 'c.txt')), null);
  });

  test('scope turn with a mode other than files is INVALID_ARGUMENT, naming scope', async () => {
    const { session, points } = await twoTurns(client);
    const err = await rejection(client.dryRun({ session_id: session.session_id, message_id: points[1], mode: 'both', scope: 'turn' }));
    assert.equal(err.code, status.INVALID_ARGUMENT);
    assert.deepEqual(err.fieldViolations.map((v) => v.field), ['scope']);
  });
});
