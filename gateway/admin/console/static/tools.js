// MCP servers with their breaker, calls in flight and tools (GET /admin/mcp-servers/{name}); registering and
// removing one; and tool calls per tenant this month (GET /admin/usage by account and model, the mcp: rows).
import { act, api, listOf, query, state } from "./api.js";
import { $, el, fillRows, formatMoney, formatNumber } from "./dom.js";

export async function refreshTools() {
  const names = listOf(await api("GET", "/admin/mcp-servers")).map((s) => s.name);
  const servers = await Promise.all(names.map((name) => api("GET", `/admin/mcp-servers/${encodeURIComponent(name)}`)));
  fillRows($("#mcp-servers-table"), servers.map((s) => el("tr", { "data-server": s.name },
    el("td", {}, s.name), el("td", {}, s.url),
    el("td", { class: `breaker state-${s.breaker}` }, s.breaker), el("td", {}, formatNumber(s.in_flight)),
    el("td", { class: "tools" }, (s.tools ?? []).map((t) => t.name).join(", ")),
    el("td", {}, el("button", { class: "remove", onclick: () => removeServer(s.name) }, "Remove")))));
  const usage = listOf(await api("GET", `/admin/usage${query({ group_by: "account,model", granularity: "month" })}`));
  const accounts = new Map(state.accounts.map((a) => [a.id, a.name]));
  const calls = usage.filter((row) => String(row.model ?? "").startsWith("mcp:"));
  fillRows($("#mcp-calls-table"), calls.map((row) => el("tr", { "data-tool": row.model.slice(4) },
    el("td", {}, accounts.get(row.account) ?? row.account ?? ""), el("td", {}, row.model.slice(4)),
    el("td", {}, formatNumber(row.requests)), el("td", {}, formatMoney(row.cost)))));
}

export async function addServer(form) {
  const body = { name: form.name.value.trim(), url: form.url.value.trim() };
  if (form.api_key.value) body.api_key = form.api_key.value;
  await api("POST", "/admin/mcp-servers", body);
  form.reset();
  await refreshTools();
}

function removeServer(name) {
  act(async () => {
    await api("DELETE", `/admin/mcp-servers/${encodeURIComponent(name)}`);
    await refreshTools();
  });
}
