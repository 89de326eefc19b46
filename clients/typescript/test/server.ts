/** A real envfoundry server for the tests: `envfoundry serve` from the repository's .venv on a free port. */
import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";

/** The repository root, seen from dist/test/. */
export const ROOT = fileURLToPath(new URL("../../../../", import.meta.url));

export interface Running {
  url: string;
  stop(): Promise<void>;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      probe.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

/** ENVFOUNDRY_TEST_URL points the tests at a server already running; otherwise one is started. */
export async function startServer(extraEnv: Record<string, string> = {}): Promise<Running> {
  if (process.env.ENVFOUNDRY_TEST_URL && !Object.keys(extraEnv).length) {
    return { url: process.env.ENVFOUNDRY_TEST_URL, stop: async () => {} };
  }
  const port = await freePort();
  const env = {
    ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("ENVFOUNDRY_") && k !== "REDIS_URL")),
    ...extraEnv,
  };
  const binary = process.env.ENVFOUNDRY_BIN ?? `${ROOT}.venv/bin/envfoundry`;
  const child: ChildProcess = spawn(binary, ["serve", "--port", String(port), "--workers", "2"], {
    cwd: ROOT, env, stdio: ["ignore", "ignore", "pipe"],
  });
  let log = "";
  child.stderr?.on("data", (chunk: Buffer) => (log = (log + chunk.toString()).slice(-4000)));
  const url = `http://127.0.0.1:${port}`;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`envfoundry serve exited early:\n${log}`);
    try {
      if ((await fetch(`${url}/healthz`)).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`envfoundry serve did not become ready:\n${log}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return {
    url,
    async stop() {
      if (child.exitCode === null) child.kill("SIGTERM");
      await exited;
    },
  };
}
