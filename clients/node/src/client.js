// The client: the package's copy of the protos loaded with proto-loader, one channel,
// promise-returning unary calls and async-iterable streams, every failure an AgentRewindError.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';
import { toAgentRewindError } from './errors.js';
import { enumValue, fromStruct, toStruct } from './values.js';

/**
 * Where agent_rewind/v1/*.proto are: the package's own copy of the repo's protos/, committed and
 * kept equal to them by `make proto`, so the package carries them wherever npm puts it (installed
 * from a path or a tarball) with no install script, and runs in the checkout as it runs installed.
 */
export const PROTO_DIR = fileURLToPath(new URL('../protos/', import.meta.url));

/**
 * How messages look in JavaScript. keepCase: field names exactly as in the .proto (session_id,
 * after_cursor). longs: String, because cursors are uint64 and may pass 2^53: every 64-bit field
 * (RewindEvent.cursor, Timestamp.seconds, Session.snapshot_bytes...) arrives as a decimal string;
 * requests take a string, a number or a bigint. enums: String ('SESSION_STATE_IDLE'); requests
 * take a name or a number. defaults: absent fields read as their default ('' , 0, false, [],
 * null for a message). oneofs: a oneof's name holds the member that is set (`event.event ===
 * 'user_prompt'`, `response.response === 'caught_up'`).
 */
export const LOADER_OPTIONS = Object.freeze({
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});

const loaded = new Map();

/** @param {string} protoDir */
function loadServices(protoDir) {
  if (!loaded.has(protoDir)) {
    const definition = protoLoader.loadSync(
      ['agent_rewind/v1/session_service.proto', 'agent_rewind/v1/rewind_service.proto'],
      { ...LOADER_OPTIONS, includeDirs: [protoDir] },
    );
    const v1 = /** @type {any} */ (grpc.loadPackageDefinition(definition)).agent_rewind.v1;
    /** @param {string} name */
    const names = (name) => /** @type {any} */ (definition[`agent_rewind.v1.${name}`]).type.value.map((/** @type {any} */ v) => v.name);
    loaded.set(protoDir, {
      SessionService: v1.SessionService,
      RewindService: v1.RewindService,
      // The request fields that take one of these enums: [field, value names, their prefix].
      enums: [
        ['mode', names('RewindMode'), 'REWIND_MODE_'],
        ['conflict_policy', names('ConflictPolicy'), 'CONFLICT_POLICY_'],
        ['scope', names('RewindScope'), 'REWIND_SCOPE_'],
      ],
    });
  }
  return loaded.get(protoDir);
}

/** @param {Buffer | string | undefined} value a PEM (Buffer or string) or the path of a PEM file */
function pem(value) {
  if (value === undefined || value === null) return null;
  if (Buffer.isBuffer(value)) return value;
  return value.includes('-----BEGIN') ? Buffer.from(value) : readFileSync(value);
}

/**
 * @typedef {object} ConnectOptions
 * @property {string} [token] bearer token, sent as `authorization: Bearer <token>` on every call
 * @property {Buffer | string} [tlsCa] CA certificate that signed the server's: TLS (PEM or file path)
 * @property {Buffer | string} [tlsCert] client certificate for mutual TLS (with tlsKey)
 * @property {Buffer | string} [tlsKey] the client certificate's private key
 * @property {boolean} [tls] TLS with the system's roots (implied by tlsCa or tlsCert)
 * @property {Record<string, unknown>} [channelOptions] grpc-js channel options
 * @property {string} [protoDir] where agent_rewind/v1/*.proto live (default: PROTO_DIR, the package's copy)
 *
 * @typedef {object} CallOptions
 * @property {number} [timeoutMs] deadline, in milliseconds from now
 * @property {Date | number} [deadline] absolute deadline
 * @property {AbortSignal} [signal] cancels the call
 * @property {Record<string, string>} [metadata] extra request metadata
 */

