// The admin API client and the page's shared state; every call carries the admin key as a Bearer token.
import { showError } from "./dom.js";

export const KEY_STORAGE = "tidegate.adminKey";

export const state = {
  adminKey: sessionStorage.getItem(KEY_STORAGE),
  me: null, // {id, role, account_id} of the signed-in admin key, from GET /admin/me
  accounts: [],
  account: null,
  subAccounts: [],
  keys: [],
  prices: [], // every price ever set, oldest first, from GET /admin/prices
  liveSamples: new Map(), // entity id -> [{t, requests, tokens}] cumulative totals, for rates by difference
  liveSince: null,
  liveOpenedAt: 0,
  timer: null,
  // Hooks console.js sets, so that the parts need not import each other in a circle.
  onUnauthorized: (message) => {},
  onAccountOpened: async () => {},
  onAccountsChanged: () => {},
};

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.adminKey}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await response.json(); } catch { data = null; }
  if (!response.ok) {
    const message = data?.error?.message ?? `${response.status} ${response.statusText}`;
    throw new ApiError(response.status, message);
  }
  return data;
}

// An account admin manages one tenant: no account list to create in, no platform-wide channels.
export function isTenantAdmin() {
  return state.me?.role === "account_admin";
}

// Lists come back either bare or wrapped the OpenAI way ({"object": "list", "data": [...]}).
export function listOf(body) {
  if (Array.isArray(body)) return body;
  return body?.data ?? body?.items ?? [];
}

export function query(params) {
  const parts = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return parts.length ? "?" + new URLSearchParams(parts).toString() : "";
}

// Runs a user action; a revoked or changed admin key sends the operator back to sign in.
export async function act(action) {
  try {
    await action();
    showError("#app-error", null);
  } catch (error) {
    if (error.status === 401) state.onUnauthorized(`Admin key refused: ${error.message}`);
    else showError("#app-error", error);
  }
}
