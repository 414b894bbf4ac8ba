// Accounts, sub-accounts and keys: list, create, revoke, and the quota dialog for every level.
import { act, api, isTenantAdmin, listOf, query, state } from "./api.js";
import { $, BUCKET_FIELDS, QUOTA_FIELDS, el, fillRows, formatQuota } from "./dom.js";

export async function refreshAccounts() {
  state.accounts = listOf(await api("GET", "/admin/accounts"));
  renderAccounts();
}

export function renderAccounts() {
  fillRows($("#accounts-table"), state.accounts.map((account) => el("tr", { "data-id": account.id },
    el("td", {}, account.name), el("td", {}, el("code", {}, account.id)), el("td", {}, formatQuota(account.quota)),
    el("td", {},
      el("button", { type: "button", class: "open-account", onclick: () => act(() => openAccount(account.id)) }, "Open"),
      // an account admin may not change its own account's limits
      isTenantAdmin() ? null
        : el("button", { type: "button", class: "edit-quota", onclick: () => editQuota("accounts", account) }, "Quota")),
  )));
  state.onAccountsChanged();
}

export async function openAccount(accountId) {
  state.account = state.accounts.find((a) => a.id === accountId) ?? null;
  if (!state.account) return;
  state.liveSamples.clear();
  // Live rates difference cumulative totals from a fixed start: the top of the hour the account was opened.
  state.liveOpenedAt = Date.now();
  state.liveSince = new Date(Math.floor(state.liveOpenedAt / 3600000) * 3600000).toISOString();
  $("#account-detail").hidden = false;
  $("#account-name").textContent = state.account.name;
  await refreshAccountDetail();
  await state.onAccountOpened();
}

export async function refreshAccountDetail() {
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

export function keyState(key) {
  if (key.revoked || key.revoked_at || key.status === "revoked") return "revoked";
  if (key.expires_at && Date.parse(key.expires_at) < Date.now()) return "expired";
  return key.status ?? "active";
}

export function subAccountName(id) {
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

export async function createAccount(form) {
  await api("POST", "/admin/accounts", { name: form.name.value.trim() });
  form.reset();
  await refreshAccounts();
}

export async function createSubAccount(form) {
  const id = state.account.id;
  await api("POST", `/admin/accounts/${encodeURIComponent(id)}/sub-accounts`, { name: form.name.value.trim() });
  form.reset();
  await refreshAccountDetail();
}

export async function createKey(form) {
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
  for (const field of BUCKET_FIELDS) {
    form[`${field}_rate`].value = entity.quota?.[field]?.rate ?? "";
    form[`${field}_burst`].value = entity.quota?.[field]?.burst ?? "";
  }
  dialog.onclose = () => {
    if (dialog.returnValue !== "save") return;
    const quota = {};
    for (const field of QUOTA_FIELDS) {
      if (form[field].value !== "") quota[field] = Number(form[field].value);
    }
    for (const field of BUCKET_FIELDS) {
      const rate = form[`${field}_rate`].value, burst = form[`${field}_burst`].value;
      if (rate !== "" || burst !== "") quota[field] = { rate: Number(rate), burst: Number(burst) };
    }
    act(async () => {
      await api("PATCH", `/admin/${kind}/${encodeURIComponent(entity.id)}`, { quota });
      await refreshAccounts();
      if (state.account) await refreshAccountDetail();
    });
  };
  dialog.showModal();
}
