// Channel health: breaker state, in-flight, error rate per (channel, model), from GET /admin/channels.
import { api, listOf } from "./api.js";
import { $, el, fillRows, formatNumber } from "./dom.js";

function percent(value) {
  return value === undefined || value === null ? "" : `${(Number(value) * 100).toFixed(1)}%`;
}

function millis(value) {
  return value === undefined || value === null ? "" : `${Math.round(Number(value))} ms`;
}

// One row per (channel, model): breakers and error rates are kept per pair, health and in-flight per channel.
export async function refreshChannels() {
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
