// tidegate admin console: sign in, then every read and write goes through the admin API.
import { KEY_STORAGE, act, api, isTenantAdmin, listOf, state } from "./api.js";
import { refreshAudit } from "./audit.js";
import { refreshBatches } from "./batches.js";
import { addChannel, refreshChannels } from "./channels.js";
import { $, showError } from "./dom.js";
import { canSetPrices, refreshMoney, refreshUnitCost, setPrice } from "./money.js";
import { createAccount, createKey, createSubAccount, openAccount, renderAccounts } from "./tenants.js";
import { addServer, refreshTools } from "./tools.js";
import { POLL_MS, refreshLive, refreshUsage, renderUsageFilterOptions } from "./usage.js";

async function signIn(adminKey) {
  state.adminKey = adminKey;
  try {
    state.me = await api("GET", "/admin/me");
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
  showRole();
  renderAccounts();
  if (isTenantAdmin()) await act(() => openAccount(state.me.account_id));
  await act(() => Promise.all([refreshChannelsIfShown(), refreshUsage(), refreshMoney(), refreshBatches(),
    isTenantAdmin() ? null : refreshAudit()]));
  state.timer = setInterval(poll, POLL_MS);
}

// The page shows what the key's role may use; the gateway still checks every call.
function showRole() {
  const tenant = isTenantAdmin();
  $("#whoami").textContent = `${state.me.role}${tenant ? ` of ${state.accounts[0]?.name ?? state.me.account_id}` : ""}`;
  $("#create-account").hidden = tenant;
  for (const part of ["#channels", "#nav-channels", "#tools", "#nav-tools", "#audit", "#nav-audit", "#unit-cost"]) {
    $(part).hidden = tenant;
  }
  $("#set-price").hidden = !canSetPrices();
  document.body.dataset.role = state.me.role;
}

function refreshChannelsIfShown() {
  return isTenantAdmin() ? Promise.resolve() : Promise.all([refreshChannels(), refreshTools()]);
}

function signOut(message) {
  clearInterval(state.timer);
  sessionStorage.removeItem(KEY_STORAGE);
  Object.assign(state, { adminKey: null, me: null, account: null, accounts: [], keys: [], subAccounts: [], prices: [], timer: null });
  state.liveSamples.clear();
  $("#app").hidden = true;
  $("#nav").hidden = true;
  $("#signin-panel").hidden = false;
  $("#admin-key").value = "";
  showError("#signin-error", message ? new Error(message) : null);
}

async function poll() {
  await act(() => Promise.all([refreshChannelsIfShown(), refreshLive(), refreshBatches()]));
}

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
onSubmit("#audit-filter", refreshAudit);
onSubmit("#add-channel", addChannel);
onSubmit("#add-mcp-server", addServer);
onSubmit("#set-price", setPrice);
onSubmit("#unit-cost-filter", refreshUnitCost);

state.onUnauthorized = signOut;
state.onAccountOpened = () => {
  renderUsageFilterOptions(); // the heading names the account the chart now follows
  return Promise.all([refreshUsage(), refreshLive(), refreshBatches()]);
};
state.onAccountsChanged = renderUsageFilterOptions;
if (state.adminKey) signIn(state.adminKey);
