/** The README's example compiles against the client and runs against a live server. */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { after, before, test } from "node:test";

import { ROOT, startServer, type Running } from "./server.js";

const HERE = `${ROOT}clients/typescript/`;
let server: Running;
before(async () => {
  server = await startServer();
});
after(async () => server.stop());

test("the README example compiles and runs", async () => {
  const readme = readFileSync(`${HERE}README.md`, "utf8");
  const example = /```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  assert.ok(example, "README.md has a ts example");
  const folder = `${HERE}dist/readme/`;
  rmSync(folder, { recursive: true, force: true });
  mkdirSync(folder, { recursive: true });
  const source = example
    .replace('from "envfoundry-client"', 'from "../src/index.js"')
    .replace("http://127.0.0.1:8000", server.url);
  // Inside dist/, next to the compiled client: "../src/index.js" resolves to dist/src.
  writeFileSync(`${folder}example.ts`, `export {};\n${source}`);
  try {
    execFileSync(`${HERE}node_modules/.bin/tsc`, [
      "--module", "NodeNext", "--moduleResolution", "NodeNext", "--target", "ES2022", "--strict", "--skipLibCheck",
      "--types", "node", `${folder}example.ts`,
    ], { cwd: HERE, encoding: "utf8" });
  } catch (error) {
    assert.fail(`the README example does not compile:\n${(error as { stdout?: string }).stdout ?? String(error)}`);
  }
  const printed = execFileSync(process.execPath, [`${folder}example.js`], { encoding: "utf8", timeout: 60_000 });
  assert.match(printed, /^refused: true {"success":false,"error":"Loan 'L9999' not found"}$/m);
  assert.match(printed, /^unknown: false unknown_tool$/m);
  assert.match(printed, /404 urn:envfoundry:problem:not-found/);
  assert.match(printed, /^reward: 1$/m);
  const left = (await (await fetch(`${server.url}/v1/sessions`)).json()) as { total: number };
  assert.equal(left.total, 0, "the example deletes every session it made");
});