/** @param {ConnectOptions} options */
function channelCredentials({ tlsCa, tlsCert, tlsKey, tls }) {
  if ((tlsCert === undefined) !== (tlsKey === undefined)) {
    throw new TypeError('tlsCert and tlsKey go together');
  }
  if (!tls && tlsCa === undefined && tlsCert === undefined) return grpc.credentials.createInsecure();
  return grpc.credentials.createSsl(pem(tlsCa), pem(tlsKey), pem(tlsCert));
}

/** @param {CallOptions} options */
function grpcCallOptions({ timeoutMs, deadline }) {
  if (timeoutMs !== undefined) return { deadline: Date.now() + timeoutMs };
  return deadline !== undefined ? { deadline } : {};
}

/** @param {any} session */
function plainSession(session) {
  return session && { ...session, options: fromStruct(session.options) };
}

/** @param {any} event a TurnEvent: tool inputs as plain objects */
function plainTurnEvent(event) {
  const message = event.assistant_message;
  if (!message) return event;
  const tool_uses = message.tool_uses.map((/** @type {any} */ t) => ({ ...t, input: fromStruct(t.input) }));
  return { ...event, assistant_message: { ...message, tool_uses } };
}

/** A 64-bit request field: numbers and bigints as decimal strings. @param {unknown} v */
function uint64(v) {
  return typeof v === 'bigint' || typeof v === 'number' ? String(v) : v;
}

/**
 * A server stream: `for await (const message of stream)`. Breaking out of the loop, or cancel(),
 * ends the call (a Prompt's turn still runs to its end on the server); a stream cancelled this
 * way ends quietly. Failures are thrown from the loop as AgentRewindError.
 * @template T
 * @implements {AsyncIterable<T>}
 */
export class ServerStream {
  #call;
  #map;
  #cancelled = false;

  /** @param {any} call a grpc-js ClientReadableStream @param {(m: any) => T} map @param {AbortSignal} [signal] */
  constructor(call, map, signal) {
    this.#call = call;
    this.#map = map;
    // The iterator reports errors; this keeps one that arrives after it stopped from going unhandled.
    call.on('error', () => {});
    if (signal?.aborted) this.cancel();
    else signal?.addEventListener('abort', () => this.cancel(), { once: true });
  }

  /** Ends the call. */
  cancel() {
    this.#cancelled = true;
    this.#call.cancel();
  }

