// Channel health: breaker state, in-flight, error rate per (channel, model), from GET /admin/channels; adding a
// channel, and removing one (the gateway drains it first: in-flight requests finish, no new ones start).
import { act, api, listOf } from "./api.js";
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
  fillRows($("#channels-table"), channels.flatMap((c) => Object.entries(c.models ?? {}).map(([model, m], i) => {
    const health = c.draining ? "draining" : c.healthy ? "ok" : "bad";
    return el("tr", { "data-channel": c.name, "data-model": model },
      el("td", {}, c.name), el("td", {}, model),
      el("td", { class: `health state-${health}` }, health),
      el("td", { class: `breaker state-${m.breaker}` }, m.breaker),
      el("td", {}, formatNumber(c.in_flight)), el("td", {}, percent(m.error_rate)),
      el("td", {}, `${formatNumber(m.attempts)} / ${formatNumber(m.failures)}`),
      el("td", {}, millis(m.latency_ms)),
      el("td", {}, i > 0 || c.draining ? null : el("button", { class: "remove", onclick: () => removeChannel(c.name) },
        "Drain and remove")));
  })));
}

// "a, b=upstream-b" -> {a: "a", b: "upstream-b"}
function modelsMap(text) {
  const pairs = text.split(",").map((s) => s.trim()).filter(Boolean).map((s) => s.split("="));
  return Object.fromEntries(pairs.map(([name, upstream]) => [name.trim(), (upstream ?? name).trim()]));
}

export async function addChannel(form) {
  await api("POST", "/admin/channels", {
    name: form.name.value.trim(), base_url: form.base_url.value.trim(), models: modelsMap(form.models.value),
  });
  form.reset();
  await refreshChannels();
}

function removeChannel(name) {
  act(async () => {
    await api("DELETE", `/admin/channels/${encodeURIComponent(name)}`);
    await refreshChannels();
  });
}
