// tidegate admin console: every read and write goes through the admin API with the admin key as Bearer.
"use strict";

const KEY_STORAGE = "tidegate.adminKey";
const POLL_MS = 5000;
const LIVE_WINDOW_MS = 60000;
const COLORS = ["#1f6feb", "#e8590c", "#2f9e44", "#ae3ec9", "#f08c00", "#0c8599", "#c2255c", "#5c940d"];
const QUOTA_FIELDS = ["rpm", "tpm", "max_concurrency", "tokens_per_day", "tokens_per_month"];

const state = {
  adminKey: sessionStorage.getItem(KEY_STORAGE),
  accounts: [],
  account: null,
  subAccounts: [],
  keys: [],
  liveSamples: new Map(), // entity id -> [{t, requests, tokens}] cumulative totals, for rates by difference
  liveSince: null,
  liveOpenedAt: 0,
  timer: null,
};

const $ = (selector) => document.querySelector(selector);

// ---- admin API ----------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(method, path, body) {
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

// Lists come back either bare or wrapped the OpenAI way ({"object": "list", "data": [...]}).
function listOf(body) {
  if (Array.isArray(body)) return body;
  return body?.data ?? body?.items ?? [];
}

function query(params) {
  const parts = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return parts.length ? "?" + new URLSearchParams(parts).toString() : "";
}

// ---- DOM -----------------------------------------------------------------------------------------------------

// Builds elements without innerHTML, so tenant-chosen names can never inject markup.
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  for (const child of children.flat()) node.append(child instanceof Node ? child : document.createTextNode(child));
  return node;
}

function fillRows(table, rows) {
  table.querySelector("tbody").replaceChildren(...rows);
}

function showError(where, error) {
  const box = $(where);
  box.textContent = error ? String(error.message ?? error) : "";
  box.hidden = !error;
}

function formatQuota(quota) {
  const set = QUOTA_FIELDS.filter((f) => quota?.[f] !== undefined && quota?.[f] !== null);
  return set.length ? set.map((f) => `${f} ${quota[f]}`).join(" · ") : "unlimited";
}

function formatNumber(value) {
  return Number(value ?? 0).toLocaleString("en-US");
}

// ---- sign in and out -----------------------------------------------------------------------------------------

async function signIn(adminKey) {
  state.adminKey = adminKey;
  try {
    state.accounts = listOf(await api("GET", "/admin/accounts"));
  } catch (error) {
    state.adminKey = null;
    sessionStorage.removeItem(KEY_STORAGE);
    const refused = error.status === 401 || error.status === 403;
    showError("#signin-error", refused ? new Error(`Admin key refused: ${error.message}`) : error);
    return;
  }
  sessionStorage.setItem(KEY_STORAGE, adminKey);
  showError("#signin-error", null);
  $("#signin-panel").hidden = true;
  $("#app").hidden = false;
  $("#nav").hidden = false;
  renderAccounts();
  await Promise.all([refreshChannels(), refreshUsage()]);
  state.timer = setInterval(poll, POLL_MS);
}

function signOut(message) {
  clearInterval(state.timer);
  sessionStorage.removeItem(KEY_STORAGE);
  Object.assign(state, { adminKey: null, account: null, accounts: [], keys: [], subAccounts: [], timer: null });
  state.liveSamples.clear();
  $("#app").hidden = true;
  $("#nav").hidden = true;
  $("#signin-panel").hidden = false;
  $("#admin-key").value = "";
  showError("#signin-error", message ? new Error(message) : null);
}

// Runs a user action; a revoked or changed admin key sends the operator back to sign in.
async function act(action) {
  try {
    await action();
    showError("#app-error", null);
  } catch (error) {
    if (error.status === 401) signOut(`Admin key refused: ${error.message}`);
    else showError("#app-error", error);
  }
}

// ---- accounts, sub-accounts, keys ----------------------------------------------------------------------------

async function refreshAccounts() {
  state.accounts = listOf(await api("GET", "/admin/accounts"));
  renderAccounts();
}

function renderAccounts() {
  fillRows($("#accounts-table"), state.accounts.map((account) => el("tr", { "data-id": account.id },
    el("td", {}, account.name), el("td", {}, el("code", {}, account.id)), el("td", {}, formatQuota(account.quota)),
    el("td", {},
      el("button", { type: "button", class: "open-account", onclick: () => act(() => openAccount(account.id)) }, "Open"),
      el("button", { type: "button", class: "edit-quota", onclick: () => editQuota("accounts", account) }, "Quota")),
  )));
  renderUsageFilterOptions();
}

