export { AgentRewindClient, connect, LOADER_OPTIONS, PROTO_DIR, ServerStream } from './client.js';
export {
  AgentRewindError,
  CursorExpiredError,
  decodeStatus,
  DOMAIN,
  encodeStatus,
  InvalidArgumentError,
  LiveSessionsExhaustedError,
  PermissionDeniedError,
  Reason,
  RewindConflictError,
  SessionNotFoundError,
  ShuttingDownError,
  SubscriberTooSlowError,
  toAgentRewindError,
  TurnInFlightError,
  UnauthenticatedError,
} from './errors.js';
export { fromStruct, toDate, toStruct } from './values.js';
export { status } from '@grpc/grpc-js';
