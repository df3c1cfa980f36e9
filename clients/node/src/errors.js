// Typed errors: the google.rpc.Status the server puts in the `grpc-status-details-bin` trailer,
// decoded into an AgentRewindError with the ErrorInfo's reason and metadata and the BadRequest's
// field violations (docs/errors.md, AIP-193).
import grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';

/** The ErrorInfo domain of every error this service sends. */
export const DOMAIN = 'agent-rewind.v1';

const DETAILS_KEY = 'grpc-status-details-bin';

// The four google.rpc messages this client reads, written out by hand instead of vendoring the
// .proto files: names and field numbers as in googleapis' google/rpc/status.proto and
// google/rpc/error_details.proto (Apache License 2.0), keepCase names like the rest of the client.
const rpc = protobuf.Root.fromJSON(/** @type {any} */ ({
  nested: {
    google: {
      nested: {
        protobuf: {
          nested: {
            Any: { fields: { type_url: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } },
          },
        },
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: 'int32', id: 1 },
                message: { type: 'string', id: 2 },
                details: { rule: 'repeated', type: 'google.protobuf.Any', id: 3 },
              },
            },
            ErrorInfo: {
              fields: {
                reason: { type: 'string', id: 1 },
                domain: { type: 'string', id: 2 },
                metadata: { keyType: 'string', type: 'string', id: 3 },
              },
            },
            BadRequest: {
              fields: { field_violations: { rule: 'repeated', type: 'FieldViolation', id: 1 } },
              nested: {
                FieldViolation: {
                  fields: {
                    field: { type: 'string', id: 1 },
                    description: { type: 'string', id: 2 },
                    reason: { type: 'string', id: 3 },
                  },
                },
              },
            },
          },
        },
      },
    },
  },
}));
const Status = rpc.lookupType('google.rpc.Status');
const ErrorInfo = rpc.lookupType('google.rpc.ErrorInfo');
const BadRequest = rpc.lookupType('google.rpc.BadRequest');
const TO_OBJECT = { defaults: true, arrays: true, objects: true };

/**
 * Every ErrorInfo reason (protos/agent_rewind/v1/error_reason.proto), for `err.reason === Reason.X`.
 * @type {Readonly<Record<string, string>>}
 */
export const Reason = Object.freeze(
  Object.fromEntries(
    [
      'SESSION_NOT_FOUND', 'MESSAGE_NOT_FOUND', 'NOT_A_REWIND_POINT', 'INVALID_ARGUMENT',
      'TURN_IN_FLIGHT', 'NO_CONVERSATION_ANCHOR', 'FILE_CHECKPOINT_UNAVAILABLE',
      'CHECKPOINTING_DISABLED', 'REWIND_CONFLICT', 'REQUEST_ID_REUSED', 'PERMISSION_DENIED',
      'UNAUTHENTICATED', 'WORKSPACE_OUTSIDE_ROOT', 'AGENT_UNAVAILABLE', 'CURSOR_EXPIRED',
      'SUBSCRIBER_TOO_SLOW', 'INTERNAL', 'SESSION_ALREADY_EXISTS', 'SHUTTING_DOWN', 'UNIMPLEMENTED',
      'OPTION_NOT_ALLOWED', 'WORKSPACE_IN_USE', 'LIVE_SESSIONS_EXHAUSTED', 'EXTERNAL_CHANGES',
      'UNDO_UNAVAILABLE', 'SNAPSHOT_UNAVAILABLE', 'REPLICA_UNAVAILABLE', 'QUOTA_EXCEEDED',
      'STORAGE_UNAVAILABLE', 'PATH_OUTSIDE_WORKSPACE', 'REVERT_CONFLICT', 'FILES_PRUNED',
    ].map((r) => [r, r]),
  ),
);

// Reasons worth retrying later with backoff even though their status is not UNAVAILABLE.
const RETRYABLE_REASONS = new Set(['LIVE_SESSIONS_EXHAUSTED', 'QUOTA_EXCEEDED', 'SUBSCRIBER_TOO_SLOW']);
const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));

/**
 * @typedef {{field: string, description: string, reason: string}} FieldViolation
 * @typedef {{type_url: string, value: Uint8Array}} AnyDetail
 * @typedef {{
 *   code: number, message: string, reason?: string, domain?: string,
 *   metadata?: Record<string, string>, fieldViolations?: FieldViolation[],
 *   details?: AnyDetail[], cause?: unknown,
 * }} ErrorFields
 */

/** A failed call: its gRPC status and, when the server sent them, its ErrorInfo and BadRequest. */
export class AgentRewindError extends Error {
  /** @param {ErrorFields} fields */
  constructor({ code, message, reason = '', domain = '', metadata = {}, fieldViolations = [], details = [], cause }) {
    const codeName = CODE_NAMES[code] ?? String(code);
    super(`${codeName}${reason && reason !== codeName ? ` (${reason})` : ''}: ${message}`, { cause });
    this.name = new.target.name;
    /** The gRPC status code (a number, `grpc.status.NOT_FOUND`...). */
    this.code = code;
    /** Its name: 'NOT_FOUND', 'UNAVAILABLE'... */
    this.codeName = codeName;
    /** The status message as the server wrote it. */
    this.details = message;
    /** The ErrorInfo reason ('SESSION_NOT_FOUND'...); '' when the status carried none (a transport error). */
    this.reason = reason;
    /** The ErrorInfo domain: 'agent-rewind.v1' for this service's errors. */
    this.domain = domain;
    /** The ErrorInfo metadata: lower_snake_case keys, string values. @type {Record<string, string>} */
    this.metadata = metadata;
    /** The BadRequest's field violations (INVALID_ARGUMENT, OPTION_NOT_ALLOWED). @type {FieldViolation[]} */
    this.fieldViolations = fieldViolations;
    /** Every status detail, packed (type_url, value). @type {AnyDetail[]} */
    this.statusDetails = details;
  }

