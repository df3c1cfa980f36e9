// Bearer tokens against a server with an access file: `authorization: Bearer <token>` on every
// call, unary and streaming.
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import {
  connect,
  PermissionDeniedError,
  Reason,
  status,
  UnauthenticatedError,
} from '@agent-rewind/client';
import { AUTH_SERVER, AUTH_TOKEN, READER_TOKEN, rejection, streamFailure, turn } from './support.mjs';

// Skipped test by test (a skipped suite would not show in the run's count of skipped tests).
const skip = !AUTH_SERVER && 'AGENT_REWIND_AUTH_SERVER is not set';

describe(`bearer tokens against ${AUTH_SERVER || '$AGENT_REWIND_AUTH_SERVER'}`, () => {
  const clients = [];
  const as = (token) => {
    const client = connect(AUTH_SERVER, { token });
    clients.push(client);
    return client;
  };
  after(() => clients.forEach((c) => c.close()));

  test('no token, or a wrong one, is UNAUTHENTICATED', { skip }, async () => {
    for (const token of [undefined, 'arw_wrong']) {
      const err = await rejection(as(token).getCapabilities());
      assert.ok(err instanceof UnauthenticatedError, String(err));
      assert.equal(err.code, status.UNAUTHENTICATED);
      assert.equal(err.reason, Reason.UNAUTHENTICATED);
      const streamed = await streamFailure(as(token).watchRewindEvents({}));
      assert.equal(streamed.code, status.UNAUTHENTICATED);
    }
  });

  test('with the token every kind of call goes through', { skip }, async () => {
    const client = as(AUTH_TOKEN);
    const caps = await client.getCapabilities();
    assert.equal(caps.authentication, true);
    const session = await client.createSession({});
    assert.equal(session.principal, 'node');
    const { point, events } = await turn(client, session.session_id, 'write a.txt v0');
    assert.match(point, /./);
    assert.equal(events.at(-1).result.subtype, 'success');
    const { points } = await client.listRewindPoints({ session_id: session.session_id });
    assert.deepEqual(points.map((p) => p.message_id), [point]);
    for await (const r of client.watchRewindEvents({ session_id: session.session_id })) {
      assert.equal(r.response, 'caught_up');
      break;
    }
  });

  test('a token without the permission is PERMISSION_DENIED naming it', { skip }, async () => {
    const reader = as(READER_TOKEN);
    assert.equal((await reader.getCapabilities()).authentication, true);
    const err = await rejection(reader.createSession({}));
    assert.ok(err instanceof PermissionDeniedError, String(err));
    assert.equal(err.code, status.PERMISSION_DENIED);
    assert.equal(err.permission, 'sessions.write');
  });
});