  /** @returns {AsyncGenerator<T>} */
  async *[Symbol.asyncIterator]() {
    try {
      for await (const message of this.#call) yield this.#map(message);
    } catch (err) {
      if (this.#cancelled && /** @type {any} */ (err)?.code === grpc.status.CANCELLED) return;
      throw toAgentRewindError(err);
    } finally {
      this.cancel();
    }
  }
}

/** A connection to one agent-rewind server. Make one with `connect()`. */
export class AgentRewindClient {
  #channel;
  #sessions;
  #rewinds;
  #token;
  #enums;

  /** @param {string} address @param {ConnectOptions} options */
  constructor(address, options = {}) {
    const { SessionService, RewindService, enums } = loadServices(options.protoDir ?? PROTO_DIR);
    this.#enums = enums;
    const credentials = channelCredentials(options);
    this.address = address;
    this.#token = options.token;
    this.#channel = new grpc.Channel(address, credentials, options.channelOptions ?? {});
    this.#sessions = new SessionService(address, credentials, { channelOverride: this.#channel });
    this.#rewinds = new RewindService(address, credentials, { channelOverride: this.#channel });
  }

  /**
   * A request (or PromptRequest.rewind) with its mode, conflict_policy and scope as the loader
   * takes them: short names ('both', 'skip', 'turn') made whole, an unknown name a TypeError
   * (thrown; the async methods reject with it, and nothing is sent).
   * @template {Record<string, any>} R @param {R} request @returns {R}
   */
  #rewindFields(request) {
    const out = /** @type {Record<string, any>} */ ({ ...request });
    for (const [field, names, prefix] of this.#enums) {
      if (field in out) out[field] = enumValue(field, names, prefix, out[field]);
    }
    return /** @type {R} */ (out);
  }

  /** @param {Record<string, string>} [extra] */
  #metadata(extra = {}) {
    const metadata = new grpc.Metadata();
    if (this.#token) metadata.set('authorization', `Bearer ${this.#token}`);
    for (const [key, value] of Object.entries(extra)) metadata.set(key, value);
    return metadata;
  }

  /**
   * @param {any} stub @param {string} method @param {object} request @param {CallOptions} options
   * @param {(response: any) => any} [map]
   */
  #unary(stub, method, request, options = {}, map = (r) => r) {
    return new Promise((resolve, reject) => {
      const onAbort = () => call.cancel();
      const call = stub[method](
        request,
        this.#metadata(options.metadata),
        grpcCallOptions(options),
        (/** @type {any} */ err, /** @type {any} */ response) => {
          options.signal?.removeEventListener('abort', onAbort);
          if (err) reject(toAgentRewindError(err));
          else resolve(map(response));
        },
      );
      if (options.signal?.aborted) call.cancel();
      else options.signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** @param {any} stub @param {string} method @param {object} request @param {CallOptions} options @param {(m: any) => any} map */
  #stream(stub, method, request, options = {}, map = (m) => m) {
    const call = stub[method](request, this.#metadata(options.metadata), grpcCallOptions(options));
    return new ServerStream(call, map, options.signal);
  }

  /** Resolves once the channel is connected (rejects after timeoutMs). @param {number} timeoutMs */
  waitForReady(timeoutMs = 10_000) {
    return new Promise((resolve, reject) => {
      this.#sessions.waitForReady(Date.now() + timeoutMs, (/** @type {Error | undefined} */ err) =>
        err ? reject(err) : resolve(undefined),
      );
    });
  }

  /** Closes the channel; calls in flight fail with CANCELLED. */
  close() {
    this.#channel.close();
  }

  // SessionService

  /**
   * `options` is a plain object of SDK options (model, system_prompt, allowed_tools...): it is
   * sent as a google.protobuf.Struct. Sessions come back with `options` as a plain object too.
   * @param {{cwd?: string, session_id?: string, options?: Record<string, unknown>,
   *   enable_file_checkpointing?: boolean, request_id?: string, workspace_snapshots?: boolean}} request
   * @param {CallOptions} [options]
   */
  createSession(request = {}, options) {
    const body = request.options ? { ...request, options: toStruct(request.options) } : request;
    return this.#unary(this.#sessions, 'CreateSession', body, options, plainSession);
  }

  /** @param {{session_id: string}} request @param {CallOptions} [options] */
  getSession(request, options) {
    return this.#unary(this.#sessions, 'GetSession', request, options, plainSession);
  }

  /** Newest first. @param {{page_size?: number, page_token?: string}} request @param {CallOptions} [options] */
  listSessions(request = {}, options) {
    return this.#unary(this.#sessions, 'ListSessions', request, options, (r) => ({
      ...r,
      sessions: r.sessions.map(plainSession),
    }));
  }

  /**
   * Runs one turn: an async iterable of TurnEvent, the user prompt first (its `message_id` is the
   * rewind point), the `result` last. `event.event` names the member that is set.
   * @param {{session_id: string, text: string, request_id?: string, rewind?: object}} request
   * @param {CallOptions} [options]
   */
  prompt(request, options) {
    const body = request.rewind ? { ...request, rewind: this.#rewindFields(request.rewind) } : request;
    return this.#stream(this.#sessions, 'Prompt', body, options, plainTurnEvent);
  }

  /** @param {{session_id: string}} request @param {CallOptions} [options] */
  interrupt(request, options) {
    return this.#unary(this.#sessions, 'Interrupt', request, options, plainSession);
  }

  /** @param {{session_id: string, force?: boolean}} request @param {CallOptions} [options] */
  closeSession(request, options) {
    return this.#unary(this.#sessions, 'CloseSession', request, options, plainSession);
  }

  /**
   * @param {{session_id: string, message_id?: string, new_session_id?: string, cwd?: string, request_id?: string}} request
   * @param {CallOptions} [options]
   */
  forkSession(request, options) {
    return this.#unary(this.#sessions, 'ForkSession', request, options, plainSession);
  }

  /** @param {{session_id: string, request_id?: string, delete_workspace?: boolean}} request @param {CallOptions} [options] */
  deleteSession(request, options) {
    return this.#unary(this.#sessions, 'DeleteSession', request, options);
  }

  // RewindService

  /** @param {CallOptions} [options] */
  getCapabilities(options) {
    return this.#unary(this.#rewinds, 'GetCapabilities', {}, options);
  }

  /** Oldest first. @param {{session_id: string, page_size?: number, page_token?: string}} request @param {CallOptions} [options] */
  listRewindPoints(request, options) {
    return this.#unary(this.#rewinds, 'ListRewindPoints', request, options);
  }

  /**
   * `mode`, `conflict_policy` and `scope` take the enum's name ('REWIND_SCOPE_TURN'), its short
   * name ('turn', as the CLI's flags: 'files' | 'conversation' | 'both', 'refuse' | 'skip' |
   * 'overwrite', 'since' | 'turn') or its number; any other name is a TypeError. `paths`:
   * workspace-relative files and directories the files half is narrowed to (empty: every path).
   * `scope` 'turn' reverts only what the turn at `message_id` changed in files (mode files only).
   * @typedef {{session_id: string, message_id: string, mode?: string | number,
   *   expected_last_message_id?: string, request_id?: string, conflict_policy?: string | number,
   *   include_diff?: boolean, paths?: string[], scope?: string | number}} RewindRequest
   */

  /** Previews a rewind; refusals come inside the result. @param {RewindRequest} request @param {CallOptions} [options] */
  async dryRun(request, options) {
    return this.#unary(this.#rewinds, 'DryRun', this.#rewindFields(request), options);
  }

  /** Applies a rewind, all of it or nothing. @param {RewindRequest} request @param {CallOptions} [options] */
  async rewind(request, options) {
    return this.#unary(this.#rewinds, 'Rewind', this.#rewindFields(request), options);
  }

  /**
   * @param {{session_id: string, rewind_id: string, request_id?: string, conflict_policy?: string | number, validate_only?: boolean}} request
   * @param {CallOptions} [options]
   */
  async undoRewind(request, options) {
    return this.#unary(this.#rewinds, 'UndoRewind', this.#rewindFields(request), options);
  }

  /**
   * The feed of history changes: WatchRewindEventsResponse messages, each either an `event`
   * (a RewindEvent; its `cursor` a decimal string) or, once, `caught_up`. `after_cursor`
   * (string, number or bigint) replays the events after it first; 0: from the oldest retained;
   * absent: only new events.
   * @param {{session_id?: string, after_cursor?: string | number | bigint | null}} request
   * @param {CallOptions} [options]
   */
  watchRewindEvents(request = {}, options) {
    const { after_cursor, ...rest } = request;
    const body = after_cursor === undefined || after_cursor === null ? rest : { ...rest, after_cursor: uint64(after_cursor) };
    return this.#stream(this.#rewinds, 'WatchRewindEvents', body, options);
  }
}

/**
 * Connects to a server (lazily: the first call opens the connection).
 * @param {string} [address] host:port (default $AGENT_REWIND_SERVER, else 127.0.0.1:50051)
 * @param {ConnectOptions} [options]
 */
export function connect(address = process.env.AGENT_REWIND_SERVER || '127.0.0.1:50051', options = {}) {
  return new AgentRewindClient(address, options);
}
