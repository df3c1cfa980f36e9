// Typed errors: decoding google.rpc.Status details (offline), and the errors a real server sends.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, describe, test } from 'node:test';
import { join } from 'node:path';
import grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import {
  AgentRewindError,
  connect,
  CursorExpiredError,
  decodeStatus,
  DOMAIN,
  encodeStatus,
  InvalidArgumentError,
  LiveSessionsExhaustedError,
  PROTO_DIR,
  Reason,
  RewindConflictError,
  SessionNotFoundError,
  ShuttingDownError,
  status,
  SubscriberTooSlowError,
  toAgentRewindError,
} from '@agent-rewind/client';
import { rejection, SERVER, streamFailure, twoTurns } from './support.mjs';

/** What grpc-js hands a failed call's callback: a ServiceError with the trailers. */
function serviceError(code, details, statusFields) {
  const metadata = new grpc.Metadata();
  if (statusFields) metadata.set('grpc-status-details-bin', Buffer.from(encodeStatus({ code, message: details, ...statusFields })));
  return Object.assign(new Error(`${code} ${details}`), { code, details, metadata });
}

describe('decoding status details', () => {
  test('Reason lists every value of enum ErrorReason', () => {
    const proto = protobuf.loadSync(join(PROTO_DIR, 'agent_rewind/v1/error_reason.proto'));
    const values = Object.keys(proto.lookupEnum('agent_rewind.v1.ErrorReason').values);
    assert.deepEqual(Object.keys(Reason).toSorted(), values.filter((v) => v !== 'ERROR_REASON_UNSPECIFIED').toSorted());
  });

  test('a Status round-trips with its ErrorInfo and BadRequest', () => {
    const bytes = encodeStatus({
      code: status.INVALID_ARGUMENT,
      message: 'bad cwd',
      reason: 'INVALID_ARGUMENT',
      metadata: { field: 'cwd' },
      fieldViolations: [{ field: 'cwd', description: 'not absolute' }],
    });
    const decoded = decodeStatus(bytes);
    assert.equal(decoded.code, status.INVALID_ARGUMENT);
    assert.equal(decoded.message, 'bad cwd');
    assert.equal(decoded.reason, 'INVALID_ARGUMENT');
    assert.equal(decoded.domain, DOMAIN);
    assert.deepEqual(decoded.metadata, { field: 'cwd' });
    assert.deepEqual(decoded.fieldViolations, [{ field: 'cwd', description: 'not absolute', reason: '' }]);
  });

  test('each reason clients branch on has its class and typed fields', () => {
    const expired = toAgentRewindError(
      serviceError(status.OUT_OF_RANGE, 'too old', { reason: 'CURSOR_EXPIRED', metadata: { oldest_cursor: '18446744073709551615' } }),
    );
    assert.ok(expired instanceof CursorExpiredError && expired instanceof AgentRewindError);
    assert.equal(expired.oldestCursor, '18446744073709551615', 'a uint64 beyond 2^53 survives as a string');
    assert.equal(expired.retryable, false);

    const slow = toAgentRewindError(
      serviceError(status.RESOURCE_EXHAUSTED, 'behind', { reason: 'SUBSCRIBER_TOO_SLOW', metadata: { last_cursor: '41' } }),
    );
    assert.ok(slow instanceof SubscriberTooSlowError);
    assert.equal(slow.lastCursor, '41');
    assert.equal(slow.retryable, true);

    const draining = toAgentRewindError(serviceError(status.UNAVAILABLE, 'draining', { reason: 'SHUTTING_DOWN' }));
    assert.ok(draining instanceof ShuttingDownError);
    assert.equal(draining.retryable, true);
    assert.equal(draining.codeName, 'UNAVAILABLE');
    assert.equal(draining.message, 'UNAVAILABLE (SHUTTING_DOWN): draining');

    const full = toAgentRewindError(
      serviceError(status.RESOURCE_EXHAUSTED, 'full', { reason: 'LIVE_SESSIONS_EXHAUSTED', metadata: { max_live_sessions: '8' } }),
    );
    assert.ok(full instanceof LiveSessionsExhaustedError);
    assert.equal(full.maxLiveSessions, 8);
    assert.equal(full.retryable, true);

    const conflict = toAgentRewindError(
      serviceError(status.ABORTED, 'stale', { reason: 'REWIND_CONFLICT', metadata: { last_message_id: 'm-2' } }),
    );
    assert.ok(conflict instanceof RewindConflictError);
    assert.equal(conflict.lastMessageId, 'm-2');
  });

  test('reasons without a class, other domains, bare statuses and other errors', () => {
    const external = toAgentRewindError(
      serviceError(status.FAILED_PRECONDITION, 'changed', { reason: 'EXTERNAL_CHANGES', metadata: { paths: '2' } }),
    );
    assert.equal(external.constructor, AgentRewindError);
    assert.equal(external.reason, Reason.EXTERNAL_CHANGES);
    assert.deepEqual(external.metadata, { paths: '2' });

    const foreign = toAgentRewindError(
      serviceError(status.NOT_FOUND, 'no', { reason: 'SESSION_NOT_FOUND', domain: 'example.com' }),
    );
    assert.equal(foreign.constructor, AgentRewindError, 'only this service domain maps to classes');
    assert.equal(foreign.domain, 'example.com');

    const bare = toAgentRewindError(serviceError(status.DEADLINE_EXCEEDED, 'deadline'));
    assert.ok(bare instanceof AgentRewindError);
    assert.equal(bare.reason, '');
    assert.deepEqual([bare.metadata, bare.fieldViolations], [{}, []]);

    const garbled = serviceError(status.INTERNAL, 'x');
    garbled.metadata.set('grpc-status-details-bin', Buffer.from([0xff, 0xff, 0xff]));
    assert.equal(toAgentRewindError(garbled).reason, '', 'an undecodable trailer keeps the bare status');

    const plain = new TypeError('not a gRPC error');
    assert.equal(toAgentRewindError(plain), plain);
  });
});

