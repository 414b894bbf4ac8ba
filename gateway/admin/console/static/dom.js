// DOM building and formatting shared by every part of the page.

export const QUOTA_FIELDS = ["rpm", "tpm", "max_concurrency", "tokens_per_day", "tokens_per_month"];
// Token buckets: {rate, burst} objects, edited as two inputs each (`<field>_rate`, `<field>_burst`).
export const BUCKET_FIELDS = ["request_bucket", "token_bucket"];

export const $ = (selector) => document.querySelector(selector);

// Builds elements without innerHTML, so tenant-chosen names can never inject markup.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    // through the CSSOM: the Content-Security-Policy refuses style attributes (no 'unsafe-inline')
    else if (name === "style") node.style.cssText = value;
    else if (value !== undefined && value !== null) node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  for (const child of children.flat()) node.append(child instanceof Node ? child : document.createTextNode(child));
  return node;
}

export function fillRows(table, rows) {
  table.querySelector("tbody").replaceChildren(...rows);
}

export function showError(where, error) {
  const box = $(where);
  box.textContent = error ? String(error.message ?? error) : "";
  box.hidden = !error;
}

export function formatQuota(quota) {
  const set = QUOTA_FIELDS.filter((f) => quota?.[f] !== undefined && quota?.[f] !== null);
  const parts = set.map((f) => `${f} ${quota[f]}`);
  for (const f of BUCKET_FIELDS) {
    if (quota?.[f]) parts.push(`${f} ${quota[f].rate}/s burst ${quota[f].burst}`);
  }
  return parts.length ? parts.join(" · ") : "unlimited";
}

export function formatNumber(value) {
  return Number(value ?? 0).toLocaleString("en-US");
}

// Spend in currency units, down to the micro-unit the ledger keeps.
export function formatMoney(value) {
  return Number(value ?? 0).toLocaleString("en-US", { maximumFractionDigits: 6 });
}
