// Calls agent-rewind with the code `npx buf generate` wrote into gen/, over gRPC (Connect's gRPC
// transport for Node.js). Messages take and give camelCase fields; a oneof is { case, value }.
import { randomUUID } from 'node:crypto';
import { createClient } from '@connectrpc/connect';
import { createGrpcTransport } from '@connectrpc/connect-node';
import { RewindMode } from './gen/agent_rewind/v1/rewind_pb.js';
import { RewindService } from './gen/agent_rewind/v1/rewind_service_pb.js';
import { SessionService } from './gen/agent_rewind/v1/session_service_pb.js';

const transport = createGrpcTransport({
  baseUrl: `http://${process.env.AGENT_REWIND_SERVER ?? '127.0.0.1:50051'}`,
});
const sessions = createClient(SessionService, transport);
const rewinds = createClient(RewindService, transport);

const { modelBackend } = await rewinds.getCapabilities({});
const { sessionId } = await sessions.createSession({ requestId: randomUUID() });
for (const text of ['write a.txt v0', 'edit a.txt v0 => v1']) {
  for await (const event of sessions.prompt({ sessionId, text, requestId: randomUUID() })) {
    if (event.event.case === 'result') console.log(`turn ${event.event.value.subtype}`);
  }
}
const { points, lastMessageId } = await rewinds.listRewindPoints({ sessionId });
const result = await rewinds.rewind({
  sessionId,
  messageId: points[1].messageId,
  mode: RewindMode.FILES,
  expectedLastMessageId: lastMessageId,
  requestId: randomUUID(),
});
console.log(JSON.stringify({ modelBackend, points: points.length, filesChanged: result.files?.filesChanged }));