async function openAccount(accountId) {
  state.account = state.accounts.find((a) => a.id === accountId) ?? null;
  if (!state.account) return;
  state.liveSamples.clear();
  // Live rates difference cumulative totals from a fixed start: the top of the hour the account was opened.
  state.liveOpenedAt = Date.now();
  state.liveSince = new Date(Math.floor(state.liveOpenedAt / 3600000) * 3600000).toISOString();
  $("#account-detail").hidden = false;
  $("#account-name").textContent = state.account.name;
  await refreshAccountDetail();
  await Promise.all([refreshUsage(), refreshLive()]);
}

async function refreshAccountDetail() {
  const id = state.account.id;
  const [subs, keys] = await Promise.all([
    api("GET", `/admin/accounts/${encodeURIComponent(id)}/sub-accounts`),
    api("GET", `/admin/keys${query({ account_id: id })}`),
  ]);
  state.subAccounts = listOf(subs);
  state.keys = listOf(keys);
  renderSubAccounts();
  renderKeys();
}

function renderSubAccounts() {
  fillRows($("#sub-accounts-table"), state.subAccounts.map((sub) => el("tr", { "data-id": sub.id },
    el("td", {}, sub.name), el("td", {}, el("code", {}, sub.id)), el("td", {}, formatQuota(sub.quota)),
    el("td", {}, el("button", { type: "button", class: "edit-quota", onclick: () => editQuota("sub-accounts", sub) }, "Quota")),
  )));
  const select = $("#create-key select[name=sub_account_id]");
  select.replaceChildren(el("option", { value: "" }, "(account level)"),
    ...state.subAccounts.map((sub) => el("option", { value: sub.id }, sub.name)));
}

function keyState(key) {
  if (key.revoked || key.revoked_at || key.status === "revoked") return "revoked";
  if (key.expires_at && Date.parse(key.expires_at) < Date.now()) return "expired";
  return key.status ?? "active";
}

function subAccountName(id) {
  return state.subAccounts.find((s) => s.id === id)?.name ?? "";
}

function renderKeys() {
  fillRows($("#keys-table"), state.keys.map((key) => {
    const status = keyState(key);
    const revoke = el("button", { type: "button", class: "danger revoke" }, "Revoke");
    // Two clicks, so that a stray click cannot cut a tenant off.
    revoke.addEventListener("click", () => {
      if (revoke.dataset.armed) act(() => revokeKey(key.id));
      else { revoke.dataset.armed = "1"; revoke.textContent = "Confirm revoke"; }
    });
    return el("tr", { "data-id": key.id, "data-name": key.name ?? "" },
      el("td", {}, key.name ?? ""), el("td", {}, el("code", {}, key.id)), el("td", {}, subAccountName(key.sub_account_id)),
      el("td", {}, key.models?.length ? key.models.join(", ") : "all"), el("td", {}, formatQuota(key.quota)),
      el("td", { class: `state state-${status}` }, status),
      el("td", {},
        el("button", { type: "button", class: "edit-quota", onclick: () => editQuota("keys", key) }, "Quota"),
        status === "revoked" ? null : revoke));
  }));
}

async function revokeKey(keyId) {
  await api("DELETE", `/admin/keys/${encodeURIComponent(keyId)}`);
  await refreshAccountDetail();
}

async function createAccount(form) {
  await api("POST", "/admin/accounts", { name: form.name.value.trim() });
  form.reset();
  await refreshAccounts();
}

async function createSubAccount(form) {
  const id = state.account.id;
  await api("POST", `/admin/accounts/${encodeURIComponent(id)}/sub-accounts`, { name: form.name.value.trim() });
  form.reset();
  await refreshAccountDetail();
}

async function createKey(form) {
  const body = form.sub_account_id.value
    ? { sub_account_id: form.sub_account_id.value }
    : { account_id: state.account.id };
  if (form.name.value.trim()) body.name = form.name.value.trim();
  const models = form.models.value.split(",").map((m) => m.trim()).filter(Boolean);
  if (models.length) body.models = models;
  if (form.priority_class.value.trim()) body.priority_class = form.priority_class.value.trim();
  const created = await api("POST", "/admin/keys", body);
  form.reset();
  $("#new-secret-value").textContent = created.key;
  $("#new-secret").hidden = false;
  await refreshAccountDetail();
}

// One dialog edits the quota of any level; empty fields mean unlimited.
function editQuota(kind, entity) {
  const dialog = $("#quota-dialog");
  const form = $("#quota-form");
  $("#quota-target").textContent = entity.name ?? entity.id;
  for (const field of QUOTA_FIELDS) form[field].value = entity.quota?.[field] ?? "";
  dialog.onclose = () => {
    if (dialog.returnValue !== "save") return;
    const quota = {};
    for (const field of QUOTA_FIELDS) {
      if (form[field].value !== "") quota[field] = Number(form[field].value);
    }
    act(async () => {
      await api("PATCH", `/admin/${kind}/${encodeURIComponent(entity.id)}`, { quota });
      await refreshAccounts();
      if (state.account) await refreshAccountDetail();
    });
  };
  dialog.showModal();
}

