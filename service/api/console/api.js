// The public v1 API, with the key prompt: a 401 asks for a key and retries once it is given.
const KEY = "envfoundry.key";

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function askKey(reason) {
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  document.getElementById("key-reason").textContent = reason;
  input.value = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      sessionStorage.setItem(KEY, input.value.trim());
      resolve();
    }, { once: true });
    dialog.showModal();
    input.focus();
  });
}

export async function api(method, path, body) {
  for (;;) {
    const headers = { Accept: "application/json" };
    const key = sessionStorage.getItem(KEY);
    if (key) headers.Authorization = `Bearer ${key}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    if (response.status === 401) {
      const problem = await response.json().catch(() => ({}));
      await askKey(problem.detail || "This server needs an API key.");
      continue;
    }
    if (response.status === 204) return null;
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body ?? {});
export const del = (path) => api("DELETE", path);
