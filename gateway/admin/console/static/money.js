// Prices per million tokens (list, and set for owners and operators), and what a million tokens cost per model
// on own replicas beside the vendor price in force that day.
import { api, isTenantAdmin, listOf, query, state } from "./api.js";
import { $, el, fillRows, formatMoney, formatNumber } from "./dom.js";

const DAY_MS = 86400000;

// Only owners and operators may set prices; the gateway refuses the others too.
export function canSetPrices() {
  return state.me?.role === "owner" || state.me?.role === "operator";
}

export async function refreshMoney() {
  const body = await api("GET", "/admin/prices");
  state.prices = listOf(body);
  $("#money-currency").textContent = body?.currency ?? "";
  fillRows($("#prices-table"), [...state.prices].reverse().map((p) => el("tr", { "data-model": p.model },
    el("td", {}, p.model), el("td", {}, p.channel ?? "(all channels)"), el("td", { class: "input" }, formatMoney(p.input)),
    el("td", {}, formatMoney(p.cached_input)), el("td", { class: "output" }, formatMoney(p.output)),
    el("td", {}, new Date(p.effective_from).toLocaleString()))));
  // Unit costs are the platform's own running costs, not a tenant's business.
  if (!isTenantAdmin()) await refreshUnitCost();
}

export async function setPrice(form) {
  const price = { input: Number(form.input.value), output: Number(form.output.value) };
  if (form.cached_input.value !== "") price.cached_input = Number(form.cached_input.value);
  // datetime-local is the operator's local time without an offset; the API wants one.
  if (form.effective_from.value) price.effective_from = new Date(form.effective_from.value).toISOString();
  await api("PUT", `/admin/prices/${encodeURIComponent(form.model.value.trim())}`, price);
  form.reset();
  await refreshMoney();
}

export async function refreshUnitCost(form = $("#unit-cost-filter")) {
  const days = Number(form.days.value);
  const start = new Date(Math.floor(Date.now() / DAY_MS - days + 1) * DAY_MS).toISOString();
  const entries = listOf(await api("GET", `/admin/usage/unit-cost${query({ by: "model", start })}`));
  fillRows($("#unit-cost-table"), entries.map((u) => {
    const vendor = vendorPrice(u.model, Math.min(Date.now(), Date.parse(u.day) + DAY_MS));
    return el("tr", { "data-model": u.model, "data-day": u.day },
      el("td", {}, u.day), el("td", {}, u.model), el("td", {}, formatNumber(u.tokens)),
      el("td", {}, formatMoney(u.running_cost)),
      el("td", { class: "own" }, u.cost_per_million_tokens === null ? "–" : formatMoney(u.cost_per_million_tokens)),
      el("td", { class: "vendor-input" }, vendor ? formatMoney(vendor.input) : "no price"),
      el("td", { class: "vendor-output" }, vendor ? formatMoney(vendor.output) : "no price"));
  }));
}

// The model's price for every channel that was in force at `at`: the latest one started by then.
function vendorPrice(model, at) {
  return state.prices
    .filter((p) => p.model === model && p.channel === null && Date.parse(p.effective_from) <= at)
    .reduce((latest, p) => (!latest || Date.parse(p.effective_from) >= Date.parse(latest.effective_from) ? p : latest), null);
}
