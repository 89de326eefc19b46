export * from "./client.js";
export * from "./problem.js";
export type { components, paths } from "./schema.js";
