// Batches: each batch's owner, state and line counts from GET /admin/batches; an account admin sees its own.
import { api, listOf, query, state } from "./api.js";
import { $, el, fillRows, formatNumber } from "./dom.js";

// The account shown: the one opened in Tenants, else (for the platform's roles) every batch still running.
export async function refreshBatches() {
  const accountId = state.account?.id ?? null;
  const batches = listOf(await api("GET", `/admin/batches${query({ account_id: accountId })}`));
  $("#batches-scope").textContent = accountId ? `of ${state.account.name}` : "running now, every account";
  fillRows($("#batches-table"), batches.map((b) => {
    const counts = b.request_counts ?? {};
    const done = (counts.completed ?? 0) + (counts.failed ?? 0);
    return el("tr", { "data-status": b.status },
      el("td", {}, el("code", {}, b.id)), el("td", {}, el("code", {}, b.account_id)), el("td", {}, b.endpoint),
      el("td", {}, b.status), el("td", {}, `${formatNumber(done)} / ${formatNumber(counts.total)}`),
      el("td", {}, formatNumber(counts.failed)), el("td", {}, formatNumber(b.running ?? 0)),
      el("td", {}, new Date(b.created_at * 1000).toLocaleString()));
  }));
}
