// Shared by the tests (no tests of its own). They run against real servers named by the
// environment (tests/integration/test_node_client.py starts them):
//   AGENT_REWIND_SERVER                  an open server (default 127.0.0.1:50051, as `make run`)
//   AGENT_REWIND_AUTH_SERVER             one with an access file; AGENT_REWIND_AUTH_TOKEN is a token
//                                        with every permission, AGENT_REWIND_READER_TOKEN one with
//                                        sessions.read only
//   AGENT_REWIND_SHORT_RETENTION_SERVER  one started with --event-retention-count 1
//                                        --event-retention 10, so cursors expire
// Tests of a server that is not named are skipped.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export const SERVER = process.env.AGENT_REWIND_SERVER || '127.0.0.1:50051';
export const AUTH_SERVER = process.env.AGENT_REWIND_AUTH_SERVER ?? '';
export const AUTH_TOKEN = process.env.AGENT_REWIND_AUTH_TOKEN ?? '';
export const READER_TOKEN = process.env.AGENT_REWIND_READER_TOKEN ?? '';
export const SHORT_RETENTION_SERVER = process.env.AGENT_REWIND_SHORT_RETENTION_SERVER ?? '';
export const PACKAGE_DIR = fileURLToPath(new URL('..', import.meta.url));

/** Runs one turn to its end: its rewind point and every event. */
export async function turn(client, session_id, text) {
  const events = [];
  for await (const event of client.prompt({ session_id, text })) events.push(event);
  const point = events.find((e) => e.event === 'user_prompt')?.message_id ?? '';
  return { point, events };
}

/** A session with two turns: a.txt written (v0), then edited (v1) and b.txt written. */
export async function twoTurns(client) {
  const session = await client.createSession({});
  const first = await turn(client, session.session_id, 'write a.txt v0');
  const second = await turn(client, session.session_id, 'edit a.txt v0 => v1\nwrite b.txt bee');
  return { session, points: [first.point, second.point] };
}

/** The promise's rejection (it must reject). */
export async function rejection(promise) {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  throw new Error('expected the call to fail');
}

/** Iterates a stream to its end or its first failure; the failure. */
export async function streamFailure(stream) {
  return rejection((async () => {
    for await (const _ of stream);
  })());
}

/**
 * One of the examples as a child process, its stdout read line by line.
 * `next(pattern)` resolves with the match of the next line that matches (skipping others).
 */
export function example(name, args, env) {
  const child = spawn(process.execPath, [`examples/${name}`, ...args], {
    cwd: PACKAGE_DIR,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const output = []; // every line, stderr too, for failure messages
  const lines = [];
  let read = 0; // lines[read...] are not consumed yet
  let wake = () => {};
  const exited = once(child, 'exit');
  child.stderr.on('data', (chunk) => output.push(`stderr: ${chunk}`));
  createInterface({ input: child.stdout }).on('line', (line) => {
    output.push(line);
    lines.push(line);
    wake();
  });
  exited.then(() => wake());
  return {
    child,
    output,
    async next(pattern, timeoutMs = 15_000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        while (read < lines.length) {
          const m = lines[read++].match(pattern);
          if (m) return m;
        }
        if (child.exitCode !== null || child.signalCode !== null || Date.now() > deadline) {
          throw new Error(`no line matching ${pattern} from ${name}:\n${output.join('\n')}`);
        }
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, Math.max(0, deadline - Date.now()) + 1);
          wake = () => {
            clearTimeout(timer);
            resolve(undefined);
          };
        });
      }
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill();
      await exited;
    },
  };
}
