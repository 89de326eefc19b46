/** src/schema.d.ts is what openapi-typescript makes of openapi/openapi.json today. */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { ROOT } from "./server.js";

test("the committed types match the OpenAPI document", () => {
  const here = `${ROOT}clients/typescript/`;
  const folder = mkdtempSync(join(tmpdir(), "envfoundry-schema-"));
  try {
    const fresh = join(folder, "schema.d.ts");
    // The arguments of `npm run generate`, writing elsewhere: one definition of how the file is made.
    const script: string = JSON.parse(readFileSync(`${here}package.json`, "utf8")).scripts.generate;
    const [command, ...args] = script.split(/\s+/);
    args[args.indexOf("--output") + 1] = fresh;
    execFileSync(`${here}node_modules/.bin/${command}`, args, { cwd: here, stdio: "pipe" });
    assert.equal(readFileSync(`${here}src/schema.d.ts`, "utf8"), readFileSync(fresh, "utf8"),
                 "src/schema.d.ts is stale: run `npm run generate` in clients/typescript and commit it");
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
});