// ---- usage over time -----------------------------------------------------------------------------------------

const HOUR_MS = 3600000;
const DAY_MS = 86400000;

// The ledger keeps one row per period (hour or day), key and model; the wrapper may be a list or an object.
function usageRows(body) {
  const rows = Array.isArray(body) ? body : body?.rows ?? body?.data ?? [];
  return rows.map((row) => ({
    ...row,
    t: Date.parse(row.period_start),
    requests: Number(row.requests ?? 0),
    prompt_tokens: Number(row.prompt_tokens ?? 0),
    completion_tokens: Number(row.completion_tokens ?? 0),
    total_tokens: Number(row.prompt_tokens ?? 0) + Number(row.completion_tokens ?? 0),
  }));
}

async function fetchUsage(params) {
  return usageRows(await api("GET", `/admin/usage${query(params)}`));
}

function seriesName(row, group) {
  if (group === "model") return row.model;
  if (group === "key") return state.keys.find((k) => k.id === row.key_id)?.name || row.key_id;
  if (!row.sub_account_id) return "(account level)";
  return subAccountName(row.sub_account_id) || row.sub_account_id;
}

function renderUsageFilterOptions() {
  // The chart follows the opened account; without one it covers all accounts.
  $("#usage h2").textContent = state.account ? `Usage of ${state.account.name}` : "Usage (all accounts)";
}

async function refreshUsage() {
  const form = $("#usage-filter");
  const rangeMs = Number(form.range.value) * 1000;
  const group = form.group.value;
  const measure = form.measure.value;
  const step = rangeMs > DAY_MS ? DAY_MS : HOUR_MS;
  const end = Date.now();
  const first = Math.floor((end - rangeMs) / step) * step;
  const times = [];
  for (let t = first; t <= end; t += step) times.push(t);
  const rows = await fetchUsage({
    account_id: state.account?.id, granularity: step === DAY_MS ? "day" : "hour",
    start: new Date(first).toISOString(), end: new Date(end).toISOString(),
  });
  const series = new Map();
  const totals = new Map();
  for (const row of rows) {
    const name = seriesName(row, group);
    if (!series.has(name)) series.set(name, new Array(times.length).fill(0));
    const bucket = Math.min(times.length - 1, Math.max(0, Math.floor((row.t - first) / step)));
    series.get(name)[bucket] += row[measure];
    const total = totals.get(name) ?? { requests: 0, prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
    for (const field of Object.keys(total)) total[field] += row[field];
    totals.set(name, total);
  }
  $("#usage-chart").replaceChildren(lineChart(times, series));
  fillRows($("#usage-table"), [...totals].map(([name, t]) => el("tr", { "data-series": name },
    el("td", {}, name), el("td", {}, formatNumber(t.requests)), el("td", {}, formatNumber(t.prompt_tokens)),
    el("td", {}, formatNumber(t.completion_tokens)), el("td", {}, formatNumber(t.total_tokens)))));
}

// An inline SVG line chart: one polyline per series over shared time buckets.
function lineChart(times, series) {
  const width = 800, height = 220, left = 50, bottom = 24, top = 10;
  const max = Math.max(1, ...[...series.values()].flat());
  const x = (i) => left + (i / Math.max(1, times.length - 1)) * (width - left - 10);
  const y = (v) => top + (1 - v / max) * (height - top - bottom);
  const label = (ms) => new Date(ms).toLocaleString("en-GB", { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "usage over time" },
    svg("line", { class: "axis", x1: left, y1: y(0), x2: width - 10, y2: y(0) }),
    svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: y(0) }),
    svg("text", { x: left - 6, y: top + 8, "text-anchor": "end" }, formatNumber(max)),
    svg("text", { x: left - 6, y: y(0), "text-anchor": "end" }, "0"),
    svg("text", { x: left, y: height - 6 }, label(times[0])),
    svg("text", { x: width - 10, y: height - 6, "text-anchor": "end" }, label(times[times.length - 1])),
    [...series].map(([name, values], n) => svg("polyline", {
      class: "series", "data-series": name, fill: "none", stroke: COLORS[n % COLORS.length], "stroke-width": 2,
      points: values.map((v, i) => `${x(i)},${y(v)}`).join(" "),
    })));
  const legend = el("div", { class: "legend" }, [...series.keys()].map((name, n) =>
    el("span", { style: `--swatch: ${COLORS[n % COLORS.length]}` }, name)));
  return el("div", {}, series.size ? chart : el("p", {}, "No usage in this range."), legend);
}

// ---- live RPM and TPM against quotas -------------------------------------------------------------------------

