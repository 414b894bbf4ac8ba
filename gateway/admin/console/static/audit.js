// The audit log: every admin change, newest first, from GET /admin/audit (owners, operators and viewers).
import { api, listOf, query } from "./api.js";
import { $, el, fillRows } from "./dom.js";

// What changed between before and after, as "field: old → new" for the top-level fields that differ.
function changes(entry) {
  const before = entry.before ?? {};
  const after = entry.after ?? {};
  if (!entry.before) return "created";
  return Object.keys(after)
    .filter((name) => JSON.stringify(before[name]) !== JSON.stringify(after[name]))
    .map((name) => `${name}: ${JSON.stringify(before[name] ?? null)} → ${JSON.stringify(after[name] ?? null)}`)
    .join("; ");
}

export async function refreshAudit(form = $("#audit-filter")) {
  const params = { actor: form.actor.value.trim(), action: form.action.value.trim(), limit: 100 };
  const entries = listOf(await api("GET", `/admin/audit${query(params)}`));
  fillRows($("#audit-table"), entries.map((e) => el("tr", { "data-action": e.action, "data-actor": e.actor },
    el("td", {}, new Date(e.time).toLocaleString()), el("td", {}, el("code", {}, e.actor)), el("td", {}, e.role),
    el("td", {}, e.action), el("td", {}, el("code", {}, e.target ?? "")), el("td", { class: "changes" }, changes(e)),
    el("td", {}, e.client ?? ""))));
}
