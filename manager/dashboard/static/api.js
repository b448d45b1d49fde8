// Talking to the manager's /api: JSON in and out, a timeout on every call, the bearer token.
//
// Every failure becomes an ApiError whose message is what the user should read: the API's
// own {"detail": "..."} when there is one, else what went wrong on the way.

const TOKEN_KEY = "orch.dashboard.token";
// The manager shares two cores with the broker, the database and the services: an answer can
// take a while under load, but a poll must not hang forever behind a dead connection.
const TIMEOUT_MS = 8000;

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status; // 0 when no HTTP answer came back at all
  }

  /** 401 (no or bad token) or 403 (read-only token for a change): the user must give a token. */
  get needsToken() {
    return this.status === 401 || this.status === 403;
  }
}

export function getToken() {
  try {
    return localStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return ""; // storage disabled: the page still works against an open API
  }
}

export function setToken(token) {
  try {
    if (token) localStorage.setItem(TOKEN_KEY, token);
    else localStorage.removeItem(TOKEN_KEY);
  } catch {
    // Nothing to do: without storage the token just lasts until the page reloads.
  }
  memoryToken = token;
}

let memoryToken = getToken();

/** Query string from an object, leaving out empty values (the API treats them as unset). */
export function query(params) {
  const qs = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") qs.set(key, String(value));
  }
  const text = qs.toString();
  return text ? `?${text}` : "";
}

async function detailOf(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === "string") return body.detail;
    return JSON.stringify(body.detail ?? body);
  } catch {
    return response.statusText || "no details";
  }
}

/** One API call; resolves to the parsed JSON body, rejects with an ApiError. */
export async function api(method, path, body) {
  const controller = new AbortController();
  // The timer covers the body too: a stalled answer would otherwise block the next poll.
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (memoryToken) headers.Authorization = `Bearer ${memoryToken}`;
  try {
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: controller.signal,
      cache: "no-store",
    });
    if (!response.ok) {
      throw new ApiError(`${method} ${path}: ${response.status} ${await detailOf(response)}`, response.status);
    }
    return response.status === 204 ? null : await response.json();
  } catch (err) {
    if (err instanceof ApiError) throw err;
    const why = err.name === "AbortError" ? `no answer within ${TIMEOUT_MS / 1000} s` : err.message;
    throw new ApiError(`${method} ${path}: cannot reach the manager (${why})`, 0);
  } finally {
    clearTimeout(timer);
  }
}