  /** Whether the same call may succeed later, after a backoff (send it with its request_id). */
  get retryable() {
    return this.code === grpc.status.UNAVAILABLE || RETRYABLE_REASONS.has(this.reason);
  }
}

export class SessionNotFoundError extends AgentRewindError {}
export class InvalidArgumentError extends AgentRewindError {
  /** The first field the BadRequest names (metadata `field` as a fallback). */
  get field() {
    return this.fieldViolations[0]?.field ?? this.metadata.field ?? '';
  }
}
export class TurnInFlightError extends AgentRewindError {}
export class RewindConflictError extends AgentRewindError {
  /** The session's actual newest visible message: decide again against it. */
  get lastMessageId() {
    return this.metadata.last_message_id ?? '';
  }
}
export class PermissionDeniedError extends AgentRewindError {
  /** The permission the call needed. */
  get permission() {
    return this.metadata.permission ?? '';
  }
}
export class UnauthenticatedError extends AgentRewindError {}
export class CursorExpiredError extends AgentRewindError {
  /** The oldest retained cursor (a uint64, as a decimal string): resync, then watch after it minus one. */
  get oldestCursor() {
    return this.metadata.oldest_cursor ?? '';
  }
}
export class SubscriberTooSlowError extends AgentRewindError {
  /** The last cursor sent (a decimal string): watch again with after_cursor set to it. */
  get lastCursor() {
    return this.metadata.last_cursor ?? '';
  }
}
export class ShuttingDownError extends AgentRewindError {}
export class LiveSessionsExhaustedError extends AgentRewindError {
  get maxLiveSessions() {
    return Number(this.metadata.max_live_sessions ?? 0);
  }
}

/** @type {Record<string, typeof AgentRewindError>} */
const CLASS_BY_REASON = {
  SESSION_NOT_FOUND: SessionNotFoundError,
  INVALID_ARGUMENT: InvalidArgumentError,
  TURN_IN_FLIGHT: TurnInFlightError,
  REWIND_CONFLICT: RewindConflictError,
  PERMISSION_DENIED: PermissionDeniedError,
  UNAUTHENTICATED: UnauthenticatedError,
  CURSOR_EXPIRED: CursorExpiredError,
  SUBSCRIBER_TOO_SLOW: SubscriberTooSlowError,
  SHUTTING_DOWN: ShuttingDownError,
  LIVE_SESSIONS_EXHAUSTED: LiveSessionsExhaustedError,
};

/**
 * Decodes a serialized google.rpc.Status (the `grpc-status-details-bin` trailer).
 * @param {Uint8Array} bytes
 */
export function decodeStatus(bytes) {
  const status = Status.toObject(Status.decode(bytes), TO_OBJECT);
  let info = null;
  /** @type {FieldViolation[]} */
  const fieldViolations = [];
  for (const any of status.details) {
    const type = any.type_url.slice(any.type_url.lastIndexOf('/') + 1);
    if (type === 'google.rpc.ErrorInfo' && info === null) {
      info = ErrorInfo.toObject(ErrorInfo.decode(any.value), TO_OBJECT);
    } else if (type === 'google.rpc.BadRequest') {
      fieldViolations.push(...BadRequest.toObject(BadRequest.decode(any.value), TO_OBJECT).field_violations);
    }
  }
  return {
    code: status.code,
    message: status.message,
    reason: info?.reason ?? '',
    domain: info?.domain ?? '',
    metadata: info?.metadata ?? {},
    fieldViolations,
    details: status.details,
  };
}

/**
 * The typed error for a failed gRPC call (a grpc-js ServiceError); anything else comes back as is.
 * @param {any} err
 * @returns {AgentRewindError | unknown}
 */
export function toAgentRewindError(err) {
  if (err instanceof AgentRewindError || typeof err?.code !== 'number' || err?.metadata === undefined) {
    return err;
  }
  /** @type {ErrorFields} */
  let fields = { code: err.code, message: err.details ?? err.message, cause: err };
  const raw = err.metadata?.get?.(DETAILS_KEY)?.[0];
  if (raw instanceof Uint8Array) {
    try {
      fields = { ...decodeStatus(raw), code: err.code, cause: err };
    } catch {
      // An undecodable trailer: keep the bare status rather than hide the original error.
    }
  }
  const Class = (fields.domain === DOMAIN && CLASS_BY_REASON[fields.reason ?? '']) || AgentRewindError;
  return new Class(fields);
}

/**
 * Encodes a google.rpc.Status: for tests and fakes that need to produce a server's error.
 * @param {{code: number, message?: string, reason?: string, domain?: string,
 *   metadata?: Record<string, string>, fieldViolations?: Array<{field: string, description?: string}>}} status
 */
export function encodeStatus({ code, message = '', reason = '', domain = DOMAIN, metadata = {}, fieldViolations = [] }) {
  const details = [];
  if (reason) {
    const value = ErrorInfo.encode(ErrorInfo.fromObject({ reason, domain, metadata })).finish();
    details.push({ type_url: 'type.googleapis.com/google.rpc.ErrorInfo', value });
  }
  if (fieldViolations.length) {
    const value = BadRequest.encode(BadRequest.fromObject({ field_violations: fieldViolations })).finish();
    details.push({ type_url: 'type.googleapis.com/google.rpc.BadRequest', value });
  }
  return Status.encode(Status.fromObject({ code, message, details })).finish();
}