// RPM and TPM are what the ledger counted over the trailing minute: the difference between the cumulative
// totals now and at the newest poll at least 60 s old (or the first poll, in the first minute). No
// extrapolation: 3 requests in the first 5 s read as 3, not 36.
function liveRate(id, createdAt, totals) {
  const now = Date.now();
  let samples = state.liveSamples.get(id);
  if (!samples) {
    // Something created after the account was opened had no usage before it existed.
    const born = Date.parse(createdAt);
    samples = born > state.liveOpenedAt ? [{ t: born, requests: 0, tokens: 0 }] : [];
  }
  while (samples.length > 1 && now - samples[1].t >= LIVE_WINDOW_MS) samples.shift();
  samples.push({ t: now, ...totals });
  state.liveSamples.set(id, samples);
  const first = samples[0];
  return { rpm: totals.requests - first.requests, tpm: totals.tokens - first.tokens };
}

function meter(value, limit) {
  const width = 120;
  const share = limit ? Math.min(1, value / limit) : 0;
  const color = share >= 0.9 ? "#c62828" : share >= 0.7 ? "#b26a00" : "#2e7d32";
  return el("div", { class: "meter" },
    svg("svg", { width, height: 10 },
      svg("rect", { width, height: 10, fill: "#e9ecf2" }),
      svg("rect", { width: width * share, height: 10, fill: color })),
    el("span", {}, limit ? `${formatNumber(value)} / ${formatNumber(limit)}` : `${formatNumber(value)} (unlimited)`));
}

async function refreshLive() {
  if (!state.account) return;
  // One query for the whole account since it was opened; each level's totals are sums over its rows.
  const rows = await fetchUsage({ account_id: state.account.id, granularity: "hour", start: state.liveSince });
  const sum = (match) => rows.filter(match).reduce(
    (acc, r) => ({ requests: acc.requests + r.requests, tokens: acc.tokens + r.total_tokens }), { requests: 0, tokens: 0 });
  const levels = [
    ["account", state.account, () => true],
    ...state.subAccounts.map((s) => ["sub-account", s, (r) => r.sub_account_id === s.id]),
    ...state.keys.filter((k) => keyState(k) === "active").map((k) => ["key", k, (r) => r.key_id === k.id]),
  ];
  fillRows($("#live-table"), levels.map(([level, entity, match]) => {
    const rate = liveRate(`${level}:${entity.id}`, entity.created_at, sum(match));
    return el("tr", { "data-id": entity.id },
      el("td", {}, level), el("td", {}, entity.name || entity.id),
      el("td", { class: "rpm" }, meter(rate.rpm, entity.quota?.rpm)),
      el("td", { class: "tpm" }, meter(rate.tpm, entity.quota?.tpm)));
  }));
}

// ---- channel health ------------------------------------------------------------------------------------------

function percent(value) {
  return value === undefined || value === null ? "" : `${(Number(value) * 100).toFixed(1)}%`;
}

function millis(value) {
  return value === undefined || value === null ? "" : `${Math.round(Number(value))} ms`;
}

// One row per (channel, model): breakers and error rates are kept per pair, health and in-flight per channel.
async function refreshChannels() {
  const channels = listOf(await api("GET", "/admin/channels"));
  fillRows($("#channels-table"), channels.flatMap((c) => Object.entries(c.models ?? {}).map(([model, m]) => {
    const health = c.healthy ? "ok" : "bad";
    return el("tr", { "data-channel": c.name, "data-model": model },
      el("td", {}, c.name), el("td", {}, model),
      el("td", { class: `health state-${health}` }, health),
      el("td", { class: `breaker state-${m.breaker}` }, m.breaker),
      el("td", {}, formatNumber(c.in_flight)), el("td", {}, percent(m.error_rate)),
      el("td", {}, `${formatNumber(m.attempts)} / ${formatNumber(m.failures)}`),
      el("td", {}, millis(m.latency_ms)));
  })));
}

async function poll() {
  await act(() => Promise.all([refreshChannels(), refreshLive()]));
}

// ---- wiring --------------------------------------------------------------------------------------------------

function onSubmit(selector, handler) {
  $(selector).addEventListener("submit", (event) => {
    event.preventDefault();
    act(() => handler(event.target));
  });
}

$("#signin").addEventListener("submit", (event) => {
  event.preventDefault();
  signIn($("#admin-key").value.trim());
});
$("#sign-out").addEventListener("click", () => signOut(null));
$("#dismiss-secret").addEventListener("click", () => {
  $("#new-secret-value").textContent = "";
  $("#new-secret").hidden = true;
});
onSubmit("#create-account", createAccount);
onSubmit("#create-sub-account", createSubAccount);
onSubmit("#create-key", createKey);
onSubmit("#usage-filter", refreshUsage);

if (state.adminKey) signIn(state.adminKey);