describe(`errors from the server at ${SERVER}`, () => {
  const client = connect(SERVER);
  after(() => client.close());

  test('an unknown session is SESSION_NOT_FOUND', async () => {
    const id = randomUUID();
    const err = await rejection(client.getSession({ session_id: id }));
    assert.ok(err instanceof SessionNotFoundError, String(err));
    assert.equal(err.code, status.NOT_FOUND);
    assert.equal(err.reason, Reason.SESSION_NOT_FOUND);
    assert.equal(err.domain, 'agent-rewind.v1');
    assert.equal(err.metadata.session_id, id);
    assert.match(err.message, /^NOT_FOUND \(SESSION_NOT_FOUND\): /);
  });

  test('a stale expected_last_message_id is REWIND_CONFLICT with the actual id', async () => {
    const { session, points } = await twoTurns(client);
    const { last_message_id } = await client.listRewindPoints({ session_id: session.session_id });
    const err = await rejection(
      client.rewind({ session_id: session.session_id, message_id: points[1], expected_last_message_id: points[0] }),
    );
    assert.ok(err instanceof RewindConflictError, String(err));
    assert.equal(err.code, status.ABORTED);
    assert.equal(err.lastMessageId, last_message_id);
    assert.equal(err.retryable, false);
  });

  test('a cursor beyond the newest is INVALID_ARGUMENT naming after_cursor', async () => {
    const err = await streamFailure(client.watchRewindEvents({ after_cursor: 999999 }));
    assert.ok(err instanceof InvalidArgumentError, String(err));
    assert.equal(err.code, status.INVALID_ARGUMENT);
    assert.equal(err.field, 'after_cursor');
    assert.deepEqual(
      err.fieldViolations.map((v) => v.field),
      ['after_cursor'],
    );
    assert.match(err.fieldViolations[0].description, /999999/);
  });

  test('malformed fields and disallowed options name the field in a BadRequest', async () => {
    const session = await client.createSession({});
    const bad = await rejection(client.dryRun({ session_id: session.session_id, message_id: 'not an id' }));
    assert.ok(bad instanceof InvalidArgumentError, String(bad));
    assert.equal(bad.field, 'message_id');
    const unknown = await rejection(client.dryRun({ session_id: session.session_id, message_id: randomUUID() }));
    assert.equal(unknown.reason, Reason.MESSAGE_NOT_FOUND);
    assert.equal(unknown.code, status.NOT_FOUND);

    const refused = await rejection(client.createSession({ options: { permission_mode: 'bypassPermissions' } }));
    assert.equal(refused.reason, Reason.OPTION_NOT_ALLOWED);
    assert.equal(refused.code, status.INVALID_ARGUMENT);
    assert.deepEqual(
      refused.fieldViolations.map((v) => v.field),
      ['options.permission_mode'],
    );
  });

  test('deadlines and AbortSignals', async () => {
    const late = await rejection(client.getCapabilities({ timeoutMs: 0 }));
    assert.equal(late.code, status.DEADLINE_EXCEEDED);
    const aborted = new AbortController();
    aborted.abort();
    const cancelled = await rejection(client.getCapabilities({ signal: aborted.signal }));
    assert.equal(cancelled.code, status.CANCELLED);
    const stop = new AbortController();
    const seen = [];
    for await (const r of client.watchRewindEvents({}, { signal: stop.signal })) {
      seen.push(r.response);
      stop.abort(); // a watch stopped by its own signal ends quietly
    }
    assert.deepEqual(seen, ['caught_up']);
  });

  test('no server: UNAVAILABLE without a reason, retryable', async () => {
    const nowhere = connect('127.0.0.1:1');
    try {
      const err = await rejection(nowhere.getCapabilities({ timeoutMs: 5000 }));
      assert.ok(err instanceof AgentRewindError, String(err));
      assert.equal(err.code, status.UNAVAILABLE);
      assert.equal(err.reason, '');
      assert.equal(err.retryable, true);
    } finally {
      nowhere.close();
    }
  });
});
