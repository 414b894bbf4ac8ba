// tidegate admin console: sign in, then every read and write goes through the admin API.
import { KEY_STORAGE, act, api, listOf, state } from "./api.js";
import { addChannel, refreshChannels } from "./channels.js";
import { $, showError } from "./dom.js";
import { createAccount, createKey, createSubAccount, renderAccounts } from "./tenants.js";
import { POLL_MS, refreshLive, refreshUsage, renderUsageFilterOptions } from "./usage.js";

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
  await act(() => Promise.all([refreshChannels(), refreshUsage()]));
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

async function poll() {
  await act(() => Promise.all([refreshChannels(), refreshLive()]));
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
onSubmit("#add-channel", addChannel);

state.onUnauthorized = signOut;
state.onAccountOpened = () => Promise.all([refreshUsage(), refreshLive()]);
state.onAccountsChanged = renderUsageFilterOptions;
if (state.adminKey) signIn(state.adminKey);
