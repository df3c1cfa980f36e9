// npm's `prepare` step: copies the repo's protos into this package (./protos), so that the package
// works wherever npm puts it: installed from a path with --install-links, packed with `npm pack`,
// or run here. The repo's protos/ stays the one source; ./protos is a copy npm makes, not committed.
import { cpSync, existsSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const repo = fileURLToPath(new URL('../../../protos/', import.meta.url));
const here = fileURLToPath(new URL('../protos/', import.meta.url));
if (existsSync(repo)) {
  rmSync(here, { recursive: true, force: true });
  cpSync(repo, here, { recursive: true });
}
