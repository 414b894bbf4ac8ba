// Usage over time as an inline SVG chart, and live RPM and TPM against each level's quota.
import { api, query, state } from "./api.js";
import { $, el, fillRows, formatMoney, formatNumber, svg } from "./dom.js";
import { keyState, subAccountName } from "./tenants.js";

const COLORS = ["#1f6feb", "#e8590c", "#2f9e44", "#ae3ec9", "#f08c00", "#0c8599", "#c2255c", "#5c940d"];
export const POLL_MS = 5000;
const LIVE_WINDOW_MS = 60000;
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
    cost: Number(row.cost ?? 0),
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

export function renderUsageFilterOptions() {
  // The chart follows the opened account; without one it covers all accounts.
  $("#usage h2").textContent = state.account ? `Usage of ${state.account.name}` : "Usage (all accounts)";
}

export async function refreshUsage() {
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
  const overall = emptyTotals();
  for (const row of rows) {
    const name = seriesName(row, group);
    if (!series.has(name)) series.set(name, new Array(times.length).fill(0));
    const bucket = Math.min(times.length - 1, Math.max(0, Math.floor((row.t - first) / step)));
    series.get(name)[bucket] += row[measure];
    if (!totals.has(name)) totals.set(name, emptyTotals());
    for (const total of [totals.get(name), overall]) {
      for (const field of Object.keys(total)) total[field] += row[field];
    }
  }
  $("#usage-chart").replaceChildren(lineChart(times, series, measure === "cost" ? formatMoney : formatNumber));
  fillRows($("#usage-table"), [...totals].map(([name, t]) => totalsRow(name, t, { "data-series": name })));
  $("#usage-table tfoot").replaceChildren(totalsRow("Total", overall, { id: "usage-total" }));
}

function emptyTotals() {
  return { requests: 0, prompt_tokens: 0, completion_tokens: 0, total_tokens: 0, cost: 0 };
}

function totalsRow(name, t, attrs) {
  return el("tr", attrs,
    el("td", {}, name), el("td", {}, formatNumber(t.requests)), el("td", {}, formatNumber(t.prompt_tokens)),
    el("td", {}, formatNumber(t.completion_tokens)), el("td", {}, formatNumber(t.total_tokens)),
    el("td", { class: "cost" }, formatMoney(t.cost)));
}

// An inline SVG line chart: one polyline per series over shared time buckets.
function lineChart(times, series, format) {
  const width = 800, height = 220, left = 64, bottom = 24, top = 10;  // room for 6-decimal spend labels
  const max = Math.max(0, ...[...series.values()].flat()) || 1;  // spend is often below 1
  const x = (i) => left + (i / Math.max(1, times.length - 1)) * (width - left - 10);
  const y = (v) => top + (1 - v / max) * (height - top - bottom);
  const label = (ms) => new Date(ms).toLocaleString("en-GB", { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "usage over time" },
    svg("line", { class: "axis", x1: left, y1: y(0), x2: width - 10, y2: y(0) }),
    svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: y(0) }),
    svg("text", { x: left - 6, y: top + 8, "text-anchor": "end" }, format(max)),
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

export async function refreshLive() {
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
